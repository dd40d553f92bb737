package trustpublisher

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	k8stesting "k8s.io/client-go/testing"
	clocktesting "k8s.io/utils/clock/testing"
)

// watcherView records what a watcher (a node) could see and when, on the
// fake clock: every ClusterTrustBundle write and every status write is
// visible from the moment the call begins (the apiserver may commit it
// and send the watch event before it answers), and the call then takes
// delay before it returns.
type watcherView struct {
	clock *clocktesting.FakeClock
	delay time.Duration
	// bundles: per version, the roots' PEM blocks after each write, with
	// the moment it became visible.
	bundles map[string][]seen
	// phases: the first moment status showed a generation in a phase.
	phases map[string]time.Time
}

type seen struct {
	at      time.Time
	content string
}

func newWatcherView(h *harness, delay time.Duration) *watcherView {
	v := &watcherView{clock: h.clock, delay: delay, bundles: map[string][]seen{}, phases: map[string]time.Time{}}
	h.cs.PrependReactor("*", "clustertrustbundles", func(action k8stesting.Action) (bool, runtime.Object, error) {
		var name, content string
		switch a := action.(type) {
		case k8stesting.PatchAction:
			name = a.GetName()
			content = string(a.GetPatch()) // the applied object: its trustBundle is in it
		case k8stesting.DeleteAction:
			name = a.GetName()
		default:
			return false, nil, nil
		}
		version := name[strings.LastIndex(name, ":")+1:]
		v.bundles[version] = append(v.bundles[version], seen{at: v.clock.Now(), content: content})
		v.clock.Step(v.delay)
		return false, nil, nil
	})
	h.c.writer = &timedWriter{inner: h.w, view: v}
	return v
}

// holds reports whether content (a bundle write) carries root's PEM. The
// applied patch is JSON, so the PEM's newlines are escaped in it.
func holds(content, rootPEM string) bool {
	body := strings.TrimSpace(rootPEM)
	body = strings.TrimPrefix(body, "-----BEGIN CERTIFICATE-----")
	body = strings.TrimSuffix(body, "-----END CERTIFICATE-----")
	line := strings.Split(strings.TrimSpace(body), "\n")[0]
	return strings.Contains(content, line)
}

// entered is the first moment version's bundle held rootPEM.
func (v *watcherView) entered(version, rootPEM string) (time.Time, bool) {
	for _, s := range v.bundles[version] {
		if holds(s.content, rootPEM) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// left is the first moment version's bundle no longer held rootPEM after
// having held it.
func (v *watcherView) left(version, rootPEM string) (time.Time, bool) {
	in := false
	for _, s := range v.bundles[version] {
		switch h := holds(s.content, rootPEM); {
		case h:
			in = true
		case in:
			return s.at, true
		}
	}
	return time.Time{}, false
}

// timedWriter is the status writer as the watcher sees it.
type timedWriter struct {
	inner authorityWriter
	view  *watcherView
}

func (w *timedWriter) ApplyStatus(ctx context.Context, name string, status any, fm string) (*v1alpha1.Authority, error) {
	got, err := w.inner.ApplyStatus(ctx, name, status, fm)
	if err == nil {
		for _, g := range got.Status.Generations {
			key := g.Name + "/" + string(g.Phase)
			if _, ok := w.view.phases[key]; !ok && g.Phase != "" {
				w.view.phases[key] = w.view.clock.Now()
			}
		}
	}
	w.view.clock.Step(w.view.delay)
	return got, err
}

func (w *timedWriter) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, sub ...string) (*v1alpha1.Authority, error) {
	return w.inner.Patch(ctx, name, pt, data, opts, sub...)
}

// Every gate holds at least its configured time as a watcher sees the
// bundles and the status, wherever in a second the rotation starts and
// however long the writes take: a time truncated to the second, or taken
// before the write it counts from, opens the gate early. The controller
// syncs every 50ms here (as often as events could make it), so a gate
// that may open early does.
func TestGatesHoldTheirTimeAsAWatcherSeesThem(t *testing.T) {
	const soak, window = 3 * time.Second, 2 * time.Second
	for _, offset := range []time.Duration{time.Millisecond, 250 * time.Millisecond, 499 * time.Millisecond, 501 * time.Millisecond, 999 * time.Millisecond} {
		for _, delay := range []time.Duration{0, 30 * time.Millisecond, 400 * time.Millisecond} {
			t.Run(fmt.Sprintf("starting .%03d past the second, writes taking %s", offset.Milliseconds(), delay), func(t *testing.T) {
				a, old, next := bootstrapped(t)
				a.Spec.Gates.CanarySoak = &metav1.Duration{Duration: soak}
				a.Spec.Gates.PropagationWindow = &metav1.Duration{Duration: window}
				h := newHarness(t, a)
				h.settle()
				h.clock.Step(time.Minute)
				v := newWatcherView(h, delay)

				// The rotation, declared at once at a sub-second offset:
				// new to Active, old to Retired.
				h.clock.SetTime(h.clock.Now().Truncate(time.Second).Add(offset))
				cur := h.authority()
				addNew(cur, next, v1alpha1.PhaseActive)
				for i := range cur.Spec.Generations {
					if cur.Spec.Generations[i].Name == "old" {
						cur.Spec.Generations[i].Phase = v1alpha1.PhaseRetired
					}
				}
				cur.Generation++
				if err := h.w.store.Update(cur); err != nil {
					t.Fatal(err)
				}
				for i := 0; h.phase("old") != v1alpha1.PhaseRetired; i++ {
					if i > 2000 {
						t.Fatalf("the rotation did not finish: old=%s new=%s", h.phase("old"), h.phase("new"))
					}
					if err := h.sync(); err != nil {
						t.Fatal(err)
					}
					if h.phase("new") != "" {
						h.keyReady("new")
					}
					h.clock.Step(50 * time.Millisecond)
				}

				canaryIn := must(t, "the new root in canary")(v.entered(v1alpha1.BundleCanary, next.pem))
				liveIn := must(t, "the new root in live")(v.entered(v1alpha1.BundleLive, next.pem))
				activeAt, ok := v.phases["new/"+string(v1alpha1.PhaseActive)]
				active := must(t, "new Active")(activeAt, ok)
				canaryOut := must(t, "the old root leave canary")(v.left(v1alpha1.BundleCanary, old.pem))
				liveOut := must(t, "the old root leave live")(v.left(v1alpha1.BundleLive, old.pem))
				for _, c := range []struct {
					what     string
					from, to time.Time
					least    time.Duration
				}{
					{"the new root in canary before it reached live (canarySoak)", canaryIn, liveIn, soak},
					{"the new root in live before new became Active (propagationWindow)", liveIn, active, window},
					{"the old root out of canary before it left live (canarySoak)", canaryOut, liveOut, soak},
				} {
					if got := c.to.Sub(c.from); got < c.least {
						t.Errorf("%s: %s, want at least %s (from %s to %s)", c.what, got, c.least, c.from.Format(".000"), c.to.Format(".000"))
					}
				}
			})
		}
	}
}

// must returns a moment the watcher saw, failing the test if it did not.
func must(t *testing.T, what string) func(time.Time, bool) time.Time {
	return func(tm time.Time, ok bool) time.Time {
		t.Helper()
		if !ok {
			t.Fatalf("the watcher never saw %s", what)
		}
		return tm
	}
}
