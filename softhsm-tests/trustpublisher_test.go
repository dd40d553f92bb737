package softhsmtests

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	phaserecord "github.com/keyward/keyward/kubeclient/authority/record"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/prometheus/client_golang/prometheus"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/retry"
)

// startTrustPublisher runs a trust publisher for signers as the identity
// of cfg until the test ends.
func startTrustPublisher(t *testing.T, cfg *rest.Config, signers ...string) {
	t.Helper()
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ac, err := authclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	rec := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "keyward-trustpublisher"})
	c, err := trustpublisher.New(trustpublisher.Options{
		Client: cs, Authorities: ac, SignerNames: signers, Recorder: rec, Metrics: prometheus.NewRegistry(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("trust publisher: %v", err)
		}
		broadcaster.Shutdown()
	})
}

// rotationFixture is one signer's Authority under test.
type rotationFixture struct {
	t      *testing.T
	ctx    context.Context
	c      *authclient.Client
	name   string
	signer string
	// ready are the generations whose keyCheck the test signer reports.
	ready []string
}

func newRotationFixture(t *testing.T, gates kwv1alpha1.Gates, gens ...kwv1alpha1.Generation) *rotationFixture {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	installAuthorityCRD(t, ctx)
	c, err := authclient.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t, "tp")
	f := &rotationFixture{t: t, ctx: ctx, c: c, name: name, signer: "keyward.dev/" + name}
	if _, err := c.Create(ctx, &kwv1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       kwv1alpha1.AuthoritySpec{SignerName: f.signer, Gates: gates, Generations: gens},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = c.Delete(context.Background(), name, metav1.DeleteOptions{})
		for _, v := range []string{"canary", "live"} {
			_ = cp.AdminClient().CertificatesV1().ClusterTrustBundles().Delete(context.Background(), trustpublisher.BundleName(f.signer, v), metav1.DeleteOptions{})
		}
	})
	return f
}

func genSpec(name string, ca *testCA, p kwv1alpha1.Phase) kwv1alpha1.Generation {
	return kwv1alpha1.Generation{Name: name, KeyURI: "pkcs11:token=keyward;object=" + name, CertificatePEM: ca.pem, Phase: p}
}

// edit changes the spec (or annotations) as the CLI would, retrying on
// the conflicts the controller's status writes cause.
func (f *rotationFixture) edit(mutate func(a *kwv1alpha1.Authority)) {
	f.t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a, err := f.c.Get(f.ctx, f.name)
		if err != nil {
			return err
		}
		mutate(a)
		_, err = f.c.Update(f.ctx, a, metav1.UpdateOptions{FieldManager: kwv1alpha1.FieldManagerCLI})
		return err
	})
	if err != nil {
		f.t.Fatalf("editing Authority %s: %v", f.name, err)
	}
}

func (f *rotationFixture) setPhases(phases map[string]kwv1alpha1.Phase) {
	f.edit(func(a *kwv1alpha1.Authority) {
		for i, g := range a.Spec.Generations {
			if p, ok := phases[g.Name]; ok {
				a.Spec.Generations[i].Phase = p
			}
		}
	})
}

// keyReady reports gen's key ready, as the signer would: its apply lists
// every generation it reports on (a field it leaves out is dropped).
func (f *rotationFixture) keyReady(gen string) {
	f.t.Helper()
	f.ready = append(f.ready, gen)
	a, err := f.c.Get(f.ctx, f.name)
	if err != nil {
		f.t.Fatal(err)
	}
	var gens []map[string]any
	for _, g := range f.ready {
		gens = append(gens, map[string]any{"name": g, "keyCheck": readyKeyCheck(a, g)})
	}
	if _, err := f.c.ApplyStatus(f.ctx, f.name, map[string]any{"generations": gens}, kwv1alpha1.FieldManagerSigner); err != nil {
		f.t.Fatalf("signer's keyCheck for %s: %v", gen, err)
	}
}

// waitFor polls the Authority until ok says yes, and returns it.
func (f *rotationFixture) waitFor(what string, ok func(a *kwv1alpha1.Authority) bool) *kwv1alpha1.Authority {
	f.t.Helper()
	var last *kwv1alpha1.Authority
	err := wait.PollUntilContextTimeout(f.ctx, 100*time.Millisecond, 60*time.Second, true, func(ctx context.Context) (bool, error) {
		a, err := f.c.Get(ctx, f.name)
		if err != nil {
			return false, err
		}
		last = a
		return ok(a), nil
	})
	if err != nil {
		f.t.Fatalf("waiting for %s: %v; status: %s", what, err, statusSummary(last))
	}
	return last
}

