package trustpublisher

import (
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// `keyward trust activate --force` writes an override for both the new
// generation (Active) and the current one (Promoted). When a gate no
// override skips holds the new one (its certificate starts later, its key
// is not ready), the current generation must stay Active: leaving Active
// without a successor is for the emergency path (the old root pulled),
// not for a hurried activation, or the signer issues nothing meanwhile.
func TestForcedActivationHeldKeepsTheActiveGeneration(t *testing.T) {
	old := rootCA(t, "old root")
	const soak, window = time.Hour, 5 * time.Minute
	cases := []struct {
		name string
		f    *fixture
	}{{
		name: "the new certificate starts in an hour",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", newCA(t, "future", nil, t0.Add(time.Hour), t0.Add(48*time.Hour)), v1alpha1.PhaseActive, v1alpha1.PhasePromoted, t0.Add(-time.Minute)).keyReady("b").
			published(t0.Add(-time.Minute)).
			override("hurry", map[string]v1alpha1.Phase{"a": v1alpha1.PhasePromoted, "b": v1alpha1.PhaseActive}),
	}, {
		name: "the new key is not ready",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", rootCA(t, "new root"), v1alpha1.PhaseActive, v1alpha1.PhasePromoted, t0.Add(-time.Minute)).
			published(t0.Add(-time.Minute)).
			override("hurry", map[string]v1alpha1.Phase{"a": v1alpha1.PhasePromoted, "b": v1alpha1.PhaseActive}),
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Evaluate(tc.f.a, t0)
			b, _ := plan.Step("b")
			if b.Next == v1alpha1.PhaseActive {
				t.Fatalf("b moves to Active (%+v); the case is meant to hold it", b)
			}
			a, _ := plan.Step("a")
			if a.Next != v1alpha1.PhaseActive {
				t.Fatalf("a: next %q forced %v while b is held by %s: no generation would be Active, the signer issues nothing", a.Next, a.Forced, b.Gate)
			}
		})
	}
}

// A generation status shows Staged without `since` (written by hand, or
// by another tool) soaks from when the controller first sees it: the gate
// must open at a fixed time. Counting from "now" on every sync never ends
// the soak and changes gateOpensAt on every sync — a status write per
// second, each one waking the controller again.
func TestSoakWithoutSinceCountsFromFirstSight(t *testing.T) {
	old, next := rootCA(t, "old root"), rootCA(t, "new root")
	const soak, window = time.Hour, 5 * time.Minute
	f := newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
		gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0).published(t0.Add(-48 * time.Hour))
	f.status("b").Since = nil
	a := f.a
	var first *time.Time
	for i := range 3 {
		now := t0.Add(time.Duration(i) * 10 * time.Second)
		plan := Evaluate(a, now)
		s, _ := plan.Step("b")
		if s.Gate != v1alpha1.GateCanarySoak || s.OpensAt == nil {
			t.Fatalf("sync %d: b held by %q (%s), want CanarySoak", i, s.Gate, s.Message)
		}
		if first == nil {
			first = s.OpensAt
		} else if !s.OpensAt.Equal(*first) {
			t.Fatalf("sync %d: the soak opens at %s, at the first sync it opened at %s: it moves with the clock", i, s.OpensAt, first)
		}
		a = plan.Apply(a, now)
		Confirm(a, now) // the sync confirms its (here: no) bundle writes
	}
}

// An edit that breaks the certificatePEM or chainPEM of a generation
// already in the bundles (a typo, an issuer that is not a CA) must not
// republish the bundles without its root: every leaf it signed would stop
// verifying. The bundles stay as published and the status says why.
func TestBrokenCertificateOfAPublishedGenerationKeepsItsRoot(t *testing.T) {
	a, old, _ := bootstrapped(t)
	h := newHarness(t, a)
	h.settle()
	if h.bundle("live") != old.pem {
		t.Fatalf("live bundle %q, want the old root", h.bundle("live"))
	}
	broken := h.authority()
	broken.Spec.Generations[0].ChainPEM = "-----BEGIN CERTIFICATE-----\nTUlJQg==\n-----END CERTIFICATE-----\n"
	broken.Generation++
	if err := h.w.store.Update(broken); err != nil {
		t.Fatal(err)
	}
	_ = h.sync()
	if h.bundle("live") != old.pem || h.bundle("canary") != old.pem {
		t.Fatalf("after the Active generation's chainPEM broke: canary=%q live=%q, want the old root kept in both", h.bundle("canary"), h.bundle("live"))
	}
	c := meta.FindStatusCondition(h.authority().Status.Conditions, v1alpha1.ConditionBundlesPublished)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.GateInvalidCertificate {
		t.Fatalf("BundlesPublished = %+v, want False with reason %s", c, v1alpha1.GateInvalidCertificate)
	}
}
