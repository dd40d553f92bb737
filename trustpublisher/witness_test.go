package trustpublisher

import (
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// witness plays the signer in the trust publisher's process.
type witness struct {
	mu       sync.Mutex
	checks   map[string]v1alpha1.KeyCheck
	reserved map[string]time.Time
}

func (w *witness) of(_, gen string) (v1alpha1.KeyCheck, time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	kc, ok := w.checks[gen]
	return kc, w.reserved[gen], ok
}

// With the signer beside it (Options.Witness), the trust publisher takes
// the key check from the signer, never from status: a keyCheck "ready"
// written into status by another identity does not open KeyNotReady. And a
// lastIssuedNotAfter lowered in status does not shorten LeavesValid below
// the reservation the signer knows.
func TestStatusKeyCheckAndReservationAreWitnessedByTheSigner(t *testing.T) {
	a, _, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhasePromoted)
	h := newHarness(t, a)
	w := &witness{checks: map[string]v1alpha1.KeyCheck{"old": *readyCheck(a, "old")}, reserved: map[string]time.Time{}}
	h.c.opts.Witness = w.of
	h.settle()
	h.keyReady("new") // forged: the signer never checked new's key
	for range 10 {
		h.clock.Step(2 * time.Minute)
		h.settle()
	}
	if p := h.phase("new"); p != v1alpha1.PhasePromoted {
		t.Fatalf("new = %s, want Promoted before the activation", p)
	}
	h.setSpecPhase("old", v1alpha1.PhasePromoted) // keyward trust activate new
	h.setSpecPhase("new", v1alpha1.PhaseActive)
	for range 10 {
		h.clock.Step(2 * time.Minute)
		h.settle()
	}
	if p := h.phase("new"); p != v1alpha1.PhasePromoted {
		t.Fatalf("new = %s with a forged status keyCheck, want held Promoted", p)
	}
	if g := h.authority().Status.Generations; g[len(g)-1].Gate != v1alpha1.GateKeyNotReady {
		t.Fatalf("new is held by %q, want %s", g[len(g)-1].Gate, v1alpha1.GateKeyNotReady)
	}
	w.mu.Lock()
	w.checks["new"] = *readyCheck(a, "new")
	w.mu.Unlock()
	h.clock.Step(time.Second)
	h.settle()
	if p := h.phase("new"); p != v1alpha1.PhaseActive {
		t.Fatalf("new = %s once the signer checked its key, want Active", p)
	}

	if p := h.phase("old"); p != v1alpha1.PhasePromoted {
		t.Fatalf("old = %s after new's activation, want Promoted", p)
	}
	// Spec retires old. The signer reserved old until
	// an hour from now; status is made to say it expired already.
	until := h.clock.Now().Add(time.Hour)
	w.mu.Lock()
	w.reserved["old"] = until
	w.mu.Unlock()
	forged := h.authority()
	for i := range forged.Spec.Generations {
		if forged.Spec.Generations[i].Name == "old" {
			forged.Spec.Generations[i].Phase = v1alpha1.PhaseRetired
		}
	}
	forged.Generation++
	for i := range forged.Status.Generations {
		if forged.Status.Generations[i].Name == "old" {
			past := metav1.NewTime(h.clock.Now().Add(-time.Hour))
			forged.Status.Generations[i].LastIssuedNotAfter = &past
		}
	}
	if err := h.w.store.Update(forged); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		h.clock.Step(2 * time.Minute)
		h.settle()
	}
	if p := h.phase("old"); p == v1alpha1.PhaseRetiring || p == v1alpha1.PhaseRetired {
		t.Fatalf("old = %s 20 minutes into an hour of leaves the signer reserved, want held by %s", p, v1alpha1.GateLeavesValid)
	}
	h.clock.Step(time.Hour)
	for range 10 {
		h.clock.Step(2 * time.Minute)
		h.settle()
	}
	if p := h.phase("old"); p != v1alpha1.PhaseRetired {
		t.Fatalf("old = %s after the reservation passed, want Retired; status %+v; progressing %+v", p, h.authority().Status.Generations, h.condition(v1alpha1.ConditionProgressing))
	}
}
