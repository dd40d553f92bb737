package trustpublisher

import (
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// setGates edits spec.gates as a user who may update the spec would.
func (h *harness) setGates(soak, window time.Duration) {
	a := h.authority()
	a.Spec.Gates.CanarySoak = &metav1.Duration{Duration: soak}
	a.Spec.Gates.PropagationWindow = &metav1.Duration{Duration: window}
	a.Generation++
	if err := h.w.store.Update(a); err != nil {
		h.t.Fatal(err)
	}
}

// Lowering spec.gates to the 1s minimum does not open a gate already
// closed: the canary soak and propagation window in force when the soak
// or the bundle change began still count (only an override, recorded in
// an Event, cuts them short). The new values count from the next one.
func TestShortenedGatesDoNotShortenAGateUnderWay(t *testing.T) {
	t.Run("canary soak", func(t *testing.T) {
		a, _, next := bootstrapped(t) // soak 1m, window 30s
		addNew(a, next, v1alpha1.PhasePromoted)
		h := newHarness(t, a)
		h.settle()
		h.clock.Step(40 * time.Second) // past the window, 20s short of the soak
		h.setGates(time.Second, time.Second)
		h.settle()
		g := h.authority().Status.Generations[1]
		if g.Phase != v1alpha1.PhaseStaged || g.Gate != v1alpha1.GateCanarySoak {
			t.Fatalf("after lowering canarySoak to 1s mid-soak: new %s held by %q; want Staged, held by CanarySoak", g.Phase, g.Gate)
		}
		if c := h.condition(v1alpha1.ConditionProgressing); c == nil || !strings.Contains(c.Message, "of 1m0s") {
			t.Errorf("Progressing %+v: want the soak in force named (1m0s)", c)
		}
		h.clock.SetTime(g.GateOpensAt.Time)
		h.settle()
		if h.phase("new") != v1alpha1.PhasePromoted {
			t.Fatalf("at the end of the recorded soak: new %s, want Promoted", h.phase("new"))
		}
	})
	t.Run("propagation window", func(t *testing.T) {
		a, _, next := bootstrapped(t)
		addNew(a, next, v1alpha1.PhasePromoted)
		h := newHarness(t, a)
		h.settle()
		h.clock.Step(2 * time.Minute)
		h.settle() // Promoted: the live bundle changed now, window 30s
		if h.phase("new") != v1alpha1.PhasePromoted {
			t.Fatalf("new %s, want Promoted", h.phase("new"))
		}
		h.setSpecPhase("new", v1alpha1.PhaseActive)
		h.setSpecPhase("old", v1alpha1.PhasePromoted)
		h.keyReady("new")
		h.clock.Step(5 * time.Second)
		h.setGates(time.Minute, time.Second)
		h.settle()
		g := h.authority().Status.Generations[1]
		if g.Phase != v1alpha1.PhasePromoted || g.Gate != v1alpha1.GatePropagationWindow {
			t.Fatalf("after lowering propagationWindow to 1s 5s into a 30s window: new %s held by %q; want Promoted, held by PropagationWindow", g.Phase, g.Gate)
		}
		h.clock.SetTime(g.GateOpensAt.Time)
		h.settle()
		if h.phase("new") != v1alpha1.PhaseActive {
			t.Fatalf("at the end of the recorded window: new %s, want Active", h.phase("new"))
		}
	})
}

// A bundle's first content replaces nothing a node trusted: it records no
// window, so gates compressed right after the bootstrap (as the
// end-to-end tests and a new Authority's owner do) count at once.
func TestFirstPublicationRecordsNoWindow(t *testing.T) {
	a, _, next := bootstrapped(t)
	a.Spec.Gates.PropagationWindow = &metav1.Duration{Duration: 5 * time.Minute}
	a.Status.Generations[0].KeyCheck = nil // a sync with both bundles empty first
	h := newHarness(t, a)
	h.settle()
	h.keyReady("old")
	h.settle()
	for _, b := range h.authority().Status.Bundles {
		if b.PropagationWindow != nil {
			t.Fatalf("bundle %s recorded window %s at its first publication", b.Version, b.PropagationWindow.Duration)
		}
	}
	h.setGates(time.Second, time.Second)
	cur := h.authority()
	addNew(cur, next, v1alpha1.PhasePromoted)
	cur.Generation++
	if err := h.w.store.Update(cur); err != nil {
		t.Fatal(err)
	}
	h.settle()
	h.clock.Step(3 * time.Second)
	h.settle()
	if h.phase("new") != v1alpha1.PhasePromoted {
		t.Fatalf("new %s (%s), want Promoted after the 1s gates", h.phase("new"), h.condition(v1alpha1.ConditionProgressing).Message)
	}
}
