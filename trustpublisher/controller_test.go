package trustpublisher

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
)

// fakeWriter applies status the way the apiserver's server-side apply
// would for the trust publisher's own fields, into the informer's store.
type fakeWriter struct {
	store   cache.Indexer
	applies int
	patches []string
}

func (w *fakeWriter) get(name string) *v1alpha1.Authority {
	obj, _, _ := w.store.GetByKey(name)
	return obj.(*v1alpha1.Authority).DeepCopy()
}

func (w *fakeWriter) ApplyStatus(_ context.Context, name string, status any, _ string) (*v1alpha1.Authority, error) {
	w.applies++
	a := w.get(name)
	raw, err := json.Marshal(status)
	if err != nil {
		return nil, err
	}
	var got v1alpha1.AuthorityStatus
	if err := json.Unmarshal(raw, &got); err != nil {
		return nil, err
	}
	old := map[string]v1alpha1.GenerationStatus{}
	for _, g := range a.Status.Generations {
		old[g.Name] = g
	}
	applied := map[string]bool{}
	for i, g := range got.Generations {
		got.Generations[i].LastIssuedNotAfter = old[g.Name].LastIssuedNotAfter
		got.Generations[i].KeyCheck = old[g.Name].KeyCheck
		applied[g.Name] = true
	}
	// The signer's fields of a generation the trust publisher no longer
	// applies stay, listed first (another manager's order).
	for _, g := range a.Status.Generations {
		if !applied[g.Name] && (g.KeyCheck != nil || g.LastIssuedNotAfter != nil) {
			got.Generations = append([]v1alpha1.GenerationStatus{{Name: g.Name, KeyCheck: g.KeyCheck, LastIssuedNotAfter: g.LastIssuedNotAfter}}, got.Generations...)
		}
	}
	a.Status = got
	a.ResourceVersion += "1"
	return a, w.store.Update(a)
}

func (w *fakeWriter) Patch(_ context.Context, name string, pt types.PatchType, data []byte, _ metav1.PatchOptions, _ ...string) (*v1alpha1.Authority, error) {
	w.patches = append(w.patches, string(data))
	a := w.get(name)
	if pt == types.JSONPatchType && strings.Contains(string(data), `"remove"`) {
		delete(a.Annotations, v1alpha1.OverrideAnnotation)
	}
	return a, w.store.Update(a)
}

type harness struct {
	t        *testing.T
	c        *Controller
	w        *fakeWriter
	cs       *fake.Clientset
	clock    *clocktesting.FakeClock
	recorder *record.FakeRecorder
}

func newHarness(t *testing.T, a *v1alpha1.Authority) *harness {
	t.Helper()
	clk := clocktesting.NewFakeClock(t0)
	authInf := cache.NewSharedIndexInformer(&cache.ListWatch{}, &v1alpha1.Authority{}, 0, cache.Indexers{
		"signerName": func(obj any) ([]string, error) { return []string{obj.(*v1alpha1.Authority).Spec.SignerName}, nil },
	})
	ctbInf := cache.NewSharedIndexInformer(&cache.ListWatch{}, &certv1.ClusterTrustBundle{}, 0, cache.Indexers{})
	cs := fake.NewClientset()
	rec := record.NewFakeRecorder(100)
	m, err := newMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	w := &fakeWriter{store: authInf.GetIndexer()}
	c := newController(Options{Client: cs, SignerNames: []string{a.Spec.SignerName}, Clock: clk, Recorder: rec, HTTPClient: http.DefaultClient}, w, authInf, m)
	c.bundles = ctbInf
	if err := authInf.GetIndexer().Add(a.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, c: c, w: w, cs: cs, clock: clk, recorder: rec}
}

