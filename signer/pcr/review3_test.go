package pcr

// Tests written by the third review (commits fcb6d6a, b9e6b6c, 6b80f6f,
// ffd50dd). Each one fails on the code as reviewed and states the
// behaviour it expects.

import (
	"errors"
	"testing"
	"time"

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
func TestReview3AParkedFailureIsNeverSignedAgain(t *testing.T) {
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