// steady waits until the Authority has not been written for a second, so
// that what happens next is caused by the test, not by a sync in flight.
func (f *rotationFixture) steady() *kwv1alpha1.Authority {
	f.t.Helper()
	var last *kwv1alpha1.Authority
	err := wait.PollUntilContextTimeout(f.ctx, time.Second, 30*time.Second, false, func(ctx context.Context) (bool, error) {
		a, err := f.c.Get(ctx, f.name)
		if err != nil {
			return false, err
		}
		done := last != nil && last.ResourceVersion == a.ResourceVersion
		last = a
		return done, nil
	})
	if err != nil {
		f.t.Fatalf("waiting for Authority %s to be steady: %v", f.name, err)
	}
	return last
}

func statusSummary(a *kwv1alpha1.Authority) string {
	if a == nil {
		return "(none)"
	}
	var b strings.Builder
	for _, g := range a.Status.Generations {
		fmt.Fprintf(&b, "[%s %s gate=%s] ", g.Name, g.Phase, g.Gate)
	}
	for _, c := range a.Status.Conditions {
		fmt.Fprintf(&b, "{%s=%s %s: %s} ", c.Type, c.Status, c.Reason, c.Message)
	}
	for _, bs := range a.Status.Bundles {
		fmt.Fprintf(&b, "<%s published=%v %v> ", bs.Version, bs.Published, bs.Generations)
	}
	return b.String()
}

func observed(a *kwv1alpha1.Authority, gen string) kwv1alpha1.GenerationStatus {
	for _, g := range a.Status.Generations {
		if g.Name == gen {
			return g
		}
	}
	return kwv1alpha1.GenerationStatus{}
}

func phasesAre(want map[string]kwv1alpha1.Phase) func(*kwv1alpha1.Authority) bool {
	return func(a *kwv1alpha1.Authority) bool {
		for g, p := range want {
			if observed(a, g).Phase != p {
				return false
			}
		}
		return meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionBundlesPublished)
	}
}

// kubeletView reads a signer's bundle of one version exactly as kubelet
// selects it: a spec.signerName field selector plus the version label,
// every match merged, deduplicated by DER.
func kubeletView(t *testing.T, ctx context.Context, signer, version string) [][]byte {
	t.Helper()
	list, err := cp.AdminClient().CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String(),
		LabelSelector: labels.SelectorFromSet(labels.Set{kwv1alpha1.BundleVersionLabel("keyward.dev"): version}).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, b := range list.Items {
		rest := []byte(b.Spec.TrustBundle)
		for {
			var blk *pem.Block
			blk, rest = pem.Decode(rest)
			if blk == nil {
				break
			}
			if !slices.ContainsFunc(out, func(d []byte) bool { return bytes.Equal(d, blk.Bytes) }) {
				out = append(out, blk.Bytes)
			}
		}
	}
	return out
}

// checkBundles waits until kubelet's view of canary and live holds exactly
// the given roots (propagation through the informer takes a moment).
func (f *rotationFixture) checkBundles(phase string, canary, live []*testCA) {
	f.t.Helper()
	same := func(got [][]byte, want []*testCA) bool {
		if len(got) != len(want) {
			return false
		}
		for _, w := range want {
			if !slices.ContainsFunc(got, func(d []byte) bool { return bytes.Equal(d, w.cert.Raw) }) {
				return false
			}
		}
		return true
	}
	var gc, gl [][]byte
	err := wait.PollUntilContextTimeout(f.ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		gc, gl = kubeletView(f.t, ctx, f.signer, "canary"), kubeletView(f.t, ctx, f.signer, "live")
		return same(gc, canary) && same(gl, live), nil
	})
	if err != nil {
		f.t.Fatalf("%s: kubelet sees %d roots in canary and %d in live, want %d and %d", phase, len(gc), len(gl), len(canary), len(live))
	}
}

