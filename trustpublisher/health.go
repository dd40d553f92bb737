package trustpublisher

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// healthResult is one run of an Authority's canary health checks.
type healthResult struct {
	at        time.Time
	healthy   bool
	reason    string
	message   string
	readyPods *int32
}

// checkHealth runs spec.gates.canaryHealth when a generation soaks
// (observed Staged or Retiring), at most once per interval, and sets the
// CanaryHealthy condition on a (its lastTransitionTime is when the soak
// counts from). It returns the result and how soon to check again (0:
// nothing to check).
func (c *Controller) checkHealth(ctx context.Context, a *v1alpha1.Authority, now time.Time) (*healthResult, time.Duration) {
	h := a.Spec.Gates.CanaryHealth
	if h == nil {
		return nil, 0
	}
	soak := false
	for _, g := range a.Status.Generations {
		soak = soak || soaking(g.Phase)
	}
	// A generation about to be staged soaks from this sync on.
	for _, g := range a.Spec.Generations {
		soak = soak || (g.Phase != "" && soaking(g.Phase))
	}
	if !soak {
		return nil, 0
	}
	every := defaultInterval
	if h.Interval != nil && h.Interval.Duration > 0 {
		every = h.Interval.Duration
	}
	c.mu.Lock()
	r, ok := c.health[a.Name]
	c.mu.Unlock()
	if !ok || now.Sub(r.at) >= every {
		r = c.runHealth(ctx, a, h, every, now)
		c.mu.Lock()
		c.health[a.Name] = r
		c.mu.Unlock()
	}
	st := metav1.ConditionFalse
	if r.healthy {
		st = metav1.ConditionTrue
	}
	prev := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionCanaryHealthy)
	if prev != nil && prev.Status != st {
		klog.FromContext(ctx).Info("Canary health changed", "healthy", r.healthy, "reason", r.reason, "detail", r.message)
	}
	meta.SetStatusCondition(&a.Status.Conditions, metav1.Condition{
		Type: v1alpha1.ConditionCanaryHealthy, Status: st, Reason: r.reason, Message: r.message,
		ObservedGeneration: a.Generation, LastTransitionTime: metav1.NewTime(CeilSecond(now)),
	})
	return &r, every
}

func (c *Controller) runHealth(ctx context.Context, a *v1alpha1.Authority, h *v1alpha1.CanaryHealth, every time.Duration, now time.Time) healthResult {
	r := healthResult{at: now, healthy: true, reason: ReasonHealthy}
	var ok []string
	if h.URL != "" {
		if err := c.getURL(ctx, h.URL, every); err != nil {
			return healthResult{at: now, reason: ReasonURLFailed, message: err.Error()}
		}
		ok = append(ok, h.URL+" answered 2xx")
	}
	if h.Pods != nil {
		n, err := c.readyPods(ctx, h.Pods)
		if err != nil {
			return healthResult{at: now, reason: ReasonPodsUnreadable, message: err.Error()}
		}
		r.readyPods = &n
		base, has := int32(0), false
		for _, g := range a.Status.Generations {
			if soaking(g.Phase) && g.ReadyPodsAtSoakStart != nil && (!has || *g.ReadyPodsAtSoakStart > base) {
				base, has = *g.ReadyPodsAtSoakStart, true
			}
		}
		if has && n < base {
			r.healthy, r.reason = false, ReasonReadyPodsDropped
			r.message = fmt.Sprintf("%d ready pods in %s match the selector, fewer than the %d when the soak began", n, h.Pods.Namespace, base)
			return r
		}
		ok = append(ok, fmt.Sprintf("%d ready pods in %s", n, h.Pods.Namespace))
	}
	r.message = strings.Join(ok, "; ")
	return r
}

// getURL GETs url and wants a 2xx answer within the health timeout.
func (c *Controller) getURL(ctx context.Context, url string, every time.Duration) error {
	timeout := min(defaultHealthTimeout, every)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("building the canary health request to %s: %w", url, err)
	}
	resp, err := c.opts.HTTPClient.Do(req)
	if err != nil {
		return fmt.Errorf("canary health GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return fmt.Errorf("canary health GET %s answered %s", url, resp.Status)
	}
	return nil
}

// readyPods counts the pods the selector picks whose Ready condition is
// True and that are not being deleted.
func (c *Controller) readyPods(ctx context.Context, p *v1alpha1.PodHealth) (int32, error) {
	sel, err := metav1.LabelSelectorAsSelector(&p.Selector)
	if err != nil {
		return 0, fmt.Errorf("canaryHealth.pods.selector: %w", err)
	}
	list, err := c.opts.Client.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		return 0, fmt.Errorf("listing the canary pods in %s (%s): %w", p.Namespace, sel, err)
	}
	var n int32
	for _, pod := range list.Items {
		if pod.DeletionTimestamp != nil {
			continue
		}
		for _, cond := range pod.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				n++
			}
		}
	}
	return n, nil
}
