package pcr

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/internal/workers"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/profile"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	clocktesting "k8s.io/utils/clock/testing"
)

// scriptedKey counts signatures and fails them with err while it is set.
type scriptedKey struct {
	backends.Signer
	calls atomic.Int32
	mu    sync.Mutex
	err   error
}

func (k *scriptedKey) setErr(err error) {
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
}

func (k *scriptedKey) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	k.calls.Add(1)
	k.mu.Lock()
	err := k.err
	k.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return k.Signer.SignContext(ctx, d, o)
}

func (k *scriptedKey) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), d, o)
}

// fakePermissions blocks a name once the apiserver refused a write for it.
type fakePermissions struct {
	mu      sync.Mutex
	blocked map[string]error
	refused int
}

func (f *fakePermissions) Blocked(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.blocked[name]
}

func (f *fakePermissions) Refused(_ context.Context, name, detail string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.refused++
	if f.blocked == nil {
		f.blocked = map[string]error{}
	}
	f.blocked[name] = errors.New(detail)
}

// harness is one controller over a fake clientset whose status writes a
// test can answer, a CA key that counts signatures and a fake clock.
type harness struct {
	t       *testing.T
	c       *Controller
	client  *fake.Clientset
	key     *scriptedKey
	clock   *clocktesting.FakeClock
	signer  *Signer
	perms   *fakePermissions
	metrics *Metrics
	rec     *record.FakeRecorder
	// answer, if set, answers status writes (nil: let the fake store it).
	answer func(n int, p *certv1.PodCertificateRequest) error
	writes int
}

func newHarness(t *testing.T, mutate func(*Options)) *harness {
	t.Helper()
	s, _ := testSigner(t)
	h := &harness{t: t, clock: clocktesting.NewFakeClock(time.Now()), perms: &fakePermissions{}, rec: record.NewFakeRecorder(1000)}
	h.key = &scriptedKey{Signer: authorityOf(s).Signer()}
	auth, err := authority.New(authorityOf(s).Certificate(), nil, h.key)
	if err != nil {
		t.Fatal(err)
	}
	s.Issuer = issuer.Static{Authority: auth}
	h.signer = s
	h.client = fake.NewClientset()
	h.client.PrependReactor("update", "podcertificaterequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "status" {
			return false, nil, nil
		}
		h.writes++
		if h.answer == nil {
			return false, nil, nil
		}
		if err := h.answer(h.writes, a.(k8stesting.UpdateAction).GetObject().(*certv1.PodCertificateRequest)); err != nil {
			return true, nil, err
		}
		return false, nil, nil
	})
	h.metrics, _ = NewMetrics(prometheus.NewRegistry())
	opts := Options{Client: h.client, Signers: []*Signer{s}, Metrics: h.metrics, Clock: h.clock, Permissions: h.perms,
		Recorder: h.rec, EventPolicy: EventPolicy{Issued: true}}
	if mutate != nil {
		mutate(&opts)
	}
	h.c, err = New(opts)
	if err != nil {
		t.Fatal(err)
	}
	prepareInformer(h.c, s.Name)
	return h
}

// add puts p in the apiserver and the informer's cache.
func (h *harness) add(p *certv1.PodCertificateRequest) queueKey {
	h.t.Helper()
	if _, err := h.client.CertificatesV1().PodCertificateRequests(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		h.t.Fatal(err)
	}
	if err := h.c.informers.Get(h.signer.Name).GetIndexer().Add(p); err != nil {
		h.t.Fatal(err)
	}
	h.c.enqueue(h.signer.Name, p) // as the informer's handler does
	return queueKey{signer: h.signer.Name, namespace: p.Namespace, name: p.Name}
}

func (h *harness) sync(k queueKey) (time.Duration, error) {
	return h.c.sync(context.Background(), k)
}