// verifiesAgainst reports whether leaf chains to a root of the bundle.
func verifiesAgainst(leaf *x509.Certificate, bundle [][]byte) bool {
	pool := x509.NewCertPool()
	for _, d := range bundle {
		c, err := x509.ParseCertificate(d)
		if err == nil {
			pool.AddCert(c)
		}
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

// A whole rotation old→new with gates compressed to seconds, driven by
// spec edits only. At every phase the canary and live bundles, read as
// kubelet selects them, hold exactly the roots the phases put there, and
// leaves signed before and after activation verify against the live
// bundle a workload holds at that moment.
func TestTrustPublisherRotatesCanaryThenLive(t *testing.T) {
	oldCA, newCA := newTestCA(t), newTestCA(t)
	gates := kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: 2 * time.Second}, PropagationWindow: &metav1.Duration{Duration: time.Second}}
	f := newRotationFixture(t, gates, genSpec("old", oldCA, kwv1alpha1.PhaseActive))
	startTrustPublisher(t, cp.AdminConfig(), f.signer)
	start := time.Now()

	// Bootstrap waits for the signer's keyCheck.
	a := f.waitFor("bootstrap held by KeyNotReady", func(a *kwv1alpha1.Authority) bool {
		return observed(a, "old").Gate == kwv1alpha1.GateKeyNotReady
	})
	if meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionReady) {
		t.Fatal("Ready before any generation is Active")
	}
	f.keyReady("old")
	f.waitFor("old Active", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive}))
	f.checkBundles("bootstrap", []*testCA{oldCA}, []*testCA{oldCA})

	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	_, leafOld := oldCA.issue(t, key.Public(), time.Now(), time.Hour)

	f.edit(func(a *kwv1alpha1.Authority) {
		a.Spec.Generations = append(a.Spec.Generations, genSpec("new", newCA, kwv1alpha1.PhaseStaged))
	})
	f.waitFor("new Staged", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "new": kwv1alpha1.PhaseStaged}))
	f.checkBundles("staged", []*testCA{oldCA, newCA}, []*testCA{oldCA})

	f.setPhases(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhasePromoted})
	f.waitFor("new Promoted", phasesAre(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhasePromoted}))
	f.checkBundles("promoted", []*testCA{oldCA, newCA}, []*testCA{oldCA, newCA})

	f.keyReady("new")
	f.setPhases(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhaseActive, "old": kwv1alpha1.PhasePromoted})
	a = f.waitFor("new Active, old Promoted", phasesAre(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhaseActive, "old": kwv1alpha1.PhasePromoted}))
	if !observed(a, "new").Since.Equal(observed(a, "old").Since) {
		t.Errorf("new became Active at %v and old left Active at %v: not one status write", observed(a, "new").Since, observed(a, "old").Since)
	}
	f.checkBundles("activated", []*testCA{oldCA, newCA}, []*testCA{oldCA, newCA})
	_, leafNew := newCA.issue(t, key.Public(), time.Now(), time.Hour)
	live := kubeletView(t, f.ctx, f.signer, "live")
	if !verifiesAgainst(leafOld, live) || !verifiesAgainst(leafNew, live) {
		t.Fatal("after activation, a leaf from before or after does not verify against the live bundle")
	}

	f.setPhases(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseRetired})
	f.waitFor("old Retiring", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseRetiring}))
	f.checkBundles("retiring", []*testCA{newCA}, []*testCA{oldCA, newCA})
	if live := kubeletView(t, f.ctx, f.signer, "live"); !verifiesAgainst(leafOld, live) {
		t.Fatal("while old retires, its leaf no longer verifies against live")
	}
	a = f.waitFor("old Retired", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseRetired}))
	f.checkBundles("retired", []*testCA{newCA}, []*testCA{newCA})
	live = kubeletView(t, f.ctx, f.signer, "live")
	if verifiesAgainst(leafOld, live) || !verifiesAgainst(leafNew, live) {
		t.Fatal("after retirement: want only the new key's leaf to verify against live")
	}
	for _, g := range []string{"old", "new"} {
		if kc := observed(a, g).KeyCheck; kc == nil || !kc.Ready {
			t.Errorf("generation %s's keyCheck = %+v: the trust publisher's status applies erased the signer's field", g, kc)
		}
	}
	if !meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionReady) || meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionProgressing) {
		t.Fatalf("at the end: %s; want Ready and not Progressing", statusSummary(a))
	}
	t.Logf("compressed rotation (soak 2s, propagation window 1s) took %s", time.Since(start).Round(100*time.Millisecond))

	// Steady: once the status records the retired bundles as published (the
	// write after the bundle write), nothing more is written.
	a = f.waitFor("bundles recorded as published", func(a *kwv1alpha1.Authority) bool {
		if len(a.Status.Bundles) != 2 || !meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionBundlesPublished) {
			return false
		}
		for _, b := range a.Status.Bundles {
			if !b.Published || len(b.Generations) != 1 || b.Generations[0] != "new" {
				return false
			}
		}
		return true
	})
	rv := a.ResourceVersion
	time.Sleep(2 * time.Second)
	if a, err := f.c.Get(f.ctx, f.name); err != nil || a.ResourceVersion != rv {
		t.Fatalf("a steady Authority was written (resourceVersion %s → %s, %v)", rv, a.ResourceVersion, err)
	}
}