// sync runs one sync, then copies the ClusterTrustBundles the fake
// clientset holds into the informer's store (as the watch would).
func (h *harness) sync() error {
	h.t.Helper()
	err := h.c.sync(h.t.Context(), "example")
	list, lerr := h.cs.CertificatesV1().ClusterTrustBundles().List(h.t.Context(), metav1.ListOptions{})
	if lerr != nil {
		h.t.Fatal(lerr)
	}
	objs := make([]any, 0, len(list.Items))
	for i := range list.Items {
		objs = append(objs, &list.Items[i])
	}
	if err := h.c.bundles.GetStore().Replace(objs, ""); err != nil {
		h.t.Fatal(err)
	}
	return err
}

// settle syncs until a sync writes nothing (at most 10 times).
func (h *harness) settle() {
	h.t.Helper()
	for range 10 {
		before, actions := h.w.applies, len(h.cs.Actions())
		if err := h.sync(); err != nil {
			h.t.Fatalf("sync: %v", err)
		}
		if h.w.applies == before && len(h.cs.Actions()) == actions+1 { // +1: the harness's own List
			return
		}
	}
	h.t.Fatal("the Authority never settled: every sync writes")
}

func (h *harness) authority() *v1alpha1.Authority { return h.w.get("example") }

func (h *harness) phase(gen string) v1alpha1.Phase {
	for _, g := range h.authority().Status.Generations {
		if g.Name == gen {
			return g.Phase
		}
	}
	return ""
}

func (h *harness) bundle(version string) string {
	b, err := h.cs.CertificatesV1().ClusterTrustBundles().Get(h.t.Context(), BundleName("example.com/workload", version), metav1.GetOptions{})
	if err != nil {
		return ""
	}
	return b.Spec.TrustBundle
}

func (h *harness) setSpecPhase(gen string, p v1alpha1.Phase) {
	a := h.authority()
	for i := range a.Spec.Generations {
		if a.Spec.Generations[i].Name == gen {
			a.Spec.Generations[i].Phase = p
		}
	}
	a.Generation++
	if err := h.w.store.Update(a); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) keyReady(gen string) {
	a := h.authority()
	for i := range a.Status.Generations {
		if a.Status.Generations[i].Name == gen {
			a.Status.Generations[i].KeyCheck = readyCheck(a, gen)
		}
	}
	if err := h.w.store.Update(a); err != nil {
		h.t.Fatal(err)
	}
}

func bootstrapped(t *testing.T) (*v1alpha1.Authority, *testCA, *testCA) {
	old, next := rootCA(t, "old root"), rootCA(t, "new root")
	f := newFixture(time.Minute, 30*time.Second)
	f.a.Generation = 1
	f.gen("old", old, v1alpha1.PhaseActive, "", time.Time{})
	f.a.Status.Generations = []v1alpha1.GenerationStatus{{Name: "old", KeyCheck: readyCheck(f.a, "old")}}
	return f.a, old, next
}

// addNew adds generation "new" with ca's root, desired at p.
func addNew(a *v1alpha1.Authority, ca *testCA, p v1alpha1.Phase) {
	a.Spec.Generations = append(a.Spec.Generations, v1alpha1.Generation{Name: "new", KeyURI: "file:/new", CertificatePEM: ca.pem, Phase: p})
}

func TestBootstrapPublishesBothBundlesAndSettles(t *testing.T) {
	a, old, _ := bootstrapped(t)
	h := newHarness(t, a)
	h.settle()
	if got := h.phase("old"); got != v1alpha1.PhaseActive {
		t.Fatalf("observed phase = %q, want Active", got)
	}
	if h.bundle("canary") != old.pem || h.bundle("live") != old.pem {
		t.Fatalf("bundles canary=%q live=%q, want the old root in both", h.bundle("canary"), h.bundle("live"))
	}
	st := h.authority().Status
	for _, typ := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionBundlesPublished} {
		if !meta.IsStatusConditionTrue(st.Conditions, typ) {
			t.Errorf("condition %s not True: %+v", typ, meta.FindStatusCondition(st.Conditions, typ))
		}
	}
	for _, b := range st.Bundles {
		if !b.Published || b.LastChangeTime == nil || b.Digest == "" {
			t.Errorf("bundle status %+v: want published with a digest and lastChangeTime", b)
		}
	}
}