func (h *harness) get(k queueKey) *certv1.PodCertificateRequest {
	h.t.Helper()
	p, err := h.client.CertificatesV1().PodCertificateRequests(k.namespace).Get(context.Background(), k.name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

var pcrResource = schema.GroupResource{Group: "certificates.k8s.io", Resource: "podcertificaterequests"}

// invalid is a 422 as kube-apiserver's status validation returns it.
func invalid(errs ...*field.Error) error {
	return apierrors.NewInvalid(schema.GroupKind{Group: "certificates.k8s.io", Kind: "PodCertificateRequest"}, "pcr-1", errs)
}

var (
	errNoSign = invalid(field.Forbidden(field.NewPath("spec", "signerName"),
		`User "system:serviceaccount:keyward:keyward-signer" is not permitted to "sign" for signer "keyward.dev/unit"`))
	errNotBeforeWindow = invalid(field.Invalid(field.NewPath("status", "notBefore"), "2026-01-01T00:00:00Z",
		"must be set to within 5 minutes of kube-apiserver's current time"))
	errImmutable = invalid(field.Invalid(field.NewPath("status"), field.OmitValueType{},
		"immutable after PodCertificateRequest is issued, denied, or failed"))
	errChainRefused = invalid(field.Invalid(field.NewPath("status", "certificateChain"), "…",
		"leaf certificate was not issued to the requested public key"))
)

func condOf(p *certv1.PodCertificateRequest) (string, string) {
	if len(p.Status.Conditions) != 1 {
		return "", ""
	}
	return p.Status.Conditions[0].Type, p.Status.Conditions[0].Reason
}

// A missing `sign` grant comes back as a 422 from status validation. It
// must cost one signature for the request that found it and none for any
// other request, however often they are retried.
func TestMissingSignPermissionSignsNoMore(t *testing.T) {
	h := newHarness(t, nil)
	h.answer = func(int, *certv1.PodCertificateRequest) error { return errNoSign }
	k1 := h.add(testPCR(t, h.signer.Name))
	wait, err := h.sync(k1)
	if err != nil || wait != permissionWait {
		t.Fatalf("sync refused for lack of sign: got (%v, %v), want a wait of %v and no error", wait, err, permissionWait)
	}
	if h.perms.refused != 1 {
		t.Fatalf("Permissions told of %d refusals, want 1", h.perms.refused)
	}
	p2 := testPCR(t, h.signer.Name)
	p2.Name, p2.UID = "pcr-2", "pcr-uid-2"
	k2 := h.add(p2)
	for range 20 {
		for _, k := range []queueKey{k1, k2} {
			if wait, err := h.sync(k); err != nil || wait != permissionWait {
				t.Fatalf("retry while blocked: got (%v, %v), want a wait and no error", wait, err)
			}
		}
	}
	if n := h.key.calls.Load(); n != 1 {
		t.Fatalf("the CA key signed %d times, want 1 (the first request, before the refusal was known)", n)
	}
	if got := counterValue(h.metrics.StatusRejected.WithLabelValues(h.signer.Name, "noPermission")); got != 1 {
		t.Errorf("keyward_pcr_status_rejected_total{result=noPermission} = %v, want 1", got)
	}

	// The grant is added: the first request is written with the
	// certificate already signed; the second is signed once.
	h.answer = nil
	h.perms.blocked = nil
	for _, k := range []queueKey{k1, k2} {
		if _, err := h.sync(k); err != nil {
			t.Fatal(err)
		}
		if typ, _ := condOf(h.get(k)); typ != "Issued" {
			t.Fatalf("%s after the grant: %q, want Issued", k.name, typ)
		}
	}
	if n := h.key.calls.Load(); n != 2 {
		t.Fatalf("the CA key signed %d times for two requests, want 2", n)
	}
}

func TestStatusRefusalsAreNeverSignedInALoop(t *testing.T) {
	cases := []struct {
		name       string
		answers    []error // answer to write n (1-based); nil afterwards
		wantSigns  int32
		wantType   string
		wantReason string
	}{
		{name: "any other refusal of the Issued status is Failed StatusRejected without signing again",
			answers: []error{errChainRefused}, wantSigns: 1, wantType: "Failed", wantReason: ReasonStatusRejected},
		{name: "a conflict is written again with the same certificate",
			answers: []error{apierrors.NewConflict(pcrResource, "pcr-1", nil)}, wantSigns: 1, wantType: "Issued", wantReason: ReasonIssued},
		{name: "a server error is written again with the same certificate",
			answers: []error{apierrors.NewInternalError(errors.New("etcd")), apierrors.NewTooManyRequests("slow down", 1)}, wantSigns: 1, wantType: "Issued", wantReason: ReasonIssued},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil)
			h.answer = func(n int, _ *certv1.PodCertificateRequest) error {
				if n <= len(tc.answers) {
					return tc.answers[n-1]
				}
				return nil
			}
			k := h.add(testPCR(t, h.signer.Name))
			for i := 0; i < 10; i++ {
				_, _ = h.sync(k)
			}
			if n := h.key.calls.Load(); n != tc.wantSigns {
				t.Errorf("the CA key signed %d times, want %d", n, tc.wantSigns)
			}
			typ, reason := condOf(h.get(k))
			if typ != tc.wantType || reason != tc.wantReason {
				t.Errorf("condition %s/%s, want %s/%s", typ, reason, tc.wantType, tc.wantReason)
			}
		})
	}
}