// An early promotion is held with the gate named in status and in the
// Progressing condition; an override annotation moves it at once, leaves a
// GateOverridden Event and is removed.
func TestTrustPublisherHoldsEarlyTransitionUntilOverridden(t *testing.T) {
	oldCA, newCA := newTestCA(t), newTestCA(t)
	gates := kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: time.Hour}, PropagationWindow: &metav1.Duration{Duration: time.Second}}
	f := newRotationFixture(t, gates, genSpec("old", oldCA, kwv1alpha1.PhaseActive), genSpec("new", newCA, kwv1alpha1.PhaseStaged))
	f.keyReady("old")
	startTrustPublisher(t, signerSARestConfig(t), f.signer)
	f.waitFor("new Staged", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "new": kwv1alpha1.PhaseStaged}))

	f.setPhases(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhasePromoted})
	a := f.waitFor("promotion held by CanarySoak", func(a *kwv1alpha1.Authority) bool {
		c := meta.FindStatusCondition(a.Status.Conditions, kwv1alpha1.ConditionProgressing)
		return observed(a, "new").Gate == kwv1alpha1.GateCanarySoak && c != nil && c.Status == metav1.ConditionTrue && c.Reason == kwv1alpha1.GateCanarySoak
	})
	if g := observed(a, "new"); g.Phase != kwv1alpha1.PhaseStaged || g.GateOpensAt == nil || time.Until(g.GateOpensAt.Time) < 50*time.Minute {
		t.Fatalf("held promotion: %+v, want Staged with the soak opening in about an hour", g)
	}
	f.checkBundles("held", []*testCA{oldCA, newCA}, []*testCA{oldCA})

	f.edit(func(a *kwv1alpha1.Authority) {
		if a.Annotations == nil {
			a.Annotations = map[string]string{}
		}
		a.Annotations[kwv1alpha1.OverrideAnnotation] = `{"reason":"incident 42 drill","generations":{"new":"Promoted"},"requestedBy":"alice"}`
	})
	a = f.waitFor("new Promoted by the override, annotation removed", func(a *kwv1alpha1.Authority) bool {
		_, still := a.Annotations[kwv1alpha1.OverrideAnnotation]
		return observed(a, "new").Phase == kwv1alpha1.PhasePromoted && !still
	})
	f.checkBundles("overridden", []*testCA{oldCA, newCA}, []*testCA{oldCA, newCA})
	var event *corev1.Event
	err := wait.PollUntilContextTimeout(f.ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cp.AdminClient().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": f.name, "reason": trustpublisher.EventGateOverridden}.String(),
		})
		if err != nil || len(list.Items) == 0 {
			return false, err
		}
		event = &list.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no %s Event on Authority %s: %v", trustpublisher.EventGateOverridden, f.name, err)
	}
	if event.Type != corev1.EventTypeWarning || event.InvolvedObject.Kind != "Authority" {
		t.Fatalf("event %+v: want a Warning on the Authority", event)
	}
	for _, want := range []string{"new", "Promoted", kwv1alpha1.GateCanarySoak, "incident 42 drill", "alice"} {
		if !strings.Contains(event.Message, want) {
			t.Errorf("event message %q does not name %q", event.Message, want)
		}
	}
}

