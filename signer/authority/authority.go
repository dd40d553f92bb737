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
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/ca"
)

// ErrCAExpiresTooSoon is returned when a certificate of the chain (the CA
// or one of its issuers) ends before a leaf of the policy's minimum lifetime
// could.
var ErrCAExpiresTooSoon = errors.New("CA certificate expires too soon")

// ErrCANotYetValid is matched (errors.Is) by a *NotYetValidError: a
// certificate of the chain starts after the signer's clock. Waiting cures it.
var ErrCANotYetValid = errors.New("CA certificate is not valid yet")

// ErrBadSignature is matched (errors.Is), together with
// backends.ErrTransient, when the backend returned a signature that does not
// verify against the CA key: a device fault, worth retrying.
var ErrBadSignature = errors.New("CA key returned a signature that does not verify")

// NotYetValidError says when the chain becomes valid. It matches
// ErrCANotYetValid.
type NotYetValidError struct {
	// Subject is the certificate that starts last.
	Subject string
	// ValidFrom is the latest notBefore in the chain: the first moment a
	// leaf can be issued.
	ValidFrom time.Time
	// Now is the signer's clock when it refused.
	Now time.Time
}

func (e *NotYetValidError) Error() string {
	return fmt.Sprintf("CA certificate %q is not valid until %s (in %s)",
		e.Subject, e.ValidFrom.UTC().Format(time.RFC3339), e.ValidFrom.Sub(e.Now).Round(time.Second))
}

func (e *NotYetValidError) Is(target error) bool { return target == ErrCANotYetValid }

