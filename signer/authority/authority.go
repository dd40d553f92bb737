// Package authority is keyward's CA core: a CA certificate and the backend
// key that signs for it, issuing leaf certificates from templates under a
// Policy. It knows nothing about Kubernetes and nothing about where the key
// is stored.
package authority

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"time"

	"github.com/keyward/keyward/backends"
)

// ErrCAExpiresTooSoon is returned when the CA certificate ends before a leaf
// of the policy's minimum lifetime could.
var ErrCAExpiresTooSoon = errors.New("CA certificate expires too soon")

// Policy is how long a leaf lives and from when. Lifetime is the whole
// validity, NotAfter − NotBefore, so that a request's maximum lifetime is
// met exactly; NotBefore is Now − Backdate, to tolerate clock skew.
type Policy struct {
	Lifetime time.Duration
	Backdate time.Duration
	// MinLifetime refuses (ErrCAExpiresTooSoon) a leaf the CA's own
	// expiry would cut below this; zero means Lifetime.
	MinLifetime time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Authority signs leaf certificates with a CA key held by a backend.
// It is safe for concurrent use if its Signer is.
type Authority struct {
	cert   *x509.Certificate
	chain  []*x509.Certificate // issuers above cert, nearest first
	signer backends.Signer
}

// New checks that cert is a CA certificate for signer's key and that chain
// (the intermediates above cert, nearest first, root optional) links up.
func New(cert *x509.Certificate, chain []*x509.Certificate, signer backends.Signer) (*Authority, error) {
	if cert == nil || signer == nil {
		return nil, errors.New("authority needs a CA certificate and a signer")
	}
	if !cert.IsCA || !cert.BasicConstraintsValid {
		return nil, fmt.Errorf("certificate %q is not a CA (basicConstraints CA:TRUE missing)", cert.Subject)
	}
	if cert.KeyUsage != 0 && cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("CA certificate %q lacks keyUsage certSign", cert.Subject)
	}
	certKey, err := x509.MarshalPKIXPublicKey(cert.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("reading CA certificate key: %w", err)
	}
	signerKey, err := x509.MarshalPKIXPublicKey(signer.Public())
	if err != nil {
		return nil, fmt.Errorf("reading signer key: %w", err)
	}
	if !bytes.Equal(certKey, signerKey) {
		return nil, fmt.Errorf("CA certificate %q is not for key %s (fingerprint %s)", cert.Subject, signer.URI(), signer.Fingerprint())
	}
	prev := cert
	for i, c := range chain {
		if err := prev.CheckSignatureFrom(c); err != nil {
			return nil, fmt.Errorf("chain[%d] %q did not sign %q: %w", i, c.Subject, prev.Subject, err)
		}
		prev = c
	}
	return &Authority{cert: cert, chain: chain, signer: signer}, nil
}

// Certificate is the CA certificate leaves are issued under.
func (a *Authority) Certificate() *x509.Certificate { return a.cert }

// Chain is the CA certificate followed by its issuers, nearest first.
func (a *Authority) Chain() []*x509.Certificate {
	return append([]*x509.Certificate{a.cert}, a.chain...)
}

// Signer is the CA key.
func (a *Authority) Signer() backends.Signer { return a.signer }

// Sign issues a certificate for pub from tmpl under p. From tmpl it takes the
// subject, SANs, key usages and extensions; it sets serial (128 random
// bits), validity, signature algorithm and basic constraints (never a CA).
// Times are whole seconds, as X.509 and Kubernetes both store them.
func (a *Authority) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey, p Policy) (*x509.Certificate, error) {
	if p.Lifetime <= 0 {
		return nil, fmt.Errorf("policy lifetime must be positive, got %s", p.Lifetime)
	}
	if p.Backdate < 0 || p.Backdate >= p.Lifetime {
		return nil, fmt.Errorf("policy backdate %s must be in [0, lifetime %s)", p.Backdate, p.Lifetime)
	}
	now := time.Now
	if p.Now != nil {
		now = p.Now
	}
	notBefore := now().Add(-p.Backdate).Truncate(time.Second)
	notAfter := notBefore.Add(p.Lifetime)
	if notAfter.After(a.cert.NotAfter) {
		notAfter = a.cert.NotAfter.Truncate(time.Second)
		min := p.MinLifetime
		if min == 0 {
			min = p.Lifetime
		}
		if notAfter.Sub(notBefore) < min {
			return nil, fmt.Errorf("%w: CA %q ends %s, a leaf from %s needs to last %s",
				ErrCAExpiresTooSoon, a.cert.Subject, a.cert.NotAfter.UTC().Format(time.RFC3339), notBefore.UTC().Format(time.RFC3339), min)
		}
	}
	if notBefore.Before(a.cert.NotBefore) {
		return nil, fmt.Errorf("CA %q is not valid until %s", a.cert.Subject, a.cert.NotBefore.UTC().Format(time.RFC3339))
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	t := *tmpl
	t.SerialNumber = serial
	t.NotBefore = notBefore
	t.NotAfter = notAfter
	t.SignatureAlgorithm = a.signer.SignatureAlgorithm()
	t.BasicConstraintsValid = true
	t.IsCA = false
	t.MaxPathLen = 0
	t.MaxPathLenZero = false
	der, err := x509.CreateCertificate(rand.Reader, &t, a.cert, pub, contextSigner{ctx: ctx, s: a.signer})
	if err != nil {
		return nil, fmt.Errorf("signing certificate with %s: %w", a.signer.URI(), err)
	}
	return x509.ParseCertificate(der)
}

// contextSigner lets x509.CreateCertificate's Sign call carry ctx.
type contextSigner struct {
	ctx context.Context
	s   backends.Signer
}

func (c contextSigner) Public() crypto.PublicKey { return c.s.Public() }

func (c contextSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return c.s.SignContext(c.ctx, digest, opts)
}

func randomSerial() (*big.Int, error) {
	// 128 random bits, and never zero (RFC 5280: positive).
	for {
		n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
		if err != nil {
			return nil, fmt.Errorf("generating serial number: %w", err)
		}
		if n.Sign() > 0 {
			return n, nil
		}
	}
}
