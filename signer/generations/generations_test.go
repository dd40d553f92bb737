package generations

import (
	"context"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

const signerName = "keyward.dev/unit"

// testCA is a file key and a self-signed root for it.
type testCA struct {
	uri, pem string
	fp       string
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	ctx := context.Background()
	key, err := file.New().CreateKey(ctx, backends.CreateKeyRequest{URI: "file:" + filepath.Join(t.TempDir(), name+".pem"), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	root, err := ca.SelfSign(ctx, key, ca.Options{Subject: pkix.Name{CommonName: name}, Lifetime: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return testCA{uri: key.URI(), pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})), fp: key.Fingerprint()}
}

// recordingWriter counts status applies and keeps the last body.
type recordingWriter struct {
	mu     sync.Mutex
	writes int
	last   map[string]any
	fail   error
	delay  time.Duration
}

func (w *recordingWriter) ApplyStatus(_ context.Context, _ string, status any, manager string) (*v1alpha1.Authority, error) {
	if manager != v1alpha1.FieldManagerSigner {
		panic("wrong field manager " + manager)
	}
	time.Sleep(w.delay)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.writes++
	w.last, _ = status.(map[string]any)
	return &v1alpha1.Authority{}, w.fail
}

func (w *recordingWriter) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes
}

// noWatchList tells the reflector that the fake watch cannot stream the
// initial list (it has no bookmarks).
type noWatchList struct{ *cache.ListWatch }

func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

// harness runs a Manager over a fake Authority watch.
type harness struct {
	m     *Manager
	watch *watch.FakeWatcher
	// bundles is the watch of the trust publisher's bundles (recordOf).
	bundles *watch.FakeWatcher
	writer  *recordingWriter
	opened  atomic.Int32
	// pinRefused counts opens of a refusedPIN URI.
	pinRefused atomic.Int32
	// pinUnreadable counts opens of an unreadablePIN URI.
	pinUnreadable atomic.Int32
}

// refusedPIN starts a key URI whose token refuses the PIN.
const refusedPIN = "pkcs11:token=wrong-pin"

// unreadablePIN starts a key URI whose PIN file cannot be read.
const unreadablePIN = "pkcs11:token=no-pin-file"

func start(t *testing.T, objs ...*v1alpha1.Authority) *harness {
	t.Helper()
	return startWith(t, context.Background(), objs...)
}

// startWith runs the Manager with ctx (e.g. carrying a logger).
func startWith(t *testing.T, base context.Context, objs ...*v1alpha1.Authority) *harness {
	t.Helper()
	h := &harness{watch: watch.NewFake(), bundles: watch.NewFake(), writer: &recordingWriter{}}
	lw := &cache.ListWatch{
		ListFunc: func(metav1.ListOptions) (runtime.Object, error) {
			l := &v1alpha1.AuthorityList{}
			for _, o := range objs {
				l.Items = append(l.Items, *o)
			}
			return l, nil
		},
		WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return h.watch, nil },
	}
	inf := cache.NewSharedIndexInformer(noWatchList{lw}, &v1alpha1.Authority{}, 0, cache.Indexers{client.IndexSignerName: func(obj any) ([]string, error) {
		return []string{obj.(*v1alpha1.Authority).Spec.SignerName}, nil
	}})
	binf := bundleInformer(h.bundles, objs...)
	reg, err := backends.NewRegistry(file.New())
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(Options{Writer: h.writer, Informer: inf, Bundles: binf, Signers: []Policy{{Name: signerName, MaxLifetime: 24 * time.Hour}},
		Open: func(ctx context.Context, uri string) (backends.Signer, error) {
			h.opened.Add(1)
			if strings.HasPrefix(uri, refusedPIN) {
				// What the pkcs11 backend returns when the token refuses
				// the PIN (each attempt counts toward the token's lockout).
				h.pinRefused.Add(1)
				return nil, backends.Wrap(backends.ErrPermanent, "open", uri, "pin-source", fmt.Errorf("PIN incorrect: %w", backends.ErrLoginRefused))
			}
			if strings.HasPrefix(uri, unreadablePIN) {
				// What the pkcs11 backend returns when the PIN file is not
				// there (yet): no login was tried.
				h.pinUnreadable.Add(1)
				return nil, backends.Wrap(backends.ErrPermanent, "open", uri, "pin-source", errors.New("reading PIN file: no such file or directory"))
			}
			return reg.Open(ctx, backends.OpenRequest{URI: uri})
		}})
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	ctx, cancel := context.WithCancel(base)
	var wg sync.WaitGroup
	wg.Go(func() { inf.Run(ctx.Done()) })
	wg.Go(func() { binf.Run(ctx.Done()) })
	wg.Go(func() { _ = m.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return h
}

// bundleInformer lists the trust publisher's bundles of objs (recordOf)
// and then follows w.
func bundleInformer(w watch.Interface, objs ...*v1alpha1.Authority) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListFunc: func(metav1.ListOptions) (runtime.Object, error) {
			l := &certv1.ClusterTrustBundleList{}
			for _, o := range objs {
				for _, b := range bundlesOf(o, recordOf(o)) {
					l.Items = append(l.Items, *b)
				}
			}
			return l, nil
		},
		WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return w, nil },
	}
	return cache.NewSharedIndexInformer(noWatchList{lw}, &certv1.ClusterTrustBundle{}, 0, cache.Indexers{})
}

