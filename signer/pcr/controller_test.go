package pcr

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"github.com/keyward/keyward/internal/workers"
	"github.com/keyward/keyward/kubeclient"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/profile"
	"github.com/keyward/keyward/testsupport/testca"
	"github.com/prometheus/client_golang/prometheus"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
)

func testSigner(t *testing.T) (*Signer, *testca.CountingSigner) {
	t.Helper()
	auth, counting := testca.New(t)
	prof, _ := profile.New(config.Signer{Profile: config.ProfileSPIFFE, SPIFFE: &config.SPIFFE{TrustDomain: "td"}})
	return &Signer{Name: "keyward.dev/unit", Issuer: issuer.Static{Authority: auth}, Profile: prof,
		AllowedKeyTypes: config.AllKeyTypes(), MaxLifetime: 24 * time.Hour, RefreshPoint: 0.5, Backdate: 2 * time.Minute}, counting
}

func testPCR(t *testing.T, signerName string) *certv1.PodCertificateRequest {
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	p, err := nodehelper.NewPodCertificateRequest(nodehelper.PodRef{Namespace: "ns", Name: "pod", UID: "pod-uid",
		ServiceAccountName: "sa", ServiceAccountUID: "sa-uid", NodeName: "node", NodeUID: "node-uid"}, signerName, key, nodehelper.PodCertificateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.Name, p.GenerateName, p.UID = "pcr-1", "", "pcr-uid"
	return p
}

// A status write that loses a conflict is retried with the certificate
// already signed for that PCR UID: the CA key signs once.
func TestConflictRetryReusesTheSignedCertificate(t *testing.T) {
	s, counting := testSigner(t)
	p := testPCR(t, s.Name)
	client := fake.NewClientset(p)
	var writes []*certv1.PodCertificateRequest
	client.PrependReactor("update", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		obj := a.(k8stesting.UpdateAction).GetObject().(*certv1.PodCertificateRequest)
		writes = append(writes, obj)
		if len(writes) == 1 {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "podcertificaterequests"}, p.Name, nil)
		}
		return false, nil, nil
	})
	c := unitController(t, client, s, p)
	key := queueKey{signer: s.Name, namespace: p.Namespace, name: p.Name}

	if _, err := c.sync(context.Background(), key); !apierrors.IsConflict(err) {
		t.Fatalf("first sync: got %v, want the conflict to be returned for a retry", err)
	}
	if _, err := c.sync(context.Background(), key); err != nil {
		t.Fatalf("retry: %v", err)
	}
	if len(writes) != 2 {
		t.Fatalf("%d status writes, want 2", len(writes))
	}
	if writes[0].Status.CertificateChain != writes[1].Status.CertificateChain {
		t.Error("the retry wrote a different certificate")
	}
	if n := counting.Signatures(); n != 1 {
		t.Errorf("the CA key signed %d times, want once", n)
	}
	if rec := c.records.get(p.UID, time.Now()); rec.cert != nil || !rec.written {
		t.Errorf("record after the write succeeded: cert kept %v, written %v; want no cert, written", rec.cert != nil, rec.written)
	}
}

// unitController is a controller of signer s on client whose informer
// (never started) holds p, and p queued as the informer's handler would.
func unitController(t *testing.T, client *fake.Clientset, s *Signer, p *certv1.PodCertificateRequest) *Controller {
	t.Helper()
	metrics, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Client: client, Signers: []*Signer{s}, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	inf := prepareInformer(c, s.Name)
	if err := inf.GetIndexer().Add(p); err != nil {
		t.Fatal(err)
	}
	c.enqueue(s.Name, p)
	return c
}

// beginRefreshAt is kept 10 minutes inside both ends of the validity.
func TestRefreshIsClampedTenMinutesFromEitherEnd(t *testing.T) {
	s, _ := testSigner(t)
	c := &Controller{opts: Options{Clock: clock.RealClock{}}}
	for _, tc := range []struct {
		point float64
		want  time.Duration
	}{{0.01, 10 * time.Minute}, {0.5, 30 * time.Minute}, {0.99, 50 * time.Minute}} {
		s.RefreshPoint = tc.point
		leaf := signLeaf(t, s, time.Hour)
		st := c.issuedStatus(&signerState{Signer: s}, leaf)
		if got := st.beginRefreshAt.Sub(leaf.leaf.NotBefore); got != tc.want {
			t.Errorf("refresh point %v of 1h: beginRefreshAt at +%s, want +%s", tc.point, got, tc.want)
		}
		if !st.notBefore.Time.Equal(leaf.leaf.NotBefore) || !st.notAfter.Time.Equal(leaf.leaf.NotAfter) {
			t.Error("status times differ from the leaf's")
		}
	}
}