// A steady Authority, looked at again and again (resyncs, its own status
// updates), writes nothing: no hot loop.
func TestSteadyAuthorityCausesNoWrites(t *testing.T) {
	a, _, _ := bootstrapped(t)
	h := newHarness(t, a)
	h.settle()
	applies, actions := h.w.applies, len(h.cs.Actions())
	for range 5 {
		h.clock.Step(7 * time.Second)
		if err := h.sync(); err != nil {
			t.Fatal(err)
		}
	}
	if h.w.applies != applies {
		t.Fatalf("%d status writes from a steady Authority, want 0", h.w.applies-applies)
	}
	for _, act := range h.cs.Actions()[actions:] {
		if act.GetVerb() != "list" {
			t.Fatalf("a steady Authority made a %s of %s", act.GetVerb(), act.GetResource().Resource)
		}
	}
}

// The signer's entry for a generation gone from spec, listed in another
// order than spec's, is not a difference: still no writes.
func TestSignerOnlyGenerationCausesNoWrites(t *testing.T) {
	a, _, _ := bootstrapped(t)
	a.Status.Generations = append(a.Status.Generations, v1alpha1.GenerationStatus{Name: "gone", KeyCheck: &v1alpha1.KeyCheck{Ready: false}})
	h := newHarness(t, a)
	h.settle()
	if n := len(h.authority().Status.Generations); n != 2 {
		t.Fatalf("%d status generations, want old and the signer's gone", n)
	}
	applies := h.w.applies
	for range 3 {
		if err := h.sync(); err != nil {
			t.Fatal(err)
		}
	}
	if h.w.applies != applies {
		t.Fatalf("%d status writes, want 0", h.w.applies-applies)
	}
}

// A full rotation driven by spec edits, gates counted on a fake clock.
func TestRotationMovesOnlyWhenGatesOpen(t *testing.T) {
	a, old, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhaseStaged)
	h := newHarness(t, a)
	h.settle()
	if h.phase("new") != v1alpha1.PhaseStaged || h.bundle("canary") != old.pem+next.pem || h.bundle("live") != old.pem {
		t.Fatalf("after staging: new=%s canary=%q live=%q", h.phase("new"), h.bundle("canary"), h.bundle("live"))
	}

	h.setSpecPhase("new", v1alpha1.PhasePromoted)
	h.settle()
	g := h.authority().Status.Generations[1]
	if g.Phase != v1alpha1.PhaseStaged || g.Gate != v1alpha1.GateCanarySoak || g.GateOpensAt == nil {
		t.Fatalf("early promotion: %+v, want held by CanarySoak with gateOpensAt", g)
	}
	if c := meta.FindStatusCondition(h.authority().Status.Conditions, v1alpha1.ConditionProgressing); c == nil || c.Reason != v1alpha1.GateCanarySoak {
		t.Fatalf("Progressing = %+v, want reason CanarySoak", c)
	}
	h.clock.SetTime(g.GateOpensAt.Add(time.Second))
	h.settle()
	if h.phase("new") != v1alpha1.PhasePromoted || h.bundle("live") != old.pem+next.pem {
		t.Fatalf("after the soak: new=%s live=%q", h.phase("new"), h.bundle("live"))
	}

	h.setSpecPhase("new", v1alpha1.PhaseActive)
	h.setSpecPhase("old", v1alpha1.PhasePromoted)
	h.keyReady("new")
	h.clock.Step(time.Minute) // past the propagation window
	h.settle()
	if h.phase("new") != v1alpha1.PhaseActive || h.phase("old") != v1alpha1.PhasePromoted {
		t.Fatalf("after activation: new=%s old=%s", h.phase("new"), h.phase("old"))
	}

	h.setSpecPhase("old", v1alpha1.PhaseRetired)
	h.clock.Step(time.Minute)
	h.settle()
	if h.phase("old") != v1alpha1.PhaseRetiring || h.bundle("canary") != next.pem || h.bundle("live") != old.pem+next.pem {
		t.Fatalf("retiring: old=%s canary=%q live=%q", h.phase("old"), h.bundle("canary"), h.bundle("live"))
	}
	h.clock.Step(2 * time.Minute)
	h.settle()
	if h.phase("old") != v1alpha1.PhaseRetired || h.bundle("live") != next.pem {
		t.Fatalf("retired: old=%s live=%q", h.phase("old"), h.bundle("live"))
	}
}