// recordOf is the record the trust publisher keeps when a's status phases
// are the ones it moved.
func recordOf(a *v1alpha1.Authority) *record.Record {
	r := &record.Record{Authority: a.Name, UID: a.UID, Revision: 1}
	for _, s := range a.Status.Generations {
		for _, g := range a.Spec.Generations {
			if g.Name == s.Name && s.Phase != "" {
				r.Generations = append(r.Generations, record.Entry{Name: g.Name, Phase: s.Phase, CertificateDigest: record.CertificateDigest(g)})
			}
		}
	}
	return r
}

// bundlesOf are a's canary and live bundles carrying r (their content
// does not matter here).
func bundlesOf(a *v1alpha1.Authority, r *record.Record) []*certv1.ClusterTrustBundle {
	var out []*certv1.ClusterTrustBundle
	for _, v := range []string{v1alpha1.BundleCanary, v1alpha1.BundleLive} {
		out = append(out, &certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: record.BundleName(a.Spec.SignerName, v), ResourceVersion: "1",
				Annotations: map[string]string{record.Annotation: r.Encode()}},
			Spec: certv1.ClusterTrustBundleSpec{SignerName: a.Spec.SignerName},
		})
	}
	return out
}

// modify changes the Authority as the trust publisher would: its bundles'
// record first, then the status.
func (h *harness) modify(a *v1alpha1.Authority) {
	h.record(a, recordOf(a))
	h.watch.Modify(a)
}

// record writes r on a's bundles.
func (h *harness) record(a *v1alpha1.Authority, r *record.Record) {
	for _, b := range bundlesOf(a, r) {
		h.bundles.Modify(b)
	}
}

// lead makes h's Manager the leader until the test ends.
func (h *harness) lead(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.m.Lead(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	eventually(t, "leading", func() bool { return h.m.leading.Load() })
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 5*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

type gen struct {
	name              string
	ca                testCA
	desired, observed v1alpha1.Phase
}

func authorityFor(name string, gens ...gen) *v1alpha1.Authority {
	a := &v1alpha1.Authority{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: "1"}, Spec: v1alpha1.AuthoritySpec{SignerName: signerName}}
	for _, g := range gens {
		a.Spec.Generations = append(a.Spec.Generations, v1alpha1.Generation{Name: g.name, KeyURI: g.ca.uri, CertificatePEM: g.ca.pem, Phase: g.desired})
		if g.observed != "" {
			a.Status.Generations = append(a.Status.Generations, v1alpha1.GenerationStatus{Name: g.name, Phase: g.observed})
		}
	}
	return a
}

// issuing is the generation h's signer issues with now, or "".
func (h *harness) issuing() string {
	_, g, err := h.m.Issuer(signerName).Current()
	if err != nil {
		return ""
	}
	return g
}

// A status phase the trust publisher did not move is never signed with:
// an identity that may write authorities/status (the token service's, say)
// marks a generation Active, or swaps which one is, and the signer keeps
// issuing with what the trust publisher's record on the bundles says, or
// with nothing; the record moving is what moves it.
func TestStatusActiveWithoutTheRecordIsNotSignedWith(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	published := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}, gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseStaged})
	h := start(t, published)
	eventually(t, "generation a issuing", func() bool { return h.issuing() == "a" })

	// The forger writes status only: b Active, a Retiring.
	forged := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseRetiring}, gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	forged.ResourceVersion = "2"
	h.watch.Modify(forged)
	// The record still says a: a keeps issuing (b is not signed with).
	time.Sleep(200 * time.Millisecond)
	if g := h.issuing(); g != "a" {
		t.Fatalf("issuing with %q after a forged status, want a (the record's Active)", g)
	}

	// A record with no Active at all (a fresh Authority whose status was
	// forged before the trust publisher activated anything): nothing issues,
	// and the error names the record.
	h.record(forged, &record.Record{Authority: forged.Name, Revision: 2})
	eventually(t, "nothing issuing", func() bool { return h.issuing() == "" })
	_, _, err := h.m.Issuer(signerName).Current()
	if !errors.Is(err, issuer.ErrUnavailable) || !strings.Contains(err.Error(), "says generation b is Active") || !strings.Contains(err.Error(), record.Annotation) {
		t.Fatalf("Current() = %v, want ErrUnavailable naming the status's b and the record annotation", err)
	}

	// The trust publisher's own move (record first) is followed.
	h.record(forged, recordOf(forged))
	eventually(t, "generation b issuing once the record says so", func() bool { return h.issuing() == "b" })
}

