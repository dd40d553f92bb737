package trustpublisher

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
)

// reportOverride runs after the status carrying plan is applied. For each
// generation the override annotation forced it records a Warning Event
// (GateOverridden) and an audit log line; an entry spec no longer asks for
// is stale (OverrideStale). When no entry still waits (held by a gate no
// override skips), the annotation is removed.
func (c *Controller) reportOverride(ctx context.Context, a *v1alpha1.Authority, plan Plan, parsed parsedGenerations, now time.Time) {
	raw, present := a.Annotations[v1alpha1.OverrideAnnotation]
	if !present {
		return
	}
	logger := klog.FromContext(ctx)
	if plan.OverrideErr != nil || plan.Override == nil {
		c.event(a, corev1.EventTypeWarning, EventOverrideInvalid, "override annotation ignored and removed: %v", plan.OverrideErr)
		logger.Info("Override annotation ignored and removed", "audit", true, "err", plan.OverrideErr)
		c.removeOverride(ctx, a, raw)
		return
	}
	o := plan.Override
	// What the gates would have said without the override.
	plain := a.DeepCopy()
	delete(plain.Annotations, v1alpha1.OverrideAnnotation)
	unforced := evaluate(plain, now, parsed)

	waiting := false
	var stale []string
	gens := make([]string, 0, len(o.Generations))
	for g := range o.Generations {
		gens = append(gens, g)
	}
	slices.Sort(gens)
	for _, gen := range gens {
		phase := o.Generations[gen]
		step, ok := plan.Step(gen)
		switch {
		case ok && step.Forced && step.Moves():
			skipped := skippedGates(unforced, gen)
			c.event(a, corev1.EventTypeWarning, EventGateOverridden,
				"generation %s moved %s→%s skipping gates [%s]: %s (requested by %s)",
				gen, phaseOrNew(step.Observed), step.Next, strings.Join(skipped, ", "), o.Reason, requester(o))
			logger.Info("Gate overridden", "audit", true, "signerName", a.Spec.SignerName, "generation", gen,
				"from", phaseOrNew(step.Observed), "to", step.Next, "gatesSkipped", skipped, "reason", o.Reason, "requestedBy", requester(o))
		case ok && step.Observed == phase:
			// Arrived (by this override or otherwise): the entry is done.
		case !ok:
			stale = append(stale, fmt.Sprintf("%s→%s: no such generation in spec", gen, phase))
		case step.Desired != phase:
			stale = append(stale, fmt.Sprintf("%s→%s: spec asks for %s now", gen, phase, step.Desired))
		default:
			// Still held by a gate no override skips (InvalidCertificate,
			// KeyNotReady): keep the annotation until it moves or is stale.
			waiting = true
		}
	}
	if waiting {
		return
	}
	if len(stale) > 0 {
		c.event(a, corev1.EventTypeWarning, EventOverrideStale, "override dropped (%s): %s", o.Reason, strings.Join(stale, "; "))
		logger.Info("Override dropped", "audit", true, "stale", stale, "reason", o.Reason, "requestedBy", requester(o))
	}
	c.removeOverride(ctx, a, raw)
}

func skippedGates(p Plan, gen string) []string {
	s, ok := p.Step(gen)
	if !ok || s.Gate == "" {
		return []string{}
	}
	return []string{s.Gate}
}

func requester(o *v1alpha1.Override) string {
	if o.RequestedBy == "" {
		return "unnamed"
	}
	return o.RequestedBy
}

// removeOverride deletes the annotation if it still holds raw (a JSON
// patch test), so a newer override written meanwhile survives.
func (c *Controller) removeOverride(ctx context.Context, a *v1alpha1.Authority, raw string) {
	path := "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(v1alpha1.OverrideAnnotation, "~", "~0"), "/", "~1")
	patch, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": path, "value": raw},
		{"op": "remove", "path": path},
	})
	got, err := c.writer.Patch(ctx, a.Name, types.JSONPatchType, patch, metav1.PatchOptions{FieldManager: v1alpha1.FieldManagerTrustPublisher})
	switch {
	case err == nil:
		c.wrote(a, got)
	case apierrors.IsNotFound(err), apierrors.IsInvalid(err):
		// Gone, or the annotation changed meanwhile (the test op failed):
		// the next sync looks at what is there now.
		klog.FromContext(ctx).V(2).Info("Override annotation not removed: it changed or is gone", "err", err)
	default:
		klog.FromContext(ctx).Info("Removing the override annotation failed; the next sync retries", "err", err)
	}
}

func (c *Controller) event(a *v1alpha1.Authority, typ, reason, format string, args ...any) {
	if c.opts.Recorder == nil {
		return
	}
	ref := a.DeepCopy()
	ref.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Authority"}
	c.opts.Recorder.Event(ref, typ, reason, fmt.Sprintf(format, args...))
}