// A deleted and an edited ClusterTrustBundle come back; the repair is not
// a content change (lastChangeTime stays).
func TestTrustPublisherRepairsBundles(t *testing.T) {
	ca := newTestCA(t)
	gates := kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: time.Hour}, PropagationWindow: &metav1.Duration{Duration: time.Hour}}
	f := newRotationFixture(t, gates, genSpec("only", ca, kwv1alpha1.PhaseActive))
	f.keyReady("only")
	startTrustPublisher(t, signerSARestConfig(t), f.signer)
	f.waitFor("only Active", phasesAre(map[string]kwv1alpha1.Phase{"only": kwv1alpha1.PhaseActive}))
	f.checkBundles("published", []*testCA{ca}, []*testCA{ca})
	before := f.steady()

	ctbs := cp.AdminClient().CertificatesV1().ClusterTrustBundles()
	if err := ctbs.Delete(f.ctx, trustpublisher.BundleName(f.signer, "live"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		b, err := ctbs.Get(f.ctx, trustpublisher.BundleName(f.signer, "canary"), metav1.GetOptions{})
		if err != nil {
			return err
		}
		b.Spec.TrustBundle = newTestCA(t).pem
		_, err = ctbs.Update(f.ctx, b, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	f.checkBundles("repaired", []*testCA{ca}, []*testCA{ca})
	after, err := f.c.Get(f.ctx, f.name)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range after.Status.Bundles {
		if !b.LastChangeTime.Equal(before.Status.Bundles[i].LastChangeTime) {
			t.Errorf("bundle %s lastChangeTime %v → %v: a repair counted as a change", b.Version, before.Status.Bundles[i].LastChangeTime, b.LastChangeTime)
		}
	}
}

// A canary health URL that fails during the soak holds the promotion and
// restarts the soak: the generation is promoted no earlier than a whole
// soak after health came back.
func TestTrustPublisherCanaryHealthRestartsTheSoak(t *testing.T) {
	var failing atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if failing.Load() {
			http.Error(w, "canary broken", http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(srv.Close)
	oldCA, newCA := newTestCA(t), newTestCA(t)
	const soak = 4 * time.Second
	gates := kwv1alpha1.Gates{
		CanarySoak: &metav1.Duration{Duration: soak}, PropagationWindow: &metav1.Duration{Duration: time.Second},
		CanaryHealth: &kwv1alpha1.CanaryHealth{URL: srv.URL, Interval: &metav1.Duration{Duration: time.Second}},
	}
	f := newRotationFixture(t, gates, genSpec("old", oldCA, kwv1alpha1.PhaseActive))
	f.keyReady("old")
	startTrustPublisher(t, signerSARestConfig(t), f.signer)
	f.waitFor("old Active", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive}))

	f.edit(func(a *kwv1alpha1.Authority) {
		a.Spec.Generations = append(a.Spec.Generations, genSpec("new", newCA, kwv1alpha1.PhasePromoted))
	})
	f.waitFor("new Staged and healthy", func(a *kwv1alpha1.Authority) bool {
		return observed(a, "new").Phase == kwv1alpha1.PhaseStaged && meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionCanaryHealthy)
	})
	failing.Store(true)
	f.waitFor("held by CanaryHealth", func(a *kwv1alpha1.Authority) bool {
		c := meta.FindStatusCondition(a.Status.Conditions, kwv1alpha1.ConditionCanaryHealthy)
		return observed(a, "new").Gate == kwv1alpha1.GateCanaryHealth && c != nil && c.Status == metav1.ConditionFalse && c.Reason == trustpublisher.ReasonURLFailed
	})
	// Long enough that the first soak would have ended.
	time.Sleep(soak)
	if a, _ := f.c.Get(f.ctx, f.name); observed(a, "new").Phase != kwv1alpha1.PhaseStaged {
		t.Fatalf("promoted while the canary health URL fails: %s", statusSummary(a))
	}
	failing.Store(false)
	a := f.waitFor("new Promoted, its bundles confirmed", func(a *kwv1alpha1.Authority) bool {
		return phasesAre(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhasePromoted})(a) && observed(a, "new").Since != nil
	})
	healthy := meta.FindStatusCondition(a.Status.Conditions, kwv1alpha1.ConditionCanaryHealthy)
	promoted := observed(a, "new").Since
	if healthy == nil || promoted.Time.Before(healthy.LastTransitionTime.Add(soak)) {
		t.Fatalf("promoted at %v, health back at %v: want a whole %s soak after it", promoted, healthy, soak)
	}
}