// The generation whose observed phase is Active issues; when the observed
// Active moves, the other key issues at once (no reopening), and the old
// generation can no longer reserve (so it signs nothing more).
func TestObservedActiveGenerationIssues(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	h := start(t, authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}, gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseStaged}))
	eventually(t, "generation a issuing", func() bool { return h.issuing() == "a" })
	auth, _, _ := h.m.Issuer(signerName).Current()
	if auth.Signer().Fingerprint() != a.fp {
		t.Fatal("generation a issues with another key")
	}
	if n := h.opened.Load(); n != 2 {
		t.Fatalf("opened %d keys, want 2 (a Active, b Staged)", n)
	}

	moved := authorityFor("unit", gen{"a", a, v1alpha1.PhasePromoted, v1alpha1.PhasePromoted}, gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	moved.ResourceVersion = "2"
	h.modify(moved)
	eventually(t, "generation b issuing", func() bool { return h.issuing() == "b" })
	auth, _, _ = h.m.Issuer(signerName).Current()
	if auth.Signer().Fingerprint() != b.fp {
		t.Fatal("generation b issues with another key")
	}
	if n := h.opened.Load(); n != 2 {
		t.Fatalf("opened %d keys, want still 2: activation must not reopen", n)
	}
	h.lead(t)
	if err := h.m.Issuer(signerName).Reserve(context.Background(), "a", time.Now().Add(time.Hour)); !errors.Is(err, issuer.ErrUnavailable) {
		t.Fatalf("Reserve for the old generation = %v, want ErrUnavailable", err)
	}
	if len(h.m.Keys()) != 2 {
		t.Fatalf("%d keys open, want 2 (a Promoted still kept)", len(h.m.Keys()))
	}

	retired := authorityFor("unit", gen{"a", a, v1alpha1.PhaseRetired, v1alpha1.PhaseRetired}, gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	retired.ResourceVersion = "3"
	h.modify(retired)
	eventually(t, "generation a's key closed", func() bool { return len(h.m.Keys()) == 1 })
}

// Without exactly one Authority whose observed Active generation has a
// usable key, the signer name issues nothing, and says why.
func TestNoUsableActiveGenerationIssuesNothing(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	mismatched := a
	mismatched.pem = b.pem
	cases := []struct {
		name    string
		objs    []*v1alpha1.Authority
		wantErr string
	}{
		{"no Authority names the signer", nil, "no Authority"},
		{"two Authorities name the signer", []*v1alpha1.Authority{
			authorityFor("one", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}),
			authorityFor("two", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}),
		}, "Authorities one and two"},
		{"no generation is observed Active", []*v1alpha1.Authority{
			authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseStaged}),
		}, "no generation of Authority unit is Active"},
		{"the Active generation's certificate is not for its key", []*v1alpha1.Authority{
			authorityFor("unit", gen{"a", mismatched, v1alpha1.PhaseActive, v1alpha1.PhaseActive}),
		}, "is not for key"},
		{"the Active generation's key does not open", []*v1alpha1.Authority{
			authorityFor("unit", gen{"a", testCA{uri: "file:/nonexistent/key.pem", pem: a.pem}, v1alpha1.PhaseActive, v1alpha1.PhaseActive}),
		}, "opening key file:/nonexistent/key.pem"},
		{"the Active generation's key URI carries a credential", []*v1alpha1.Authority{
			authorityFor("unit", gen{"a", testCA{uri: "awskms:key-id=k;region=eu-west-1?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1", pem: a.pem}, v1alpha1.PhaseActive, v1alpha1.PhaseActive}),
		}, "opening key awskms:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := start(t, tc.objs...)
			var err error
			eventually(t, "the cause reported", func() bool {
				_, _, err = h.m.Issuer(signerName).Current()
				return err != nil && strings.Contains(err.Error(), tc.wantErr)
			})
			if !errors.Is(err, issuer.ErrUnavailable) {
				t.Fatalf("Current = %v, want ErrUnavailable", err)
			}
			if rerr := h.m.Err(); rerr == nil || !strings.Contains(rerr.Error(), tc.wantErr) {
				t.Fatalf("Err (for /readyz) = %v, want it to say %q", rerr, tc.wantErr)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "AKIDLEAKED") {
				t.Fatalf("Current = %v shows a credential", err)
			}
		})
	}
}

