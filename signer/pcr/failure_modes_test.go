package pcr

// Tests written by the review of the hardening work (issue 9). Each one
// fails on the code as reviewed and states the behaviour it expects.

import (
	"bytes"
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// slowKey signs after a delay and counts signatures, and those started
// after stopped is set.
type slowKey struct {
	backends.Signer
	delay        time.Duration
	calls        atomic.Int32
	stopped      atomic.Bool
	afterStopped atomic.Int32
}

func (k *slowKey) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	k.calls.Add(1)
	if k.stopped.Load() {
		k.afterStopped.Add(1)
	}
	time.Sleep(k.delay)
	return k.Signer.SignContext(ctx, d, o)
}

func (k *slowKey) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), d, o)
}

// When the controller's context ends (SIGTERM, or the leader Lease lost or
// released), at most the requests already in a worker's hands may still be
// signed. Today every request still in the work queue is taken out and
// signed on a context that ignores the cancellation (processNext's
// context.WithoutCancel), after kubeclient.RunLeader released the Lease:
// the next leader signs the same requests again, and shutdown lasts as long
// as the backlog.
func TestNoNewSignaturesAfterTheContextEnds(t *testing.T) {
	s, _ := testSigner(t)
	key := &slowKey{Signer: authorityOf(s).Signer(), delay: 20 * time.Millisecond}
	auth, err := authority.New(authorityOf(s).Certificate(), nil, key)
	if err != nil {
		t.Fatal(err)
	}
	s.Issuer = issuer.Static{Authority: auth}
	const n = 200
	var objs []runtime.Object
	for i := range n {
		p := testPCR(t, s.Name)
		p.Name, p.UID = fmt.Sprintf("pcr-%d", i), types.UID(fmt.Sprintf("uid-%06d", i))
		objs = append(objs, p)
	}
	client := fake.NewClientset(objs...)
	metrics, _ := NewMetrics(prometheus.NewRegistry())
	const workers = 4
	c, err := New(Options{Client: client, Signers: []*Signer{s}, Metrics: metrics, Workers: workers})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for key.calls.Load() < workers && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	key.stopped.Store(true)
	cancel()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return")
	}
	// Workers that were between two requests may have started one just as
	// the context ended; anything beyond one per worker is new work.
	if got := key.afterStopped.Load(); got > workers {
		t.Errorf("%d signatures began after the context ended (of %d requests, %d signed in all); want at most %d (the requests in flight)",
			got, n, key.calls.Load(), workers)
	}
}

// failAfter counts from the first failure of the *current* outage. An
// outage that ended (the backend answers again: the readiness probe signs,
// /readyz is green) while no request happened to be signed leaves
// outageSince set, so a new request's first transient error an hour later
// is Failed SignerUnavailable at once: kubelet never starts that pod.
func TestFailAfterIgnoresAnOutageThatEndedWithoutARequest(t *testing.T) {
	outage := &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	h := newHarness(t, func(o *Options) { o.FailAfter = 10 * time.Minute })
	h.key.setErr(outage)
	first := h.add(testPCR(t, h.signer.Name))
	if _, err := h.sync(first); err == nil {
		t.Fatal("want a retry during the outage")
	}
	// The request goes away (its pod was deleted) and the backend is back:
	// every probe succeeds from here on.
	h.c.records.drop("pcr-uid")
	if err := h.c.informers.Get(h.signer.Name).GetIndexer().Delete(h.get(first)); err != nil {
		t.Fatal(err)
	}
	h.key.setErr(nil)
	if _, err := h.key.SignContext(context.Background(), make([]byte, 32), crypto.SHA256); err != nil {
		t.Fatal(err) // the readiness probe
	}
	h.clock.Step(time.Hour)

	// One blip on a healthy backend, an hour later, on a new request.
	h.key.setErr(outage)
	p := testPCR(t, h.signer.Name)
	p.Name, p.UID = "pcr-2", "pcr-uid-2"
	k2 := h.add(p)
	_, err := h.sync(k2)
	if typ, reason := condOf(h.get(k2)); typ != "" {
		t.Fatalf("a new request's first transient error, an hour after the last outage ended: %s/%s (sync %v); want a retry", typ, reason, err)
	}
}

