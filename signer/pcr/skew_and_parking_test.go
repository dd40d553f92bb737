package pcr

// Tests written by the third review (commits fcb6d6a, b9e6b6c, 6b80f6f,
// ffd50dd). Each one fails on the code as reviewed and states the
// behaviour it expects.

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"k8s.io/apimachinery/pkg/types"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// An admission webhook (or policy) that denies every status write of the
// signer's identity answers 403. Since fcb6d6a that is writeRejected: the
// Issued status is refused, the controller decides Failed StatusRejected,
// and that write is refused by the same webhook, so the request is parked
// (parkedWait). But the certificate stays in the record: every parkedWait
// the controller writes the *Issued* status again, and once that
// certificate has aged out of the notBefore window (kube-apiserver's
// validation answers before validating admission) it signs a fresh one.
// A request the signer already decided to fail costs one CA-key signature
// every five minutes for as long as it exists.
func TestAParkedFailureIsNeverSignedAgain(t *testing.T) {
	h := newHarness(t, nil)
	webhook := apierrors.NewForbidden(pcrResource, "pcr-1",
		errors.New(`admission webhook "pcr-guard.example.com" denied the request: only kube-system may write PodCertificateRequest status`))
	issuedWrites := 0
	h.answer = func(_ int, p *certv1.PodCertificateRequest) error {
		// Status validation first: the notBefore window.
		if nb := p.Status.NotBefore; nb != nil {
			issuedWrites++
			if d := h.clock.Now().Sub(nb.Time); d > 5*time.Minute || d < -5*time.Minute {
				return invalid(field.Invalid(field.NewPath("status", "notBefore"), nb.Time,
					"must be set to within 5 minutes of kube-apiserver's current time"))
			}
		}
		// Then validating admission.
		return webhook
	}
	k := h.add(testPCR(t, h.signer.Name))
	// One hour of the controller's own schedule: retries with backoff after
	// an error, the returned wait otherwise.
	end := h.clock.Now().Add(time.Hour)
	for h.clock.Now().Before(end) {
		wait, err := h.sync(k)
		switch {
		case err != nil:
			h.clock.Step(time.Second)
		case wait > 0:
			h.clock.Step(wait)
		default:
			h.clock.Step(time.Second)
		}
	}
	if n := h.key.calls.Load(); n > 1 {
		t.Errorf("one request whose Issued and Failed statuses are both refused by an admission webhook: %d CA-key signatures and %d Issued writes in an hour; want 1 signature (the Failed decision stands, only it is written again)",
			n, issuedWrites)
	}
}

// backdate may be anything below 5 minutes (config: [0, 5m)). With a
// backdate of 4m45s a certificate leaves kube-apiserver's window 15 seconds
// after it was signed, by keyward's own clock: a status write retried for
// 20 seconds (a conflict, a slow apiserver) is refused for its notBefore
// although both clocks agree. agedAfter (one minute) calls that refusal
// "fresh", so keyward reports clock skew (an Error, an Event on the
// request, keyward_signer_clock_skew_suspected=1) and pauses the whole
// signer name for a minute. Whether a certificate aged in keyward's hands
// is known from its own clock and the leaf's notBefore.
func TestALargeBackdateIsNotClockSkew(t *testing.T) {
	h := newHarness(t, nil)
	h.signer.Backdate = 5*time.Minute - 15*time.Second
	h.clock.Step(time.Hour) // the CA is older than the backdate
	h.answer = func(n int, p *certv1.PodCertificateRequest) error {
		if n == 1 {
			h.clock.Step(20 * time.Second) // the first write times out
			return apierrors.NewServerTimeout(pcrResource, "update", 1)
		}
		// The apiserver's clock is the test's: no skew at all.
		if nb := p.Status.NotBefore; nb != nil {
			if d := h.clock.Now().Sub(nb.Time); d > 5*time.Minute || d < -5*time.Minute {
				return invalid(field.Invalid(field.NewPath("status", "notBefore"), nb.Time,
					"must be set to within 5 minutes of kube-apiserver's current time"))
			}
		}
		return nil
	}
	k := h.add(testPCR(t, h.signer.Name))
	for i := range 4 {
		wait, err := h.sync(k)
		if v := gaugeValue(h.metrics.ClockSkew.WithLabelValues(h.signer.Name)); v != 0 {
			t.Errorf("clocks in agreement, backdate 4m45s, a write retried after 20s: after sync %d (%v, %v) keyward_signer_clock_skew_suspected = %v, signing paused for %v; want no skew reported",
				i+1, wait, err, v, wait)
		}
		h.clock.Step(wait)
	}
	if typ, _ := condOf(h.get(k)); typ != "Issued" {
		t.Errorf("request: %q, want Issued", typ)
	}
}

// gatedKey holds every signature until release is closed, counting those
// that began.
type gatedKey struct {
	*scriptedKey
	began   atomic.Int32
	release chan struct{}
}

func (k *gatedKey) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	k.began.Add(1)
	<-k.release
	return k.scriptedKey.SignContext(ctx, d, o)
}

func (k *gatedKey) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), d, o)
}

// docs/signer.md: after a fresh certificate's notBefore was refused,
// "signing pauses for that signer name for a minute and then tries one
// again". Every request that waited was requeued for the same instant
// (skewRetry), and nothing lets only one of them through: each worker
// signs one, so a persistent skew costs `workers` refused CA-key
// signatures a minute, not one.
func TestAfterASkewPauseOneRequestIsTried(t *testing.T) {
	h := newHarness(t, nil)
	h.answer = func(_ int, p *certv1.PodCertificateRequest) error {
		return errNotBeforeWindow // the signer's clock stays skewed
	}
	const workers = 4
	var keys []queueKey
	for i := range workers {
		p := testPCR(t, h.signer.Name)
		p.Name, p.UID = fmt.Sprintf("pcr-%d", i), types.UID(fmt.Sprintf("uid-%d", i))
		keys = append(keys, h.add(p))
	}
	if wait, _ := h.sync(keys[0]); wait != skewWait {
		t.Fatalf("first refusal: wait %v, want %v", wait, skewWait)
	}
	for _, k := range keys[1:] {
		if wait, _ := h.sync(k); wait <= 0 {
			t.Fatalf("%s during the pause: wait %v", k.name, wait)
		}
	}
	gk := &gatedKey{scriptedKey: h.key, release: make(chan struct{})}
	auth, err := authority.New(authorityOf(h.signer).Certificate(), nil, gk)
	if err != nil {
		t.Fatal(err)
	}
	h.signer.Issuer = issuer.Static{Authority: auth}
	h.clock.Step(skewWait) // every waiting request comes due now
	var wg sync.WaitGroup
	for _, k := range keys { // the workers
		wg.Add(1)
		go func() { defer wg.Done(); _, _ = h.c.sync(context.Background(), k) }()
	}
	time.Sleep(500 * time.Millisecond)
	close(gk.release)
	wg.Wait()
	if n := gk.began.Load(); n > 1 {
		t.Errorf("after the skew pause, %d workers each signed a request at once (all refused); want one probe", n)
	}
}
