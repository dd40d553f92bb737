package trustpublisher

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// ConditionPhasesTrusted is False (reason ReasonPhaseNotOurs) once a status
// phase the trust publisher did not move has been found; it stays so until
// the spec changes (someone looked), and is True (ReasonRecorded) otherwise.
const ConditionPhasesTrusted = "PhasesTrusted"

// Reasons of ConditionPhasesTrusted and the Warning Events of a finding.
const (
	ReasonRecorded           = "Recorded"
	ReasonPhaseNotOurs       = "PhaseNotOurs"
	ReasonCertificateChanged = "CertificateChanged"
)

// pendingOf is what this controller last applied as an Authority's phases
// (nil before its first write this term).
func (c *Controller) pendingOf(name string) map[string]record.Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pending[name]
}

func (c *Controller) setPending(name string, r *record.Record) {
	m := map[string]record.Entry{}
	for _, e := range r.Generations {
		m[e.Name] = e
	}
	c.mu.Lock()
	c.pending[name] = m
	c.mu.Unlock()
}

// trustedCopy is a copy of a whose status phases and since are the ones
// the trust publisher stands by (record.Trusted); a generation it has no
// word on has none. The signer's fields are kept.
func trustedCopy(a *v1alpha1.Authority, r *record.Record, pending map[string]record.Entry) *v1alpha1.Authority {
	out := a.DeepCopy()
	trusted := record.Trusted(a, r, pending)
	for n, e := range record.Changed(a, r, pending) {
		trusted[n] = e
	}
	for i := range out.Status.Generations {
		g := &out.Status.Generations[i]
		t, ok := trusted[g.Name]
		if ok && t.Phase == g.Phase && t.Since.Equal(g.Since) {
			continue
		}
		g.Phase, g.Since, g.ReadyPodsAtSoakStart = t.Phase, t.Since.DeepCopy(), nil
	}
	return out
}

// holdChanged marks, in parsed, every generation whose phase was reached
// with another certificate as unusable: it moves to no bundle phase, and
// the bundles stay as published (unparsableMember) until the certificate
// is put back or the generation retired. A new root is a new generation.
func holdChanged(a *v1alpha1.Authority, r *record.Record, pending map[string]record.Entry, parsed parsedGenerations) {
	for n, e := range record.Changed(a, r, pending) {
		parsed[n] = parsedGeneration{err: fmt.Errorf("its certificatePEM or chainPEM changed after it reached %s: a new root must be a new generation (put the certificate back, or retire it and add one)", e.Phase)}
	}
}

// recordOf is the record of next's phases; its revision grows when it
// differs from prev.
// A generation in changed keeps the digest its phase was reached with.
func recordOf(next *v1alpha1.Authority, prev *record.Record, changed map[string]record.Entry) *record.Record {
	r := &record.Record{Authority: next.Name, UID: next.UID, Revision: prev.Revision}
	spec := map[string]v1alpha1.Generation{}
	for _, g := range next.Spec.Generations {
		spec[g.Name] = g
	}
	for _, s := range next.Status.Generations {
		g, ok := spec[s.Name]
		if !ok || s.Phase == "" {
			continue
		}
		digest := record.CertificateDigest(g)
		if e, ok := changed[s.Name]; ok {
			digest = e.CertificateDigest
		}
		r.Generations = append(r.Generations, record.Entry{Name: s.Name, Phase: s.Phase, Since: sec(s.Since), CertificateDigest: digest})
	}
	if !r.Same(prev) {
		r.Revision++
	}
	return r
}

// reportFindings records each new finding once: a Warning Event, a line
// at default verbosity and the counter.
func (c *Controller) reportFindings(ctx context.Context, a *v1alpha1.Authority, findings []record.Finding) {
	c.mu.Lock()
	seen := c.reported[a.Name]
	now := map[string]string{}
	for _, f := range findings {
		now[f.Generation] = f.String()
	}
	c.reported[a.Name] = now
	c.mu.Unlock()
	for _, f := range findings {
		msg := f.String()
		if seen[f.Generation] == msg {
			continue
		}
		reason := ReasonPhaseNotOurs
		if f.CertificateChanged {
			reason = ReasonCertificateChanged
		}
		c.event(a, corev1.EventTypeWarning, reason, "%s", msg)
		klog.FromContext(ctx).Info("Status phase not acted on: the trust publisher did not move it", "signerName", a.Spec.SignerName,
			"generation", f.Generation, "phase", f.Phase, "recorded", f.Recorded, "writer", f.Writer, "reason", reason)
		c.metrics.foreignPhase(a.Spec.SignerName, f.Generation, reason)
	}
}

// setProvenance sets ConditionPhasesTrusted on s.
func setProvenance(s *ownStatus, a *v1alpha1.Authority, findings []record.Finding, now time.Time) {
	var msgs []string
	for _, f := range findings {
		if !f.CertificateChanged {
			msgs = append(msgs, f.String())
		}
	}
	cond := metav1.Condition{Type: ConditionPhasesTrusted, ObservedGeneration: a.Generation, LastTransitionTime: metav1.NewTime(now.Truncate(time.Second))}
	prev := meta.FindStatusCondition(a.Status.Conditions, ConditionPhasesTrusted)
	switch {
	case len(msgs) > 0:
		cond.Status, cond.Reason = metav1.ConditionFalse, ReasonPhaseNotOurs
		cond.Message = strings.Join(msgs, "; ") + ". The trust publisher restored its own phases; the condition clears at the next spec change"
		if len(cond.Message) > 32000 {
			cond.Message = cond.Message[:32000]
		}
	case prev != nil && prev.Status == metav1.ConditionFalse && prev.Reason == ReasonPhaseNotOurs && prev.ObservedGeneration == a.Generation:
		cond = *prev.DeepCopy()
	default:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, ReasonRecorded, "every status phase is one the trust publisher moved (its record on the ClusterTrustBundles)"
	}
	cond.LastTransitionTime = *sec(&cond.LastTransitionTime)
	meta.SetStatusCondition(&s.Conditions, cond)
}

// witnessed replaces, in work, each generation's keyCheck by the signer's
// own (Options.Witness) and raises lastIssuedNotAfter to the signer's own
// reservation: the signer's fields in status are believed no further than
// the signer in this process confirms them. Without a Witness (a trust
// publisher run apart from its signer) status is all there is.
func (c *Controller) witnessed(work *v1alpha1.Authority) {
	if c.opts.Witness == nil {
		return
	}
	for i := range work.Status.Generations {
		g := &work.Status.Generations[i]
		kc, reserved, ok := c.opts.Witness(work.Spec.SignerName, g.Name)
		if ok {
			g.KeyCheck = kc.DeepCopy()
		} else {
			g.KeyCheck = nil
		}
		if !reserved.IsZero() && (g.LastIssuedNotAfter == nil || reserved.After(g.LastIssuedNotAfter.Time)) {
			t := metav1.NewTime(reserved)
			g.LastIssuedNotAfter = &t
		}
	}
}
