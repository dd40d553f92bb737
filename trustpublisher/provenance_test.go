package trustpublisher

import (
	"strings"
	"testing"
	"time"

	phaserecord "github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A phase written into status by anyone but the trust publisher (here: a
// rogue generation written Promoted) is not acted on: its root reaches no
// bundle, the Authority says so in a condition and a Warning Event, and
// the honest generation's bundles stay as they were.
func TestPhaseNotWrittenByThePublisherIsNotActedOn(t *testing.T) {
	for _, cold := range []bool{false, true} {
		name := "same controller"
		if cold {
			name = "a new leader (nothing in memory, only the record on the bundles)"
		}
		t.Run(name, func(t *testing.T) {
			a, old, rogue := bootstrapped(t)
			h := newHarness(t, a)
			h.settle()
			if h.bundle("live") != old.pem {
				t.Fatalf("live %q, want the old root", h.bundle("live"))
			}
			if cold {
				h.c.pending = map[string]map[string]phaserecord.Entry{}
			}
			cur := h.authority()
			cur.Spec.Generations = append(cur.Spec.Generations, v1alpha1.Generation{Name: "rogue", KeyURI: "file:/rogue", CertificatePEM: rogue.pem, Phase: v1alpha1.PhaseRetired})
			cur.Generation++
			since := metav1.NewTime(t0.Add(-24 * time.Hour))
			cur.Status.Generations = append(cur.Status.Generations, v1alpha1.GenerationStatus{Name: "rogue", Phase: v1alpha1.PhasePromoted, Since: &since})
			if err := h.w.store.Update(cur); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				h.clock.Step(time.Hour)
				_ = h.sync()
			}
			if strings.Contains(h.bundle("live"), rogue.pem) || strings.Contains(h.bundle("canary"), rogue.pem) {
				t.Fatalf("the rogue root reached a bundle: live=%q canary=%q", h.bundle("live"), h.bundle("canary"))
			}
			if h.bundle("live") != old.pem || h.bundle("canary") != old.pem {
				t.Fatalf("the honest root left a bundle: live=%q canary=%q", h.bundle("live"), h.bundle("canary"))
			}
			c := meta.FindStatusCondition(h.authority().Status.Conditions, ConditionPhasesTrusted)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonPhaseNotOurs || !strings.Contains(c.Message, "generation rogue") {
				t.Fatalf("%s = %+v, want False %s naming generation rogue", ConditionPhasesTrusted, c, ReasonPhaseNotOurs)
			}
			if h.phase("rogue") == v1alpha1.PhasePromoted {
				t.Fatalf("status still shows rogue Promoted: the trust publisher did not restore its own phase")
			}
			if e := h.event(ReasonPhaseNotOurs); !strings.Contains(e, "Warning") {
				t.Fatalf("no Warning Event %s (got %q)", ReasonPhaseNotOurs, e)
			}
		})
	}
}

// A generation whose root soaked in the canary bundle gets another
// certificate in place: the new root inherits nothing. The bundles stay as
// published, the generation is held, and a Warning Event says why.
func TestSwappedRootInheritsNoSoak(t *testing.T) {
	a, old, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhaseStaged)
	h := newHarness(t, a)
	h.settle()
	if !strings.Contains(h.bundle("canary"), next.pem) {
		t.Fatalf("canary %q, want the new root staged", h.bundle("canary"))
	}
	h.clock.Step(2 * time.Hour) // the soak is long over
	swap := rootCA(t, "swapped root")
	cur := h.authority()
	cur.Spec.Generations[1].CertificatePEM = swap.pem
	cur.Spec.Generations[1].Phase = v1alpha1.PhasePromoted
	cur.Generation++
	if err := h.w.store.Update(cur); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		h.clock.Step(time.Hour)
		_ = h.sync()
	}
	if strings.Contains(h.bundle("live"), swap.pem) || strings.Contains(h.bundle("canary"), swap.pem) {
		t.Fatalf("the swapped root reached a bundle: live=%q canary=%q", h.bundle("live"), h.bundle("canary"))
	}
	if h.bundle("live") != old.pem {
		t.Fatalf("live %q, want the old root only", h.bundle("live"))
	}
	if p := h.phase("new"); p == v1alpha1.PhasePromoted {
		t.Fatalf("the swapped generation moved to %s", p)
	}
	if e := h.event(ReasonCertificateChanged); !strings.Contains(e, "Warning") {
		t.Fatalf("no Warning Event %s (got %q)", ReasonCertificateChanged, e)
	}
}

// A keyCheck the signer wrote for another keyURI or certificate (before a
// swap) does not open KeyNotReady for the generation as it is now.
func TestKeyCheckCountsOnlyForWhatItChecked(t *testing.T) {
	old, next := rootCA(t, "old root"), rootCA(t, "new root")
	for _, tc := range []struct {
		name  string
		edit  func(kc *v1alpha1.KeyCheck)
		ready bool
	}{
		{"the check names the current key and certificate", func(*v1alpha1.KeyCheck) {}, true},
		{"the check names another key URI", func(kc *v1alpha1.KeyCheck) { kc.KeyURI = "file:/elsewhere" }, false},
		{"the check names another certificate", func(kc *v1alpha1.KeyCheck) { kc.CertificateDigest = "00" }, false},
		{"the check names nothing (an older signer)", func(kc *v1alpha1.KeyCheck) { kc.KeyURI, kc.CertificateDigest = "", "" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(time.Hour, 5*time.Minute).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
				gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhasePromoted, t0.Add(-time.Hour)).keyReady("b").published(t0.Add(-time.Hour))
			tc.edit(f.status("b").KeyCheck)
			s, _ := Evaluate(f.a, t0).Step("b")
			if got := s.Next == v1alpha1.PhaseActive; got != tc.ready {
				t.Fatalf("b moves to Active: %v (gate %s: %s), want %v", got, s.Gate, s.Message, tc.ready)
			}
			if !tc.ready && s.Gate != v1alpha1.GateKeyNotReady {
				t.Fatalf("b held by %s, want %s", s.Gate, v1alpha1.GateKeyNotReady)
			}
		})
	}
}