// An edited bundle is written back, and the repair is not a change: the
// propagation window does not restart.
func TestRepairedDriftIsNotAChange(t *testing.T) {
	a, old, _ := bootstrapped(t)
	h := newHarness(t, a)
	h.settle()
	before := h.authority().Status.Bundles
	h.clock.Step(time.Minute)
	b, err := h.cs.CertificatesV1().ClusterTrustBundles().Get(t.Context(), BundleName("example.com/workload", "live"), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b.Spec.TrustBundle = rootCA(t, "intruder").pem
	if _, err := h.cs.CertificatesV1().ClusterTrustBundles().Update(t.Context(), b, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.c.bundles.GetStore().Update(b); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if h.bundle("live") != old.pem {
		t.Fatalf("live bundle = %q, want the old root back", h.bundle("live"))
	}
	after := h.authority().Status.Bundles
	for i := range before {
		if !after[i].LastChangeTime.Equal(before[i].LastChangeTime) {
			t.Fatalf("bundle %s lastChangeTime moved %v → %v on a repair", after[i].Version, before[i].LastChangeTime, after[i].LastChangeTime)
		}
	}
}

// The override annotation moves a held generation at once, leaves a
// Warning Event naming generation, phase, gate and reason, and is removed.
func TestOverrideMovesAndIsRemovedWithAnEvent(t *testing.T) {
	a, _, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhaseStaged)
	h := newHarness(t, a)
	h.settle()
	h.setSpecPhase("new", v1alpha1.PhasePromoted)
	cur := h.authority()
	cur.Annotations = map[string]string{v1alpha1.OverrideAnnotation: `{"reason":"drill","generations":{"new":"Promoted"},"requestedBy":"alice"}`}
	if err := h.w.store.Update(cur); err != nil {
		t.Fatal(err)
	}
	h.settle()
	if h.phase("new") != v1alpha1.PhasePromoted {
		t.Fatalf("new = %s, want Promoted at once", h.phase("new"))
	}
	if _, ok := h.authority().Annotations[v1alpha1.OverrideAnnotation]; ok {
		t.Fatal("the override annotation is still there")
	}
	e := h.event(EventGateOverridden)
	for _, want := range []string{"Warning", "new", "Promoted", v1alpha1.GateCanarySoak, "drill", "alice"} {
		if !strings.Contains(e, want) {
			t.Errorf("event %q does not name %q", e, want)
		}
	}
	if e := h.event(EventGateOverridden); e != "" {
		t.Fatalf("a second %s Event: %q", EventGateOverridden, e)
	}
}

// event returns the next recorded Event with reason, or "".
func (h *harness) event(reason string) string {
	for {
		select {
		case e := <-h.recorder.Events:
			if strings.Contains(e, " "+reason+" ") {
				return e
			}
		default:
			return ""
		}
	}
}

// A canary health URL that fails during the soak holds the promotion and
// restarts the soak when it recovers.
func TestFailingCanaryHealthRestartsTheSoak(t *testing.T) {
	var healthy atomic.Bool
	healthy.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	a, _, next := bootstrapped(t)
	a.Spec.Gates.CanaryHealth = &v1alpha1.CanaryHealth{URL: srv.URL, Interval: &metav1.Duration{Duration: time.Second}}
	addNew(a, next, v1alpha1.PhasePromoted)
	h := newHarness(t, a)
	h.settle()
	staged := h.clock.Now()
	h.clock.Step(40 * time.Second)
	healthy.Store(false)
	h.settle()
	if g := h.authority().Status.Generations[1]; g.Gate != v1alpha1.GateCanaryHealth {
		t.Fatalf("with the URL failing: %+v, want held by CanaryHealth", g)
	}
	h.clock.Step(10 * time.Second)
	healthy.Store(true)
	recovered := h.clock.Now()
	h.settle()
	h.clock.SetTime(staged.Add(time.Minute + 5*time.Second)) // the first soak would be over
	h.settle()
	g := h.authority().Status.Generations[1]
	if g.Phase != v1alpha1.PhaseStaged || g.Gate != v1alpha1.GateCanarySoak || g.GateOpensAt == nil || g.GateOpensAt.Time.Before(recovered.Add(time.Minute).Truncate(time.Second)) {
		t.Fatalf("after recovery: %+v, want a soak counted from the recovery at %v", g, recovered)
	}
}

var _ runtime.Object = &v1alpha1.Authority{}

// A sync that keeps failing the same way (say, the status write refused
// for a missing authorities/status grant) is logged once at default
// verbosity, again when the error changes, and its recovery once.
func TestFailingSyncIsLoggedOncePerChange(t *testing.T) {
	a, _, _ := bootstrapped(t)
	h := newHarness(t, a)
	var errorLines, infoLines []string
	logger := funcr.New(func(prefix, args string) {
		if strings.Contains(args, `"error"`) {
			errorLines = append(errorLines, args)
		} else {
			infoLines = append(infoLines, args)
		}
	}, funcr.Options{})
	ctx := klog.NewContext(t.Context(), logger)
	forbidden := apierrors.NewForbidden(schema.GroupResource{Group: "keyward.dev", Resource: "authorities/status"}, "example", errors.New("no patch grant"))
	for range 5 {
		h.c.logSyncResult(ctx, "example", forbidden)
	}
	if len(errorLines) != 1 {
		t.Fatalf("5 identical failures logged %d error lines, want 1: %q", len(errorLines), errorLines)
	}
	h.c.logSyncResult(ctx, "example", errors.New("another failure"))
	if len(errorLines) != 2 {
		t.Fatalf("a changed failure logged %d error lines in all, want 2", len(errorLines))
	}
	h.c.logSyncResult(ctx, "example", nil)
	h.c.logSyncResult(ctx, "example", nil)
	if len(infoLines) != 1 {
		t.Fatalf("recovery logged %d lines, want 1: %q", len(infoLines), infoLines)
	}
	h.c.logSyncResult(ctx, "example", forbidden)
	if len(errorLines) != 3 {
		t.Errorf("a failure after recovery logged %d error lines in all, want 3", len(errorLines))
	}
}

// A cluster without the Authority CRD (every list answered 404) is said
// once at default verbosity, not at every retry, and again after it was
// served in between.
func TestMissingAuthorityCRDIsSaidOnce(t *testing.T) {
	a, _, _ := bootstrapped(t)
	h := newHarness(t, a)
	var lines []string
	ctx := klog.NewContext(t.Context(), funcr.New(func(_, args string) { lines = append(lines, args) }, funcr.Options{}))
	notFound := apierrors.NewNotFound(schema.GroupResource{Group: "keyward.dev", Resource: "authorities"}, "")
	for range 4 {
		h.c.watchError(ctx, nil, notFound)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], "authorities.keyward.dev") {
		t.Fatalf("4 refused lists logged %d lines, want 1 naming authorities.keyward.dev: %q", len(lines), lines)
	}
	h.c.enqueueAuthority(a)
	h.c.watchError(ctx, nil, notFound)
	if len(lines) != 2 {
		t.Errorf("a 404 after the resource was served again logged %d lines in all, want 2", len(lines))
	}
}
