package trustpublisher

import (
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A propagationWindow shorter than a running pod takes to see a bundle
// change at the kubelet sync frequency (1.5×f + 30s: 2m at kubelet's
// default 1m) is reported: condition PropagationWindowSafe=False naming
// both durations, and one Warning Event per window value, not one per
// sync. A window that covers it turns the condition True. It holds no
// gate: the rotation still moves on the configured window.
func TestShortPropagationWindowIsReported(t *testing.T) {
	if got := MinPropagationWindow(time.Minute); got != 2*time.Minute {
		t.Fatalf("MinPropagationWindow(1m) = %s, want 2m", got)
	}
	if got := MinPropagationWindow(10 * time.Second); got != 45*time.Second {
		t.Fatalf("MinPropagationWindow(10s) = %s, want 45s", got)
	}
	a, _, _ := bootstrapped(t) // window 30s
	h := newHarness(t, a)
	h.settle()
	c := h.condition(v1alpha1.ConditionPropagationWindowSafe)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonShorterThanKubeletSync ||
		!strings.Contains(c.Message, "propagationWindow 30s is shorter than 2m0s") || !strings.Contains(c.Message, "syncFrequency 1m0s") {
		t.Fatalf("condition %s = %+v; want False/%s naming 30s, 2m0s and 1m0s", v1alpha1.ConditionPropagationWindowSafe, c, ReasonShorterThanKubeletSync)
	}
	if e := h.event(EventPropagationWindowShort); !strings.Contains(e, corev1.EventTypeWarning) {
		t.Fatalf("no Warning %s Event", EventPropagationWindowShort)
	}
	h.clock.Step(time.Minute)
	h.settle()
	if e := h.event(EventPropagationWindowShort); e != "" {
		t.Fatalf("a second %s Event for the same window: %q", EventPropagationWindowShort, e)
	}

	// Exactly the floor covers it.
	h.setGates(time.Hour, 2*time.Minute)
	h.settle()
	if c := h.condition(v1alpha1.ConditionPropagationWindowSafe); c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonCoversKubeletSync {
		t.Fatalf("with a 2m window: condition %+v, want True/%s", c, ReasonCoversKubeletSync)
	}
	if e := h.event(EventPropagationWindowShort); e != "" {
		t.Fatalf("an Event for a window that covers kubelet's sync: %q", e)
	}

	// A cluster whose kubelets sync every 10s: 45s covers it.
	a, _, _ = bootstrapped(t)
	a.Spec.Gates.PropagationWindow = &metav1.Duration{Duration: 45 * time.Second}
	h = newHarness(t, a)
	h.c.opts.KubeletSyncFrequency = 10 * time.Second
	h.settle()
	if c := h.condition(v1alpha1.ConditionPropagationWindowSafe); c == nil || c.Status != metav1.ConditionTrue {
		t.Fatalf("45s window, kubelet syncFrequency 10s: condition %+v, want True", c)
	}
}