// A burst of 10,000 concurrent signatures makes one reservation write,
// not one per request; the reservation covers every leaf of the burst.
func TestBurstMakesOneReservationWrite(t *testing.T) {
	a := newTestCA(t, "a")
	h := start(t, authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}))
	eventually(t, "generation a issuing", func() bool { return h.issuing() == "a" })
	h.lead(t)
	eventually(t, "keyCheck written", func() bool { return h.writer.count() == 1 })
	h.writer.delay = 20 * time.Millisecond // the write takes a while: the burst waits on it

	iss := h.m.Issuer(signerName)
	var wg sync.WaitGroup
	var failed atomic.Int32
	latest := time.Now().Add(24 * time.Hour)
	for range 10000 {
		wg.Go(func() {
			if err := iss.Reserve(context.Background(), "a", time.Now().Add(24*time.Hour)); err != nil {
				failed.Add(1)
			}
		})
	}
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Fatalf("%d reservations failed", n)
	}
	if n := h.writer.count() - 1; n != 1 {
		t.Fatalf("%d reservation writes for a burst of 10000, want 1", n)
	}
	last := h.writer.last["generations"].([]map[string]any)[0]["lastIssuedNotAfter"].(metav1.Time)
	if last.Time.Before(latest.Add(ReservationMargin - time.Second)) {
		t.Fatalf("lastIssuedNotAfter %s does not cover the burst's leaves (until %s)", last.Time, latest)
	}
}

// A reservation that cannot be written is an error, so nothing is signed;
// a signer that does not lead never writes.
func TestFailedReservationSignsNothing(t *testing.T) {
	a := newTestCA(t, "a")
	h := start(t, authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}))
	eventually(t, "generation a issuing", func() bool { return h.issuing() == "a" })
	iss := h.m.Issuer(signerName)
	if err := iss.Reserve(context.Background(), "a", time.Now().Add(time.Hour)); !errors.Is(err, issuer.ErrUnavailable) || h.writer.count() != 0 {
		t.Fatalf("Reserve while standing by = %v after %d writes, want ErrUnavailable and no write", err, h.writer.count())
	}
	h.lead(t)
	eventually(t, "keyCheck written", func() bool { return h.writer.count() == 1 })
	h.writer.mu.Lock()
	h.writer.fail = errors.New("apiserver unavailable")
	h.writer.mu.Unlock()
	if err := iss.Reserve(context.Background(), "a", time.Now().Add(time.Hour)); !errors.Is(err, issuer.ErrUnavailable) {
		t.Fatalf("Reserve with a failing write = %v, want ErrUnavailable", err)
	}
	h.writer.mu.Lock()
	h.writer.fail = nil
	h.writer.mu.Unlock()
	if err := iss.Reserve(context.Background(), "a", time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("Reserve once the apiserver answers: %v", err)
	}
}

