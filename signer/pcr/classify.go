package pcr

import (
	"context"
	"errors"
	"strings"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/profile"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Class is what an error from issuing means for the request. Classify is
// the only place that decides it: retries, conditions, metrics and
// readiness all ask it.
type Class int

const (
	// Transient: retry later with backoff; never Failed unless the CA
	// key's outage outlasts FailAfter.
	Transient Class = iota
	// Permanent: retrying cannot help; the request is Failed.
	Permanent
	// Denial: the signer's policy refuses the request; it is Denied.
	Denial
)

func (c Class) String() string {
	switch c {
	case Transient:
		return "transient"
	case Permanent:
		return "permanent"
	case Denial:
		return "denial"
	}
	return "unknown"
}

// Classify says what err, returned while building or signing a
// certificate, means. Backend errors say it themselves (backends.ErrTransient);
// a CA that is not valid yet or expires too soon, a signature that failed
// verification and a deadline are transient: each is cured by time, the
// device or a CA change, never by failing the pod.
func Classify(err error) Class {
	var denial *profile.Denial
	switch {
	case err == nil:
		return Transient
	case errors.As(err, &denial):
		return Denial
	case backends.IsTransient(err),
		errors.Is(err, authority.ErrCANotYetValid),
		errors.Is(err, authority.ErrCAExpiresTooSoon),
		errors.Is(err, authority.ErrBadSignature),
		errors.Is(err, issuer.ErrUnavailable),
		errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, context.Canceled):
		return Transient
	}
	return Permanent
}

// writeResult is what kube-apiserver's answer to a status write means for
// the controller. classifyWrite is the only place that reads those answers.
type writeResult int

const (
	writeOK writeResult = iota
	// writeGone: the request was deleted.
	writeGone
	// writeConflict: our copy was stale; retry with the same certificate.
	writeConflict
	// writeNotBeforeWindow: the leaf's notBefore is outside the apiserver's
	// ±5 minute window. The only refusal that signing again can cure.
	writeNotBeforeWindow
	// writeNoPermission: this identity may not sign for the signer name
	// (a 422 on spec.signerName, raised inside status validation) or may
	// not update the status (403). Signing again cannot help.
	writeNoPermission
	// writeAlreadyTerminal: the status is already terminal (another
	// replica, or an earlier write of ours whose answer was lost).
	writeAlreadyTerminal
	// writeRejected: the apiserver judged the status invalid for another
	// reason. Signing again would produce the same refusal.
	writeRejected
	// writeTransient: network, timeout, throttling, server error.
	writeTransient
)

func (w writeResult) String() string {
	return [...]string{"ok", "gone", "conflict", "notBeforeWindow", "noPermission", "alreadyTerminal", "rejected", "transient"}[w]
}

// IsMissingGrant reports whether err is kube-apiserver refusing an update
// for lack of a grant: RBAC's "User … cannot update resource …", or the
// CertificateSigning admission's "user not permitted to sign requests with
// signerName …" (no `sign` on the signer name). An admission webhook or
// policy that denies the write answers 403 too, and that is a refusal of
// that one status, not a missing grant.
func IsMissingGrant(err error) bool {
	if !apierrors.IsForbidden(err) {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, " cannot update resource ") || strings.Contains(msg, "not permitted to sign")
}

// classifyWrite reads kube-apiserver's answer to a status write.
func classifyWrite(err error) writeResult {
	switch {
	case err == nil:
		return writeOK
	case apierrors.IsNotFound(err):
		return writeGone
	case apierrors.IsConflict(err):
		return writeConflict
	case apierrors.IsForbidden(err):
		if IsMissingGrant(err) {
			return writeNoPermission
		}
		return writeRejected
	case apierrors.IsInvalid(err):
		return classifyInvalid(err)
	}
	return writeTransient
}

// classifyInvalid reads the causes of a 422. The apiserver's validation
// names the field; its detail text is the only way to tell the notBefore
// window from the other notBefore checks.
func classifyInvalid(err error) writeResult {
	var se apierrors.APIStatus
	if !errors.As(err, &se) || se.Status().Details == nil {
		return writeRejected
	}
	for _, c := range se.Status().Details.Causes {
		switch {
		case c.Field == "spec.signerName" && c.Type == metav1.CauseType("FieldValueForbidden"):
			return writeNoPermission
		case c.Field == "status.notBefore" && strings.Contains(c.Message, "of kube-apiserver's current time"):
			return writeNotBeforeWindow
		case strings.Contains(c.Message, "immutable after PodCertificateRequest is"):
			return writeAlreadyTerminal
		}
	}
	return writeRejected
}