// Policy is how long a leaf lives and from when. Lifetime is the whole
// validity, NotAfter − NotBefore, so that a request's maximum lifetime is
// met exactly; NotBefore is Now − Backdate, to tolerate clock skew.
type Policy struct {
	Lifetime time.Duration
	Backdate time.Duration
	// MinLifetime refuses (ErrCAExpiresTooSoon) a leaf that a chain
	// certificate's expiry would cut below this; zero means Lifetime.
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
	// issuersPEM is IssuersPEM, encoded once in New (telling a root
	// takes a signature check).
	issuersPEM []byte
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
	var issuers []byte
	for _, c := range append([]*x509.Certificate{cert}, chain...) {
		if bytes.Equal(c.RawIssuer, c.RawSubject) && c.CheckSignatureFrom(c) == nil {
			break
		}
		issuers = append(issuers, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return &Authority{cert: cert, chain: chain, signer: signer, issuersPEM: issuers}, nil
}

// IssuersPEM is Chain PEM-encoded up to, not including, the first
// self-signed certificate (a root): what a leaf is served with. Callers
// must not modify it.
func (a *Authority) IssuersPEM() []byte { return a.issuersPEM }

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
// bits), validity, signature algorithm, basic constraints (never a CA) and,
// unless tmpl has them, the subject and authority key identifiers.
//
// The leaf lies inside every certificate of the chain: notBefore is the
// latest of now − Backdate and each chain certificate's notBefore, and
// notAfter the earliest of notBefore + Lifetime and each one's notAfter.
// Times are whole seconds, as X.509 and Kubernetes both store them. Errors a
// caller may retry: *NotYetValidError (ErrCANotYetValid), ErrBadSignature
// and the backend's backends.ErrTransient.
func (a *Authority) Sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey, p Policy) (*x509.Certificate, error) {
	return a.sign(ctx, tmpl, pub, p, false)
}

// ErrNoPathForIntermediate is returned by SignIntermediate when a
// certificate of the chain allows no CA below the one it would sign
// (basicConstraints pathLen 0): `keyward ca init --path-len 1` makes a
// root that does.
var ErrNoPathForIntermediate = errors.New("the CA's path length allows no intermediate below it")

// SignIntermediate issues a CA certificate for pub under p, as Sign issues
// a leaf, placed inside the chain the same way: basicConstraints CA:TRUE
// with pathLen 0 (it signs leaves only) and keyUsage certSign, whatever
// tmpl says of them. It refuses (ErrNoPathForIntermediate, permanent) when
// a certificate of the chain's path length would make the new CA invalid.
func (a *Authority) SignIntermediate(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey, p Policy) (*x509.Certificate, error) {
	for i, c := range a.Chain() {
		// i CAs lie between c and the new one (self-issued ones aside,
		// which keyward's chains do not have).
		if c.BasicConstraintsValid && (c.MaxPathLen > 0 || c.MaxPathLenZero) && c.MaxPathLen < i+1 {
			return nil, fmt.Errorf("%w: %q has pathLen %d", ErrNoPathForIntermediate, c.Subject, c.MaxPathLen)
		}
	}
	return a.sign(ctx, tmpl, pub, p, true)
}

func (a *Authority) sign(ctx context.Context, tmpl *x509.Certificate, pub crypto.PublicKey, p Policy, isCA bool) (*x509.Certificate, error) {
	if p.Lifetime <= 0 {
		return nil, fmt.Errorf("policy lifetime must be positive, got %s", p.Lifetime)
	}
	if p.Backdate < 0 || p.Backdate >= p.Lifetime {
		return nil, fmt.Errorf("policy backdate %s must be in [0, lifetime %s)", p.Backdate, p.Lifetime)
	}
	clock := time.Now
	if p.Now != nil {
		clock = p.Now
	}
	now := clock()
	notBefore, notAfter, err := a.validity(now, p)
	if err != nil {
		return nil, err
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
	t.IsCA = isCA
	t.MaxPathLen = 0
	t.MaxPathLenZero = isCA
	if isCA {
		t.KeyUsage = x509.KeyUsageCertSign
	}
	if len(t.SubjectKeyId) == 0 {
		if t.SubjectKeyId, err = ca.SubjectKeyID(pub); err != nil {
			return nil, err
		}
	}
	// CreateCertificate copies the CA's subject key id into the leaf's
	// authority key id; a CA certificate without one gets it computed.
	if len(a.cert.SubjectKeyId) == 0 && len(t.AuthorityKeyId) == 0 {
		if t.AuthorityKeyId, err = ca.SubjectKeyID(a.cert.PublicKey); err != nil {
			return nil, err
		}
	}
	cs := &contextSigner{ctx: ctx, s: a.signer}
	der, err := x509.CreateCertificate(rand.Reader, &t, a.cert, pub, cs)
	if err != nil {
		if bad := cs.badSignature(); bad != nil {
			return nil, bad
		}
		return nil, fmt.Errorf("signing certificate with %s: %w", a.signer.URI(), err)
	}
	return x509.ParseCertificate(der)
}

// validity places a leaf of p inside every certificate of the chain.
func (a *Authority) validity(now time.Time, p Policy) (notBefore, notAfter time.Time, err error) {
	notBefore = now.Add(-p.Backdate).Truncate(time.Second)
	chain := a.Chain()
	var late *x509.Certificate
	for _, c := range chain {
		if nb := c.NotBefore.Truncate(time.Second); nb.After(notBefore) {
			notBefore, late = nb, c
		}
	}
	if notBefore.After(now) {
		return time.Time{}, time.Time{}, &NotYetValidError{Subject: late.Subject.String(), ValidFrom: notBefore, Now: now}
	}
	notAfter = notBefore.Add(p.Lifetime)
	var early *x509.Certificate
	for _, c := range chain {
		if na := c.NotAfter.Truncate(time.Second); na.Before(notAfter) {
			notAfter, early = na, c
		}
	}
	if early == nil {
		return notBefore, notAfter, nil
	}
	min := p.MinLifetime
	if min == 0 {
		min = p.Lifetime
	}
	if notAfter.Sub(notBefore) < min {
		return time.Time{}, time.Time{}, fmt.Errorf("%w: CA certificate %q ends %s, a leaf from %s needs to last %s",
			ErrCAExpiresTooSoon, early.Subject, early.NotAfter.UTC().Format(time.RFC3339), notBefore.UTC().Format(time.RFC3339), min)
	}
	return notBefore, notAfter, nil
}

// contextSigner lets x509.CreateCertificate's Sign call carry ctx, and
// keeps what the backend signed so that a failed CreateCertificate can be
// told apart: a signature that does not verify is a device fault.
type contextSigner struct {
	ctx    context.Context
	s      backends.Signer
	digest []byte
	sig    []byte
}

func (c *contextSigner) Public() crypto.PublicKey { return c.s.Public() }

func (c *contextSigner) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := c.s.SignContext(c.ctx, digest, opts)
	if err == nil {
		c.digest, c.sig = digest, sig
	}
	return sig, err
}

// badSignature returns a transient ErrBadSignature error if the backend
// answered with a signature that does not verify, and nil otherwise. It is
// called only after CreateCertificate failed, so issuing pays for one
// verification (CreateCertificate's own), not two.
func (c *contextSigner) badSignature() error {
	if c.sig == nil {
		return nil
	}
	err := backends.VerifySignature(c.s.Public(), c.s.Algorithm(), c.digest, c.sig)
	if err == nil {
		return nil
	}
	return &backends.Error{Kind: backends.ErrTransient, Op: "sign", URI: c.s.URI(),
		Err: fmt.Errorf("%w: %w", ErrBadSignature, err)}
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