// keyCheck is written when it changes, not on every resync, and names
// both the certificate and the key when they do not match.
func TestKeyCheckIsWrittenWhenItChanges(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	obj := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	h := start(t, obj)
	h.lead(t)
	eventually(t, "keyCheck written", func() bool { return h.writer.count() == 1 })
	for i := range 5 {
		again := obj.DeepCopy()
		again.ResourceVersion = string(rune('2' + i))
		h.modify(again)
	}
	// The handler runs the same way for every event: wait for a change
	// that must be written, then count.
	bad := authorityFor("unit", gen{"a", testCA{uri: a.uri, pem: b.pem}, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	bad.ResourceVersion = "9"
	h.modify(bad)
	eventually(t, "the mismatch written", func() bool { return h.writer.count() >= 2 })
	if n := h.writer.count(); n != 2 {
		t.Fatalf("%d keyCheck writes, want 2 (one per change, none per resync)", n)
	}
	h.writer.mu.Lock()
	kc := h.writer.last["generations"].([]map[string]any)[0]["keyCheck"].(v1alpha1.KeyCheck)
	h.writer.mu.Unlock()
	if kc.Ready || !strings.Contains(kc.Message, `CN=b`) || !strings.Contains(kc.Message, a.uri) {
		t.Fatalf("keyCheck = %+v, want not ready, naming certificate b and key %s", kc, a.uri)
	}
}

// A generation removed from spec (after Retired) keeps, in status, only
// the signer's lastIssuedNotAfter: the trust publisher has dropped its
// fields. The signer must not apply that entry again, or it stays forever
// (server-side apply keeps a list item some manager still owns) and one
// orphan per rotation fills status.generations up to its 8 items, after
// which every status write — reservations included — is refused.
func TestRemovedGenerationIsNotWrittenBack(t *testing.T) {
	b := newTestCA(t, "b")
	obj := authorityFor("unit", gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	obj.Status.Generations = append(obj.Status.Generations, v1alpha1.GenerationStatus{Name: "a", LastIssuedNotAfter: &old})
	h := start(t, obj)
	eventually(t, "generation b issuing", func() bool { return h.issuing() == "b" })
	h.lead(t)
	eventually(t, "keyCheck written", func() bool { return h.writer.count() == 1 })
	if err := h.m.Issuer(signerName).Reserve(context.Background(), "b", time.Now().Add(time.Hour)); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	h.writer.mu.Lock()
	body := h.writer.last["generations"].([]map[string]any)
	h.writer.mu.Unlock()
	for _, e := range body {
		if e["name"] == "a" {
			t.Fatalf("status apply %v carries generation a, which spec no longer lists", body)
		}
	}
}

// A generation name used again after the old generation was removed from
// spec starts without a reservation: a replica that saw the old
// generation's lastIssuedNotAfter, then takes over the lead, records the
// new generation's first leaf instead of taking it as covered.
func TestReusedGenerationNameReservesAgain(t *testing.T) {
	a, a2, b := newTestCA(t, "a"), newTestCA(t, "a2"), newTestCA(t, "b")
	first := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	old := metav1.NewTime(time.Now().Add(2 * time.Hour).Truncate(time.Second))
	first.Status.Generations[0].LastIssuedNotAfter = &old // the other replica's reservation
	h := start(t, first)
	eventually(t, "generation a issuing", func() bool { return h.issuing() == "a" })
	iss := h.m.Issuer(signerName)

	// a retired and removed from spec (its status entry gone), b Active;
	// then a new generation named a again becomes Active, and the other
	// replica (still leading) has reported its key: status has no
	// reservation for it.
	gone := authorityFor("unit", gen{"b", b, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	gone.ResourceVersion = "2"
	h.modify(gone)
	eventually(t, "generation b issuing", func() bool { return h.issuing() == "b" })
	reused := authorityFor("unit", gen{"b", b, v1alpha1.PhasePromoted, v1alpha1.PhasePromoted}, gen{"a", a2, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	reused.ResourceVersion = "3"
	h.modify(reused)
	var auth *authority.Authority
	eventually(t, "the new generation a issuing", func() bool {
		x, g, err := iss.Current()
		auth = x
		return err == nil && g == "a" && x.Signer().Fingerprint() == a2.fp
	})
	reported := reused.DeepCopy()
	reported.ResourceVersion = "4"
	for _, k := range h.m.Keys() {
		for j := range reported.Status.Generations {
			g := &reported.Status.Generations[j]
			if (g.Name == "a") == (k.Fingerprint() == auth.Signer().Fingerprint()) {
				g.KeyCheck = &v1alpha1.KeyCheck{Ready: true, KeyVersion: k.KeyVersion()}
			}
		}
	}
	h.modify(reported)
	eventually(t, "the reported keyCheck cached", func() bool {
		obj, ok, _ := h.m.opts.Informer.GetIndexer().GetByKey("unit")
		return ok && obj.(*v1alpha1.Authority).ResourceVersion == "4"
	})

	h.lead(t)
	before := h.writer.count()
	want := time.Now().Add(30 * time.Minute)
	if err := iss.Reserve(context.Background(), "a", want); err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if h.writer.count() == before {
		t.Fatal("Reserve for the new generation a returned nil and wrote nothing: status records no lastIssuedNotAfter for it, so its leaf outlives every reservation")
	}
}

// defaultLog collects what is logged at default verbosity.
type defaultLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *defaultLog) context() context.Context {
	logger := funcr.New(func(prefix, args string) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lines = append(l.lines, args)
	}, funcr.Options{Verbosity: 0})
	return klog.NewContext(context.Background(), logger)
}

func (l *defaultLog) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			n++
		}
	}
	return n
}

// A leader that may not write the Authority's status (RBAC without
// authorities/status patch) says so at default verbosity, once, naming the
// apiserver's refusal: without its keyCheck the trust publisher never
// activates a generation, and the only other line says "the trust
// publisher activates one".
func TestRefusedStatusWriteIsLoggedOnce(t *testing.T) {
	a := newTestCA(t, "a")
	var log defaultLog
	h := startWith(t, log.context(), authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseStaged}))
	eventually(t, "generation a's key checked", func() bool { return len(h.m.Keys()) == 1 })
	h.writer.mu.Lock()
	h.writer.fail = apierrors.NewForbidden(schema.GroupResource{Group: "keyward.dev", Resource: "authorities/status"}, "unit", errors.New("RBAC: access denied"))
	h.writer.mu.Unlock()
	h.lead(t)
	eventually(t, "three refused writes", func() bool { return h.writer.count() >= 3 })
	if n := log.count("authorities/status"); n != 1 {
		t.Fatalf("the refused status write is logged %d times at default verbosity, want once; log:\n%s", n, strings.Join(log.lines, "\n"))
	}
}