// An identity without `attest` on a signer name cannot publish its
// bundles: BundlesPublished=False names the missing grant and no
// ClusterTrustBundle exists. Granting attest on that name lets the bundles
// appear. RBAC proven against the apiserver.
func TestTrustPublisherWithoutAttestPublishesNothing(t *testing.T) {
	ca := newTestCA(t)
	gates := kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: time.Hour}, PropagationWindow: &metav1.Duration{Duration: time.Second}}
	f := newRotationFixture(t, gates, genSpec("only", ca, kwv1alpha1.PhaseActive))
	f.keyReady("only")
	user := "keyward-test-no-attest-" + f.name
	grant(t, f.ctx, user+"-base", user, []rbacv1.PolicyRule{
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"create", "get", "list", "watch", "update", "patch", "delete"}},
		{APIGroups: []string{"keyward.dev"}, Resources: []string{"authorities"}, Verbs: []string{"get", "list", "watch", "patch"}},
		{APIGroups: []string{"keyward.dev"}, Resources: []string{"authorities/status"}, Verbs: []string{"patch"}},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch", "update"}},
	})
	cfg, err := cp.UserConfig(user, "system:authenticated")
	if err != nil {
		t.Fatal(err)
	}
	waitAllowed(t, f.ctx, cfg, authzv1.ResourceAttributes{Group: "keyward.dev", Resource: "authorities", Verb: "watch"})
	startTrustPublisher(t, cfg, f.signer)

	a := f.waitFor("BundlesPublished=False for want of attest", func(a *kwv1alpha1.Authority) bool {
		c := meta.FindStatusCondition(a.Status.Conditions, kwv1alpha1.ConditionBundlesPublished)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == trustpublisher.ReasonAttestForbidden
	})
	msg := meta.FindStatusCondition(a.Status.Conditions, kwv1alpha1.ConditionBundlesPublished).Message
	if !strings.Contains(msg, "attest") || !strings.Contains(msg, "signers/"+f.signer) {
		t.Fatalf("BundlesPublished message %q does not name the attest grant on signers/%s", msg, f.signer)
	}
	for _, v := range []string{"canary", "live"} {
		if _, err := cp.AdminClient().CertificatesV1().ClusterTrustBundles().Get(f.ctx, trustpublisher.BundleName(f.signer, v), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Fatalf("bundle %s without attest: got %v, want NotFound", v, err)
		}
	}

	grant(t, f.ctx, user+"-attest", user, []rbacv1.PolicyRule{
		{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{f.signer}, Verbs: []string{"attest"}},
	})
	f.waitFor("bundles published once attest is granted", phasesAre(map[string]kwv1alpha1.Phase{"only": kwv1alpha1.PhaseActive}))
	f.checkBundles("granted", []*testCA{ca}, []*testCA{ca})
}

// signerSARestConfig is the signer's service account, bound by the shipped RBAC.
func signerSARestConfig(t *testing.T) *rest.Config {
	t.Helper()
	cfg, err := cp.ServiceAccountConfig(signerNamespace, signerServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// grant binds a ClusterRole of rules to user until the test ends.
func grant(t *testing.T, ctx context.Context, name, user string, rules []rbacv1.PolicyRule) {
	t.Helper()
	admin := cp.AdminClient().RbacV1()
	if _, err := admin.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = admin.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// waitAllowed waits until the apiserver's authorizer grants cfg's user
// attrs (it learns of new bindings through an informer).
func waitAllowed(t *testing.T, ctx context.Context, cfg *rest.Config, attrs authzv1.ResourceAttributes) {
	t.Helper()
	waitAuthorized(t, ctx, cfg, attrs, true)
}

// waitDenied waits until the authorizer no longer grants attrs (a grant
// taken away).
func waitDenied(t *testing.T, ctx context.Context, cfg *rest.Config, attrs authzv1.ResourceAttributes) {
	t.Helper()
	waitAuthorized(t, ctx, cfg, attrs, false)
}

func waitAuthorized(t *testing.T, ctx context.Context, cfg *rest.Config, attrs authzv1.ResourceAttributes, want bool) {
	t.Helper()
	cs := clientFor(t, cfg, nil)
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &attrs}}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed == want, nil
	})
	if err != nil {
		t.Fatalf("waiting for %+v to be allowed=%v: %v", attrs, want, err)
	}
}

// readyKeyCheck is the keyCheck the signer writes for a ready key of a's
// generation gen: it names the keyURI and certificate it checked.
func readyKeyCheck(a *kwv1alpha1.Authority, gen string) map[string]any {
	for _, g := range a.Spec.Generations {
		if g.Name == gen {
			return map[string]any{"ready": true, "keyURI": g.KeyURI, "certificateDigest": phaserecord.CertificateDigest(g)}
		}
	}
	return map[string]any{"ready": true}
}