// kube-apiserver refuses a notBefore more than 5 minutes from its clock.
// apiserverWindow answers status writes as it does, with the test's clock
// as the apiserver's (no skew at all), failing writes with a server error
// while down is set.
func apiserverWindow(h *harness, down *atomic.Bool) func(int, *certv1.PodCertificateRequest) error {
	return func(_ int, p *certv1.PodCertificateRequest) error {
		if down.Load() {
			return apierrors.NewInternalError(errors.New("etcdserver: request timed out"))
		}
		if p.Status.NotBefore == nil {
			return nil
		}
		if d := h.clock.Now().Sub(p.Status.NotBefore.Time); d > 5*time.Minute || d < -5*time.Minute {
			return invalid(field.Invalid(field.NewPath("status", "notBefore"), p.Status.NotBefore.Time,
				"must be set to within 5 minutes of kube-apiserver's current time"))
		}
		return nil
	}
}

// The signer's and the apiserver's clocks agree. Status writes fail with
// server errors for a while (an apiserver brownout), twice: the certificate
// keyward holds ages out of the window each time. That is not clock skew,
// yet the second refusal makes the request Failed NotBeforeRejected ("the
// signer's clock is skewed"), permanently. A refusal of a certificate that
// keyward's own clock already finds older than the window is keyward's own
// delay, and says nothing about skew.
func TestAnAgedCertificateIsNotClockSkew(t *testing.T) {
	h := newHarness(t, nil)
	var down atomic.Bool
	h.answer = apiserverWindow(h, &down)
	k := h.add(testPCR(t, h.signer.Name))
	brownout := func() {
		down.Store(true)
		for range 40 { // 40 retries, 10s apart (the queue's cap)
			if _, err := h.sync(k); err == nil {
				t.Fatal("a write during the brownout succeeded")
			}
			h.clock.Step(10 * time.Second)
		}
		down.Store(false)
	}
	brownout() // the first certificate ages out
	if _, err := h.sync(k); err == nil {
		t.Fatal("want the window refusal to be retried with a fresh signature")
	}
	brownout() // and so does the second
	for range 3 {
		_, _ = h.sync(k)
	}
	got := h.get(k)
	if typ, reason := condOf(got); typ != "Issued" {
		msg := ""
		if len(got.Status.Conditions) == 1 {
			msg = got.Status.Conditions[0].Message
		}
		t.Fatalf("clocks in agreement, two apiserver brownouts: %s/%s (%.160s); want Issued", typ, reason, msg)
	}
}

// A 403 on a status write is not always RBAC: a validating admission
// webhook or ValidatingAdmissionPolicy that denies the write answers 403
// too. The controller then blocks the whole signer name, every other
// request included, although the identity holds every grant (each
// permission check passes, and the next refusal blocks it again).
func TestAnAdmissionDenialDoesNotBlockTheSignerName(t *testing.T) {
	h := newHarness(t, nil)
	ssar := fake.NewClientset()
	ssar.PrependReactor("create", "selfsubjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authorizationv1.SelfSubjectAccessReview{Status: authorizationv1.SubjectAccessReviewStatus{Allowed: true}}, nil
	})
	gate := NewPermissionGate(ssar, []string{h.signer.Name}, h.clock, nil)
	if err := gate.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.c.opts.Permissions = gate
	webhook := apierrors.NewForbidden(pcrResource, "pcr-1",
		errors.New(`admission webhook "policy.example.com" denied the request: status writes from outside kube-system are audited`))
	h.answer = func(_ int, p *certv1.PodCertificateRequest) error {
		if p.Name == "pcr-1" {
			return webhook
		}
		return nil
	}
	k1 := h.add(testPCR(t, h.signer.Name))
	_, _ = h.sync(k1)
	if err := gate.Blocked(h.signer.Name); err != nil {
		t.Errorf("after an admission webhook's 403, with every grant held, the signer name is blocked: %v", err)
	}
	p2 := testPCR(t, h.signer.Name)
	p2.Name, p2.UID = "pcr-2", "pcr-uid-2"
	k2 := h.add(p2)
	if wait, err := h.sync(k2); wait == permissionWait || err != nil {
		t.Errorf("another request of the same signer name: (%v, %v); want it issued", wait, err)
	}
}