// A certificate that aged out of kube-apiserver's notBefore window while
// keyward held it is signed afresh; a fresh one refused means the clocks
// disagree: signing pauses for the signer (no request Failed), then tries
// again and issues once the apiserver accepts.
func TestNotBeforeRefusals(t *testing.T) {
	t.Run("an aged certificate is signed afresh and issued", func(t *testing.T) {
		h := newHarness(t, nil)
		h.answer = func(n int, _ *certv1.PodCertificateRequest) error {
			if n == 1 {
				h.clock.Step(2 * agedAfter) // the write took long
				return errNotBeforeWindow
			}
			return nil
		}
		k := h.add(testPCR(t, h.signer.Name))
		for range 3 {
			_, _ = h.sync(k)
		}
		if typ, _ := condOf(h.get(k)); typ != "Issued" || h.key.calls.Load() != 2 {
			t.Fatalf("got %q after %d signatures, want Issued after 2", typ, h.key.calls.Load())
		}
	})
	t.Run("a fresh certificate refused pauses signing for the signer, and nothing is Failed", func(t *testing.T) {
		h := newHarness(t, nil)
		h.answer = func(n int, _ *certv1.PodCertificateRequest) error {
			if n == 1 {
				return errNotBeforeWindow
			}
			return nil
		}
		k := h.add(testPCR(t, h.signer.Name))
		wait, err := h.sync(k)
		if err != nil || wait != skewWait {
			t.Fatalf("after a fresh refusal: (%v, %v), want a wait of %v", wait, err, skewWait)
		}
		p2 := testPCR(t, h.signer.Name)
		p2.Name, p2.UID = "pcr-2", "pcr-uid-2"
		k2 := h.add(p2)
		for range 5 {
			_, _ = h.sync(k)
			_, _ = h.sync(k2)
		}
		if n := h.key.calls.Load(); n != 1 {
			t.Fatalf("%d signatures while skew is suspected, want 1", n)
		}
		if v := gaugeValue(h.metrics.ClockSkew.WithLabelValues(h.signer.Name)); v != 1 {
			t.Errorf("keyward_signer_clock_skew_suspected = %v, want 1", v)
		}
		h.clock.Step(skewWait)
		for _, key := range []queueKey{k, k2} {
			if _, err := h.sync(key); err != nil {
				t.Fatal(err)
			}
			if typ, _ := condOf(h.get(key)); typ != "Issued" {
				t.Fatalf("%s after the pause: %q, want Issued", key.name, typ)
			}
		}
		if v := gaugeValue(h.metrics.ClockSkew.WithLabelValues(h.signer.Name)); v != 0 {
			t.Errorf("keyward_signer_clock_skew_suspected = %v after an accepted certificate, want 0", v)
		}
	})
}

// Once keyward wrote a terminal status, the UID is never signed for again,
// even while the informer still shows the request pending.
func TestAWrittenRequestIsNeverSignedAgain(t *testing.T) {
	h := newHarness(t, nil)
	k := h.add(testPCR(t, h.signer.Name)) // the informer keeps this pending copy
	for range 5 {
		if _, err := h.sync(k); err != nil {
			t.Fatal(err)
		}
	}
	if n := h.key.calls.Load(); n != 1 {
		t.Fatalf("the CA key signed %d times, want 1", n)
	}
	if h.writes != 1 {
		t.Fatalf("%d status writes, want 1", h.writes)
	}
	// Another writer made it terminal before us: the answer is
	// "immutable", and nothing is signed again either.
	h2 := newHarness(t, nil)
	h2.answer = func(int, *certv1.PodCertificateRequest) error { return errImmutable }
	k2 := h2.add(testPCR(t, h2.signer.Name))
	for range 5 {
		if _, err := h2.sync(k2); err != nil {
			t.Fatal(err)
		}
	}
	if n := h2.key.calls.Load(); n != 1 {
		t.Fatalf("after an immutable answer the CA key signed %d times, want 1", n)
	}
}