// A key whose token refused the PIN is not opened again by itself: each
// attempt is a failed login the HSM counts toward locking the PIN (often
// after 3 to 10), and every Authority event used to retry it. It is
// opened again when the generation's key URI changes.
func TestRefusedPINIsNotRetried(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	bad := testCA{uri: refusedPIN + ";object=b?pin-source=file:/etc/pin", pem: b.pem}
	obj := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}, gen{"b", bad, v1alpha1.PhaseStaged, ""})
	h := start(t, obj)
	eventually(t, "b's key tried", func() bool { return h.pinRefused.Load() >= 1 })
	// Events that change nothing about b (the trust publisher's and the
	// signer's own status writes), then one the test can wait for.
	for i := range 5 {
		again := obj.DeepCopy()
		again.ResourceVersion = fmt.Sprint(10 + i)
		h.modify(again)
	}
	c := newTestCA(t, "c")
	more := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}, gen{"b", bad, v1alpha1.PhaseStaged, ""}, gen{"c", c, v1alpha1.PhaseStaged, ""})
	more.ResourceVersion = "20"
	h.modify(more)
	eventually(t, "c's key open", func() bool { return len(h.m.Keys()) == 2 })
	if n := h.pinRefused.Load(); n != 1 {
		t.Fatalf("the refused PIN was tried %d times, want once", n)
	}
	// A new key URI is a new attempt.
	fixed := more.DeepCopy()
	fixed.ResourceVersion = "21"
	fixed.Spec.Generations[1].KeyURI = refusedPIN + ";object=b?pin-source=file:/etc/other-pin"
	h.modify(fixed)
	eventually(t, "the new key URI tried", func() bool { return h.pinRefused.Load() == 2 })
}