// A CA key that is down for minutes must show in the log at the default
// verbosity (issue 9: "errors that are logged nowhere at default
// verbosity"). Today a transient signing error is an Event (rate-limited,
// coalesced per request, absent without a recorder) and a V(2) line.
func TestABackendOutageIsLoggedAtDefaultVerbosity(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.Recorder = nil })
	h.key.setErr(&backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: errors.New("connection refused")})
	var buf bytes.Buffer
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&buf)))
	ctx := klog.NewContext(context.Background(), logger)
	k := h.add(testPCR(t, h.signer.Name))
	for range 20 {
		h.c.queue.Add(k)
		h.c.processNext(ctx)
		h.clock.Step(30 * time.Second)
	}
	if !strings.Contains(buf.String(), "connection refused") {
		t.Errorf("10 minutes of a CA key refusing every signature logged %q at default verbosity; want the error", buf.String())
	}
}

// Records are dropped when the informer shows a request terminal. The
// watch event of keyward's own status write can be handled before the
// write's HTTP answer reaches the worker; markWritten then re-creates the
// record the event handler just dropped, and nothing drops it again until
// the request is deleted. (Likewise records.get/update in sync re-create a
// record whose request was deleted while the worker held it.)
func TestARecordIsNotRecreatedAfterTheInformerShowedTheRequestTerminal(t *testing.T) {
	h := newHarness(t, nil)
	h.answer = func(_ int, p *certv1.PodCertificateRequest) error {
		// The watch event of this very write arrives first: the
		// informer stores the terminal object, then calls the handler.
		done := p.DeepCopy()
		if err := h.c.informers.Get(h.signer.Name).GetIndexer().Update(done); err != nil {
			t.Fatal(err)
		}
		h.c.enqueue(h.signer.Name, done)
		return nil
	}
	k := h.add(testPCR(t, h.signer.Name))
	if _, err := h.sync(k); err != nil {
		t.Fatal(err)
	}
	// The event, seen while the certificate's write was unconfirmed,
	// queued the request once more (to read what was stored if the answer
	// were lost); the workers take it as they would.
	for h.c.queue.Len() > 0 {
		h.c.processNext(context.Background())
	}
	if n := h.c.records.len(); n != 0 {
		t.Errorf("%d records left for a request the informer showed terminal; want 0", n)
	}
}

// A signer whose clock is 6 minutes slow (NTP broken on its node) fails
// every request permanently, two CA-key signatures each: kubelet never
// starts those pods, even after the clock is fixed. Skew is a property of
// the signer, not of the request: once a fresh signature is refused for
// its notBefore, the signer should stop signing for that CA key (like a
// missing grant: unready, logged, a metric) and let requests wait.
func TestClockSkewIsNotAPermanentFailureOfEveryRequest(t *testing.T) {
	h := newHarness(t, nil)
	h.answer = func(_ int, p *certv1.PodCertificateRequest) error {
		apiserverNow := h.clock.Now().Add(6 * time.Minute)
		if p.Status.NotBefore != nil && apiserverNow.Sub(p.Status.NotBefore.Time) > 5*time.Minute {
			return invalid(field.Invalid(field.NewPath("status", "notBefore"), p.Status.NotBefore.Time,
				"must be set to within 5 minutes of kube-apiserver's current time"))
		}
		return nil
	}
	failed := 0
	for i := range 5 {
		p := testPCR(t, h.signer.Name)
		p.Name, p.UID = fmt.Sprintf("pcr-%d", i), types.UID(fmt.Sprintf("uid-%d", i))
		k := h.add(p)
		for range 3 {
			_, _ = h.sync(k)
		}
		if typ, _ := condOf(h.get(k)); typ == "Failed" {
			failed++
		}
	}
	if failed > 0 || h.key.calls.Load() > 2 {
		t.Errorf("a 6-minute slow signer clock: %d of 5 requests Failed for good, %d CA-key signatures; want none Failed and at most 2 signatures",
			failed, h.key.calls.Load())
	}
}