func signLeaf(t *testing.T, s *Signer, lifetime time.Duration) *issuedCert {
	t.Helper()
	k, _ := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	leaf, err := authorityOf(s).Sign(context.Background(), &x509.Certificate{}, k.Public(), authority.Policy{Lifetime: lifetime, Backdate: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return &issuedCert{leaf: leaf}
}

// failingKey fails every signature with err.
type failingKey struct {
	backends.Signer
	err error
}

func (f failingKey) SignContext(context.Context, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, f.err
}
func (f failingKey) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) { return nil, f.err }

// syncOnce runs one sync of p against a fake clientset for a signer whose
// key fails with keyErr, and returns the PCR as written and the sync error.
func syncOnce(t *testing.T, keyErr error, failAfter time.Duration, created time.Time) (*certv1.PodCertificateRequest, error) {
	t.Helper()
	s, _ := testSigner(t)
	auth, err := authority.New(authorityOf(s).Certificate(), nil, failingKey{Signer: authorityOf(s).Signer(), err: keyErr})
	if err != nil {
		t.Fatal(err)
	}
	s.Issuer = issuer.Static{Authority: auth}
	p := testPCR(t, s.Name)
	p.CreationTimestamp = metav1.NewTime(created)
	client := fake.NewClientset(p)
	metrics, _ := NewMetrics(prometheus.NewRegistry())
	c, err := New(Options{Client: client, Signers: []*Signer{s}, Metrics: metrics, FailAfter: failAfter})
	if err != nil {
		t.Fatal(err)
	}
	inf := prepareInformer(c, s.Name)
	_ = inf.GetIndexer().Add(p)
	c.enqueue(s.Name, p)
	_, syncErr := c.sync(context.Background(), queueKey{signer: s.Name, namespace: p.Namespace, name: p.Name})
	got, err := client.CertificatesV1().PodCertificateRequests(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got, syncErr
}

func TestBackendErrorsBecomeRetriesOrFailures(t *testing.T) {
	outage := &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	disabled := &backends.Error{Kind: backends.ErrPermanent, Op: "sign", Err: io.ErrClosedPipe}
	cases := []struct {
		name       string
		err        error
		failAfter  time.Duration
		age        time.Duration
		wantRetry  bool
		wantReason string
	}{
		{name: "a transient error is retried, never Failed by default", err: outage, age: time.Hour, wantRetry: true},
		{name: "the first transient error of an old request is retried: failAfter counts the outage, not the request's age", err: outage, failAfter: 10 * time.Minute, age: 11 * time.Minute, wantRetry: true},
		{name: "a permanent error is Failed BackendFailure", err: disabled, age: time.Second, wantReason: ReasonBackendFailure},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := syncOnce(t, tc.err, tc.failAfter, time.Now().Add(-tc.age))
			if tc.wantRetry {
				if err == nil || len(got.Status.Conditions) != 0 {
					t.Fatalf("got err=%v status=%+v, want a retry and no status", err, got.Status)
				}
				return
			}
			if err != nil {
				t.Fatalf("sync: %v", err)
			}
			if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != "Failed" || got.Status.Conditions[0].Reason != tc.wantReason {
				t.Fatalf("status %+v, want Failed/%s", got.Status.Conditions, tc.wantReason)
			}
			if got.Status.CertificateChain != "" || got.Status.NotBefore != nil {
				t.Error("a Failed status carries certificate fields")
			}
		})
	}
}

// flakyKey fails its first `failures` signatures with a transient error.
type flakyKey struct {
	backends.Signer
	failures int32
	calls    atomic.Int32
}

func (f *flakyKey) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	if f.calls.Add(1) <= f.failures {
		return nil, &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	}
	return f.Signer.SignContext(ctx, d, o)
}

func (f *flakyKey) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return f.SignContext(context.Background(), d, o)
}