// A PIN file that cannot be read (a Secret not mounted yet) cost no login:
// the key is tried again like any other that failed to open, and its
// keyCheck does not tell the operator to restart the signer.
func TestUnreadablePINFileIsRetried(t *testing.T) {
	a, b := newTestCA(t, "a"), newTestCA(t, "b")
	bad := testCA{uri: unreadablePIN + ";object=b?pin-source=file:/etc/pin", pem: b.pem}
	obj := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive}, gen{"b", bad, v1alpha1.PhaseStaged, ""})
	h := start(t, obj)
	h.lead(t)
	eventually(t, "b's key tried", func() bool { return h.pinUnreadable.Load() >= 1 })
	again := obj.DeepCopy()
	again.ResourceVersion = "10"
	h.modify(again)
	eventually(t, "b's key tried again", func() bool { return h.pinUnreadable.Load() >= 2 })
	eventually(t, "keyCheck written", func() bool { return h.writer.count() >= 1 })
	h.writer.mu.Lock()
	kc := h.writer.last["generations"].([]map[string]any)[1]["keyCheck"].(v1alpha1.KeyCheck)
	h.writer.mu.Unlock()
	if kc.Ready || !strings.Contains(kc.Message, "reading PIN file") || strings.Contains(kc.Message, "restart the signer") {
		t.Fatalf("keyCheck for an unreadable PIN file = %+v, want not ready, naming the PIN file, and no advice to restart (no login was refused)", kc)
	}
}

// A cluster without the Authority CRD answers every list 404: the signer
// says so once at default verbosity, /readyz (Err) names the CRD, and both
// clear once a list succeeds.
func TestMissingAuthorityCRDIsSaidOnce(t *testing.T) {
	var served atomic.Bool
	var lists atomic.Int32
	a := newTestCA(t, "a")
	obj := authorityFor("unit", gen{"a", a, v1alpha1.PhaseActive, v1alpha1.PhaseActive})
	lw := &cache.ListWatch{
		ListFunc: func(metav1.ListOptions) (runtime.Object, error) {
			lists.Add(1)
			if !served.Load() {
				return nil, apierrors.NewNotFound(schema.GroupResource{Group: "keyward.dev", Resource: "authorities"}, "")
			}
			return &v1alpha1.AuthorityList{Items: []v1alpha1.Authority{*obj}}, nil
		},
		WatchFunc: func(metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}
	inf := cache.NewSharedIndexInformer(noWatchList{lw}, &v1alpha1.Authority{}, 0, cache.Indexers{client.IndexSignerName: func(obj any) ([]string, error) {
		return []string{obj.(*v1alpha1.Authority).Spec.SignerName}, nil
	}})
	reg, err := backends.NewRegistry(file.New())
	if err != nil {
		t.Fatal(err)
	}
	binf := bundleInformer(watch.NewFake(), obj)
	m, err := New(Options{Writer: &recordingWriter{}, Informer: inf, Bundles: binf, Signers: []Policy{{Name: signerName, MaxLifetime: 24 * time.Hour}},
		Open: func(ctx context.Context, uri string) (backends.Signer, error) {
			return reg.Open(ctx, backends.OpenRequest{URI: uri})
		}})
	if err != nil {
		t.Fatal(err)
	}
	var log defaultLog
	ctx, cancel := context.WithCancel(log.context())
	var wg sync.WaitGroup
	wg.Go(func() { inf.RunWithContext(ctx) })
	wg.Go(func() { binf.RunWithContext(ctx) })
	wg.Go(func() { _ = m.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })

	eventually(t, "two refused lists", func() bool { return lists.Load() >= 2 })
	if err := m.Err(); !errors.Is(err, ErrNoAuthorityAPI) {
		t.Fatalf("Err() = %v, want ErrNoAuthorityAPI", err)
	}
	if n := log.count("authorities.keyward.dev"); n != 1 {
		t.Fatalf("the missing CRD is logged %d times, want once; log:\n%s", n, strings.Join(log.lines, "\n"))
	}
	served.Store(true)
	eventually(t, "the Active generation issues once the CRD is served", func() bool { return m.Err() == nil })
}