// failAfter counts from the first failed signature of the CA key's
// current outage, not from the request's creation.
func TestFailAfterCountsTheOutageNotTheRequestAge(t *testing.T) {
	outage := &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	t.Run("an old request's first failure is retried", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.FailAfter = 10 * time.Minute })
		p := testPCR(t, h.signer.Name)
		p.CreationTimestamp = metav1.NewTime(h.clock.Now().Add(-time.Hour))
		k := h.add(p)
		h.key.setErr(outage)
		if _, err := h.sync(k); !backends.IsTransient(err) {
			t.Fatalf("got %v, want the transient error back for a retry", err)
		}
		if typ, _ := condOf(h.get(k)); typ != "" {
			t.Fatalf("condition %q, want none", typ)
		}
	})
	t.Run("a new request during a long outage is Failed SignerUnavailable", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.FailAfter = 10 * time.Minute })
		h.key.setErr(outage)
		first := testPCR(t, h.signer.Name)
		k1 := h.add(first)
		if _, err := h.sync(k1); err == nil {
			t.Fatal("want a retry")
		}
		for range 22 { // the first request keeps failing, 30s apart (and is Failed itself after 10m)
			h.clock.Step(30 * time.Second)
			_, _ = h.sync(k1)
		}
		p := testPCR(t, h.signer.Name)
		p.Name, p.UID = "pcr-2", "pcr-uid-2"
		p.CreationTimestamp = metav1.NewTime(h.clock.Now())
		k2 := h.add(p)
		if _, err := h.sync(k2); err != nil {
			t.Fatalf("sync: %v", err)
		}
		if typ, reason := condOf(h.get(k2)); typ != "Failed" || reason != ReasonSignerUnavailable {
			t.Fatalf("condition %s/%s, want Failed/%s", typ, reason, ReasonSignerUnavailable)
		}
	})
	t.Run("a success ends the outage", func(t *testing.T) {
		h := newHarness(t, func(o *Options) { o.FailAfter = 10 * time.Minute })
		h.key.setErr(outage)
		k1 := h.add(testPCR(t, h.signer.Name))
		_, _ = h.sync(k1)
		h.clock.Step(9 * time.Minute)
		h.key.setErr(nil)
		if _, err := h.sync(k1); err != nil {
			t.Fatal(err)
		}
		h.clock.Step(9 * time.Minute)
		h.key.setErr(outage)
		p := testPCR(t, h.signer.Name)
		p.Name, p.UID = "pcr-2", "pcr-uid-2"
		k2 := h.add(p)
		if _, err := h.sync(k2); !backends.IsTransient(err) {
			t.Fatalf("got %v, want a retry: the outage began 0s ago, not 18m", err)
		}
	})
}

// staticProfile refuses every request with a denial quoting a huge value.
type hugeDenial struct{ size int }

func (hugeDenial) Name() string { return "huge" }
func (p hugeDenial) Template(profile.Request) (*x509.Certificate, error) {
	return nil, &profile.Denial{Reason: "DNSNameNotAllowed", Message: "name " + strings.Repeat("a", p.size) + " is not allowed"}
}

// Every condition message fits the apiserver's 32 KiB limit with room to
// spare, whatever the request carried.
func TestConditionMessagesAreBounded(t *testing.T) {
	h := newHarness(t, nil)
	h.signer.Profile = hugeDenial{size: 200 << 10}
	p := testPCR(t, h.signer.Name)
	k := h.add(p)
	if _, err := h.sync(k); err != nil {
		t.Fatal(err)
	}
	got := h.get(k)
	if typ, _ := condOf(got); typ != "Denied" {
		t.Fatalf("condition %q, want Denied", typ)
	}
	msg := got.Status.Conditions[0].Message
	if len(msg) > kubemsg.MaxConditionMessage || !strings.Contains(msg, "truncated") {
		t.Fatalf("message of %d bytes (want ≤ %d, saying it was truncated)", len(msg), kubemsg.MaxConditionMessage)
	}

	// Many unknown annotation keys: a few are named, the rest counted.
	h2 := newHarness(t, nil)
	p2 := testPCR(t, h2.signer.Name)
	p2.Spec.UnverifiedUserAnnotations = map[string]string{}
	for i := range 500 {
		p2.Spec.UnverifiedUserAnnotations[strings.Repeat("k", 60)+"/"+strings.Repeat("x", 50)+string(rune('a'+i%26))+strings.Repeat("y", i%7)] = "v"
	}
	k2 := h2.add(p2)
	if _, err := h2.sync(k2); err != nil {
		t.Fatal(err)
	}
	m := h2.get(k2).Status.Conditions[0].Message
	if len(m) > 2048 || !strings.Contains(m, "more") {
		t.Fatalf("unknown-annotations message of %d bytes: %.200s", len(m), m)
	}
}

