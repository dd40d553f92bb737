package trustpublisher

import (
	"context"
	"fmt"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// DefaultKubeletSyncFrequency is kubelet's default syncFrequency, the
// default of Options.KubeletSyncFrequency.
const DefaultKubeletSyncFrequency = time.Minute

// MinPropagationWindow is the shortest propagationWindow that covers a
// running pod at kubelet syncFrequency f: kubelet copies a changed
// ClusterTrustBundle into a running pod's projected volume only at that
// pod's next sync, which comes up to f plus jitter after the change, then
// writes the volume. Measured on a real kubelet v1.37.1 with containerd:
// 69–89 s at 1m, 10 s at 10s. 1.5×f + 30s is 2m at the default 1m.
func MinPropagationWindow(f time.Duration) time.Duration {
	return f*3/2 + 30*time.Second
}

// windowShort says whether a's propagationWindow is shorter than
// MinPropagationWindow of the configured kubelet sync frequency, and why
// (the message of ConditionPropagationWindowSafe either way).
func (c *Controller) windowShort(a *v1alpha1.Authority) (string, bool) {
	_, window := GateDurations(a)
	floor := MinPropagationWindow(c.opts.KubeletSyncFrequency)
	if window < floor {
		return fmt.Sprintf("propagationWindow %s is shorter than %s, what a running pod may take to see a bundle change at kubelet syncFrequency %s (trustPublisher.kubeletSyncFrequency): "+
			"a new root can be activated, and a workload's new leaf presented, before running pods' projected bundles trust it. "+
			"Compressed gates are for demos and tests; in production keep the default 5m (docs/rotation.md)", window, floor, c.opts.KubeletSyncFrequency), true
	}
	return fmt.Sprintf("propagationWindow %s covers a running pod's bundle update at kubelet syncFrequency %s (at most %s)", window, c.opts.KubeletSyncFrequency, floor), false
}

// warnWindow records a Warning Event and a line at default verbosity once
// per propagationWindow value that windowShort finds too short.
func (c *Controller) warnWindow(ctx context.Context, a *v1alpha1.Authority) {
	msg, short := c.windowShort(a)
	_, window := GateDurations(a)
	c.mu.Lock()
	prev, seen := c.windowWarned[a.Name]
	if short {
		c.windowWarned[a.Name] = window
	} else {
		delete(c.windowWarned, a.Name)
	}
	c.mu.Unlock()
	if !short || (seen && prev == window) {
		return
	}
	c.event(a, corev1.EventTypeWarning, EventPropagationWindowShort, "%s", msg)
	klog.FromContext(ctx).Info("Propagation window shorter than kubelet takes to update a running pod's trust bundle", "signerName", a.Spec.SignerName,
		"authority", a.Name, "propagationWindow", window, "kubeletSyncFrequency", c.opts.KubeletSyncFrequency, "minimum", MinPropagationWindow(c.opts.KubeletSyncFrequency))
}
