// Package issuer is the contract between the controllers that sign
// (PodCertificateRequests, CertificateSigningRequests) and what tells them
// which CA generation issues now. It knows nothing about Kubernetes.
package issuer

import (
	"context"
	"errors"
	"time"

	"github.com/keyward/keyward/signer/authority"
)

// ErrUnavailable is matched (errors.Is) by an error from Current or
// Reserve when the signer name has no generation that may issue now (no
// Authority, two of them, no Active generation, its key not usable, the
// reservation not written). It is transient: the request waits, never
// fails.
var ErrUnavailable = errors.New("no CA generation can issue")

// Issuer says which CA generation of one signer name issues now. It MUST
// be safe for concurrent use.
type Issuer interface {
	// Current returns the authority of the generation that issues now and
	// that generation's name, or an error matching ErrUnavailable.
	Current() (*authority.Authority, string, error)
	// Reserve returns nil once a leaf signed by generation that ends at or
	// before notAfter is covered by what the cluster records as the
	// generation's latest possible leaf expiry. A non-nil error means: do
	// not sign (transient).
	Reserve(ctx context.Context, generation string, notAfter time.Time) error
}

// Static is an Issuer with one fixed authority and nothing to reserve
// (tests, and tools that sign outside a cluster).
type Static struct {
	Authority  *authority.Authority
	Generation string
}

// Current returns s's authority.
func (s Static) Current() (*authority.Authority, string, error) {
	if s.Authority == nil {
		return nil, "", ErrUnavailable
	}
	return s.Authority, s.Generation, nil
}

// Reserve needs no record.
func (Static) Reserve(context.Context, string, time.Time) error { return nil }