// A request admitted by the rate limits keeps its place while the backend
// is down: retries take no new token, so a limit in deny mode does not turn
// an outage into RateLimited denials.
func TestRetriesAfterABackendErrorTakeNoNewRateToken(t *testing.T) {
	s, _ := testSigner(t)
	flaky := &flakyKey{Signer: authorityOf(s).Signer(), failures: 2}
	auth, err := authority.New(authorityOf(s).Certificate(), nil, flaky)
	if err != nil {
		t.Fatal(err)
	}
	s.Issuer = issuer.Static{Authority: auth}
	s.PerNode = &config.Rate{QPS: 0.001, Burst: 1} // one token, the next in ~17 minutes
	s.DenyOnLimit = true
	p := testPCR(t, s.Name)
	client := fake.NewClientset(p)
	metrics, _ := NewMetrics(prometheus.NewRegistry())
	c, err := New(Options{Client: client, Signers: []*Signer{s}, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	inf := prepareInformer(c, s.Name)
	_ = inf.GetIndexer().Add(p)
	c.enqueue(s.Name, p)
	key := queueKey{signer: s.Name, namespace: p.Namespace, name: p.Name}
	for i := range 2 {
		if _, err := c.sync(context.Background(), key); !backends.IsTransient(err) {
			t.Fatalf("sync %d during the outage: got %v, want the transient error back for a retry", i+1, err)
		}
	}
	if _, err := c.sync(context.Background(), key); err != nil {
		t.Fatalf("sync after the outage: %v", err)
	}
	got, err := client.CertificatesV1().PodCertificateRequests(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != "Issued" {
		t.Fatalf("conditions %+v, want Issued", got.Status.Conditions)
	}

	// The node's one token is spent: a second request from it is denied.
	p2 := testPCR(t, s.Name)
	p2.Name, p2.UID = "pcr-2", "pcr-uid-2"
	if _, err := client.CertificatesV1().PodCertificateRequests(p2.Namespace).Create(context.Background(), p2, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_ = inf.GetIndexer().Add(p2)
	c.enqueue(s.Name, p2)
	if _, err := c.sync(context.Background(), queueKey{signer: s.Name, namespace: p2.Namespace, name: p2.Name}); err != nil {
		t.Fatal(err)
	}
	got2, _ := client.CertificatesV1().PodCertificateRequests(p2.Namespace).Get(context.Background(), p2.Name, metav1.GetOptions{})
	if len(got2.Status.Conditions) != 1 || got2.Status.Conditions[0].Reason != ReasonRateLimited {
		t.Fatalf("second request: conditions %+v, want Denied/%s", got2.Status.Conditions, ReasonRateLimited)
	}
}

// The per-node buckets stay bounded: quiet nodes' full buckets are dropped,
// a node that just spent its token keeps its drained bucket.
func TestRateBucketsStayBounded(t *testing.T) {
	l := newLimiters(&config.Rate{QPS: 1, Burst: 1}, nil)
	now := time.Now()
	var last time.Time
	for i := range 2 * maxBuckets {
		last = now.Add(time.Duration(i) * time.Millisecond) // 8 s in all: old buckets refill
		if wait := l.reserve(fmt.Sprintf("node-%d", i), "ns", last); wait != 0 {
			t.Fatalf("node-%d's first request waits %s", i, wait)
		}
	}
	if n := len(l.nodes); n > maxBuckets {
		t.Fatalf("%d node buckets, want at most %d", n, maxBuckets)
	}

	// A full map of drained buckets, all spent at one instant: adding a key
	// prunes, drops none of them, and their nodes still have to wait.
	l = newLimiters(&config.Rate{QPS: 1, Burst: 1}, nil)
	for i := range maxBuckets {
		l.reserve(fmt.Sprintf("busy-%d", i), "ns", now)
	}
	l.reserve("newcomer", "ns", now)
	if n := len(l.nodes); n != maxBuckets+1 {
		t.Fatalf("%d node buckets after pruning drained ones, want %d", n, maxBuckets+1)
	}
	if wait := l.reserve("busy-0", "ns", now); wait == 0 {
		t.Fatal("busy-0 got a second token at once: its drained bucket was dropped")
	}
}

// authorityOf is the authority s's static Issuer holds.
func authorityOf(s *Signer) *authority.Authority {
	a, _, _ := s.Issuer.Current()
	return a
}

// prepareInformer gives c a never-started informer for signer name, whose
// store the test fills by hand.
func prepareInformer(c *Controller, name string) cache.SharedIndexInformer {
	inf := cache.NewSharedIndexInformer(nil, &certv1.PodCertificateRequest{}, 0, cache.Indexers{})
	c.informers = workers.Prepared(map[string]cache.SharedIndexInformer{name: inf})
	return inf
}

// gateFence is a Fence that is open or shut on demand.
type gateFence struct{ open atomic.Bool }

func (f *gateFence) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if !f.open.Load() {
		return ctx, func() {}, kubeclient.ErrFenced
	}
	return ctx, func() {}, nil
}
func (f *gateFence) Open() bool { return f.open.Load() }

// A request that meets a shut fence is neither signed nor written nor
// looked at again and again: it is parked, and handed back to the queue
// once the fence opens.
func TestAShutFenceParksTheRequestUntilItOpens(t *testing.T) {
	s, counting := testSigner(t)
	p := testPCR(t, s.Name)
	client := fake.NewClientset(p)
	c := unitController(t, client, s, p)
	fence := &gateFence{}
	c.opts.Fence = fence
	key, _ := c.queue.Get() // the handler's add
	c.queue.Done(key)

	after, err := c.sync(context.Background(), key)
	if err != nil || after != 0 {
		t.Fatalf("sync at a shut fence = %s, %v; want 0, nil (parked)", after, err)
	}
	if c.parked.Len() != 1 || c.queue.Len() != 0 || counting.Signatures() != 0 || len(client.Actions()) != 0 {
		t.Fatalf("parked %d, queued %d, signatures %d, API calls %d; want 1, 0, 0, 0",
			c.parked.Len(), c.queue.Len(), counting.Signatures(), len(client.Actions()))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go c.parked.Release(ctx, fence.Open, c.queue.Add)
	time.Sleep(5 * workers.ParkPoll)
	if c.queue.Len() != 0 {
		t.Fatal("released while the fence is shut")
	}
	fence.open.Store(true)
	got, _ := c.queue.Get() // blocks until released
	c.queue.Done(got)
	if got != key {
		t.Fatalf("released %v, want %v", got, key)
	}
	if _, err := c.sync(context.Background(), got); err != nil {
		t.Fatal(err)
	}
	if counting.Signatures() != 1 {
		t.Fatalf("signatures %d once open, want 1", counting.Signatures())
	}
}