func TestClassify(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want Class
	}{
		{"a transient backend error is retried", &backends.Error{Kind: backends.ErrTransient, Err: io.EOF}, Transient},
		{"a permanent backend error fails", &backends.Error{Kind: backends.ErrPermanent, Err: io.EOF}, Permanent},
		{"a CA not valid yet is retried", authority.ErrCANotYetValid, Transient},
		{"a CA expiring too soon is retried (until the CA changes)", authority.ErrCAExpiresTooSoon, Transient},
		{"a signature that does not verify is retried", authority.ErrBadSignature, Transient},
		{"a deadline is retried", context.DeadlineExceeded, Transient},
		{"a profile denial denies", &profile.Denial{Reason: "X"}, Denial},
		{"anything else fails", errors.New("template"), Permanent},
	}
	for _, tc := range cases {
		if got := Classify(tc.err); got != tc.want {
			t.Errorf("%s: Classify = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Warnings for one waiting request are coalesced, and Events over the
// rate are dropped and counted, never queued without bound.
func TestEventsAreCoalescedAndBounded(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.EventPolicy = EventPolicy{WarningsPerSecond: 1} })
	h.key.setErr(&backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF})
	k := h.add(testPCR(t, h.signer.Name))
	for range 50 {
		_, _ = h.sync(k)
	}
	if n := len(h.rec.Events); n != 1 {
		t.Fatalf("%d SigningDelayed Events for one request in one outage, want 1", n)
	}
	for i := range 100 {
		h.c.events.warning(nil, "Test", "event %d", i)
	}
	if dropped := counterValue(h.metrics.EventsDropped.WithLabelValues("Warning")); dropped == 0 {
		t.Fatal("no Warning dropped after 100 at once with a rate of 1/s")
	}
}

func counterValue(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	return m.GetCounter().GetValue()
}

// keyward_pcr_pending_requests counts a request waiting for a retry (which
// the work queue's length does not), until it is written.
func TestPendingCountsRequestsWaitingForARetry(t *testing.T) {
	h := newHarness(t, nil)
	h.key.setErr(&backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF})
	k := h.add(testPCR(t, h.signer.Name))
	if _, err := h.sync(k); err == nil {
		t.Fatal("want a retry")
	}
	if n := h.c.records.pending(); n != 1 {
		t.Fatalf("pending = %d while the request waits for a retry, want 1", n)
	}
	h.key.setErr(nil)
	if _, err := h.sync(k); err != nil {
		t.Fatal(err)
	}
	if n := h.c.records.pending(); n != 0 {
		t.Fatalf("pending = %d after the request was issued, want 0", n)
	}
}

func gaugeValue(g prometheus.Gauge) float64 {
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		panic(err)
	}
	return m.GetGauge().GetValue()
}

// A key still queued for a request whose record the informer's handler
// dropped (a terminal or delete event came after it was queued) is not
// worked on: nothing is signed and no record is made again.
func TestAQueuedKeyWithoutARecordIsNotSigned(t *testing.T) {
	h := newHarness(t, nil)
	p := testPCR(t, h.signer.Name)
	k := h.add(p)
	h.c.records.drop(p.UID) // as forget does on a delete or terminal event
	if _, err := h.sync(k); err != nil {
		t.Fatal(err)
	}
	if n := h.key.calls.Load(); n != 0 || h.c.records.len() != 0 {
		t.Fatalf("%d signatures and %d records after the record was dropped, want none", n, h.c.records.len())
	}
}

// A request that keeps failing to be written (here: the apiserver answers
// 500) is logged once at default verbosity after workers.LoudRetries attempts, not
// on every retry and not never.
func TestALongRetryIsLoggedOnceAtDefaultVerbosity(t *testing.T) {
	h := newHarness(t, nil)
	h.answer = func(int, *certv1.PodCertificateRequest) error {
		return apierrors.NewInternalError(errors.New("etcdserver: leader changed"))
	}
	var buf bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&buf))))
	k := h.add(testPCR(t, h.signer.Name))
	for range 3 * workers.LoudRetries {
		h.c.queue.Add(k)
		h.c.processNext(ctx)
	}
	if n := strings.Count(buf.String(), "Request still not done"); n != 1 {
		t.Fatalf("%d lines about the long retry at default verbosity, want 1:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "leader changed") {
		t.Errorf("the line does not give the error: %s", buf.String())
	}
	if n := h.key.calls.Load(); n != 1 {
		t.Errorf("%d signatures for one request whose writes fail, want 1", n)
	}
}
