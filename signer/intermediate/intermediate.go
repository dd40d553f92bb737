// Package intermediate is a signer name's opt-in in-memory intermediate CA
// (signers[].intermediate): an issuer.Issuer that wraps the one of the CA
// generations and answers, instead of the Active generation's authority,
// an authority whose certificate that generation's CA key signed and whose
// key (ECDSA P-256) was generated in this process's memory. Leaves are
// then signed in memory, and the CA key in the HSM or KMS signs one
// certificate per intermediate instead of one per leaf.
//
// The key is never written anywhere: no file, no Secret, no log line,
// no metric. Each intermediate lives Validity, is replaced (with a new key)
// once less than RenewBefore of it is left, and is bound to this replica
// by its subject and a URI SAN naming the replica. When the Active
// generation changes, the next Current issues a new intermediate under it
// and never hands out the old one again. It knows nothing about
// Kubernetes.
package intermediate

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Defaults of Options.
const (
	defaultSignTimeout = 30 * time.Second
	defaultWait        = 10 * time.Second
	firstRetry         = time.Second
	maxRetry           = time.Minute
)

// URIPrefix starts the URI SAN that binds an intermediate to its signer
// name and replica: urn:keyward:intermediate:<signer name>:<replica>, each
// path-escaped.
const URIPrefix = "urn:keyward:intermediate:"

// Options configure New.
type Options struct {
	// SignerName and Replica (this process's identity, e.g. its pod name)
	// are written into each intermediate.
	SignerName, Replica string
	// Validity is each intermediate's lifetime; RenewBefore how long
	// before its end a new one is made. RenewBefore must be at least
	// MaxLifetime, the longest leaf: an intermediate issues only while it
	// has MaxLifetime left, so no leaf is cut short by it.
	Validity, RenewBefore, MaxLifetime time.Duration
	// Backdate moves each intermediate's notBefore into the past, as a
	// leaf's (clock skew).
	Backdate time.Duration
	// SignTimeout bounds the CA key's signature of one intermediate
	// (default 30s).
	SignTimeout time.Duration
	// Wait bounds how long Current waits for an intermediate being signed
	// when none may issue (default 10s); then it answers ErrUnavailable
	// and the request is retried.
	Wait  time.Duration
	Clock clock.Clock
	// Logger gets one line per intermediate signed and one per change of
	// the failure to sign one (default: klog's).
	Logger klog.Logger
	// Observe, if set, is called after each attempt to sign an
	// intermediate: with its certificate, or with the error.
	Observe func(cert *x509.Certificate, err error)
	// Bound, if set, bounds each signature of an intermediate as a leaf's
	// is (kubeclient.Fence.Bound: none starts once this replica may no
	// longer lead, and one under way is cut then). A signature refused or
	// cut by it is not a failure of the CA key: nothing is logged or
	// backed off, and the next Current tries again.
	Bound func(ctx context.Context) (context.Context, context.CancelFunc, error)
}

// Issuer is an issuer.Issuer whose authorities are in-memory
// intermediates under another Issuer's. It is safe for concurrent use.
type Issuer struct {
	inner issuer.Issuer
	opts  Options

	mu  sync.Mutex
	cur *current // nil: none yet
	// flight is the intermediate being signed now, if any.
	flight *flight
	// After a failure, no new attempt before retryAt; the wait doubles
	// per consecutive failure up to maxRetry.
	lastErr   error
	failedFor *authority.Authority // the parent lastErr is of
	retryAt   time.Time
	backoff   time.Duration
	loggedErr string
	signed    int
}

type current struct {
	parent     *authority.Authority
	generation string
	auth       *authority.Authority
}

type flight struct {
	parent *authority.Authority
	done   chan struct{}
	err    error
}

// New wraps inner.
func New(inner issuer.Issuer, opts Options) (*Issuer, error) {
	if inner == nil || opts.SignerName == "" || opts.Replica == "" {
		return nil, errors.New("an intermediate needs an issuer, a signer name and a replica identity")
	}
	if opts.MaxLifetime <= 0 || opts.RenewBefore < opts.MaxLifetime || opts.Validity <= opts.RenewBefore {
		return nil, fmt.Errorf("intermediate of %s: need validity (%s) > renewBefore (%s) ≥ maxLifetime (%s) > 0",
			opts.SignerName, opts.Validity, opts.RenewBefore, opts.MaxLifetime)
	}
	if opts.Backdate < 0 || opts.Backdate >= opts.Validity {
		return nil, fmt.Errorf("intermediate of %s: backdate %s must be in [0, validity)", opts.SignerName, opts.Backdate)
	}
	if opts.SignTimeout <= 0 {
		opts.SignTimeout = defaultSignTimeout
	}
	if opts.Wait <= 0 {
		opts.Wait = defaultWait
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Logger.GetSink() == nil {
		opts.Logger = klog.Background()
	}
	return &Issuer{inner: inner, opts: opts}, nil
}

// Current returns the intermediate of the generation that issues now,
// signing one first (with that generation's CA key) when there is none,
// it belongs to another generation, or it has less than MaxLifetime left.
// It starts the signing of a successor in the background once less than
// RenewBefore is left, and keeps answering the current one meanwhile,
// also when that signing fails. Errors match issuer.ErrUnavailable.
func (i *Issuer) Current() (*authority.Authority, string, error) {
	deadline := i.opts.Clock.Now().Add(i.opts.Wait)
	for {
		parent, gen, err := i.inner.Current()
		if err != nil {
			return nil, "", err
		}
		now := i.opts.Clock.Now()
		i.mu.Lock()
		if c := i.cur; c != nil && c.parent == parent {
			left := c.auth.Certificate().NotAfter.Sub(now)
			if left >= i.opts.MaxLifetime {
				if left < i.opts.RenewBefore && chainEnd(parent).After(c.auth.Certificate().NotAfter) {
					i.startLocked(parent, gen, now)
				}
				i.mu.Unlock()
				return c.auth, gen, nil
			}
		}
		f := i.startLocked(parent, gen, now)
		lastErr := i.lastErr
		i.mu.Unlock()
		if f == nil { // the last attempt for parent failed a moment ago
			return nil, "", i.unavailable(gen, parent, lastErr)
		}
		wait := deadline.Sub(now)
		if wait <= 0 {
			return nil, "", fmt.Errorf("%w: signer %s: the intermediate CA of generation %s is still being signed", issuer.ErrUnavailable, i.opts.SignerName, gen)
		}
		t := i.opts.Clock.NewTimer(wait)
		select {
		case <-f.done:
			t.Stop()
		case <-t.C():
			return nil, "", fmt.Errorf("%w: signer %s: the intermediate CA of generation %s is still being signed (waited %s)", issuer.ErrUnavailable, i.opts.SignerName, gen, i.opts.Wait)
		}
		if f.err != nil && f.parent == parent {
			return nil, "", i.unavailable(gen, parent, f.err)
		}
		// Signed (or signed for another generation): look again.
	}
}

func (i *Issuer) unavailable(gen string, parent *authority.Authority, err error) error {
	if err == nil {
		err = errors.New("not signed yet")
	}
	return fmt.Errorf("%w: signer %s: no intermediate CA can issue: signing one with generation %s's key %s failed: %w",
		issuer.ErrUnavailable, i.opts.SignerName, gen, parent.Signer().URI(), err)
}

// Reserve is the wrapped Issuer's: a leaf ends before its intermediate,
// and is reserved under the generation whose key signed the intermediate.
func (i *Issuer) Reserve(ctx context.Context, generation string, notAfter time.Time) error {
	return i.inner.Reserve(ctx, generation, notAfter)
}

// Signed is how many intermediates this Issuer has signed.
func (i *Issuer) Signed() int {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.signed
}

// startLocked returns the flight signing an intermediate under parent,
// starting one unless one is under way or the last failure is too recent
// (then nil). A flight for another parent is returned as is: the caller
// waits for it and looks again. i.mu is held.
func (i *Issuer) startLocked(parent *authority.Authority, gen string, now time.Time) *flight {
	if i.flight != nil {
		return i.flight
	}
	if i.lastErr != nil && i.failedFor == parent && now.Before(i.retryAt) {
		return nil
	}
	f := &flight{parent: parent, done: make(chan struct{})}
	i.flight = f
	go i.sign(f, gen)
	return f
}

// sign makes a key and has parent's CA key sign its certificate.
func (i *Issuer) sign(f *flight, gen string) {
	ctx, cancel := context.WithTimeout(context.Background(), i.opts.SignTimeout)
	defer cancel()
	auth, fenced, err := i.bounded(ctx, f.parent)
	now := i.opts.Clock.Now()
	i.mu.Lock()
	i.flight = nil
	f.err = err
	if fenced {
		i.mu.Unlock()
		close(f.done)
		return
	}
	if err != nil {
		if i.failedFor != f.parent {
			i.backoff = 0
		}
		i.lastErr, i.failedFor = err, f.parent
		i.backoff = min(max(2*i.backoff, firstRetry), maxRetry)
		i.retryAt = now.Add(i.backoff)
		if msg := err.Error(); msg != i.loggedErr {
			i.loggedErr = msg
			i.opts.Logger.Error(err, "Signing an intermediate CA failed; leaves are signed with the current one while it has maxLifetime left, and wait otherwise",
				"signer", i.opts.SignerName, "generation", gen, "caKey", f.parent.Signer().URI(), "retryIn", i.backoff)
		}
	} else {
		i.cur = &current{parent: f.parent, generation: gen, auth: auth}
		i.lastErr, i.failedFor, i.backoff, i.loggedErr = nil, nil, 0, ""
		i.signed++
		c := auth.Certificate()
		i.opts.Logger.Info("Signed an intermediate CA; its key is in this process's memory only",
			"signer", i.opts.SignerName, "generation", gen, "replica", i.opts.Replica, "caKey", f.parent.Signer().URI(),
			"serial", c.SerialNumber.Text(16), "notBefore", c.NotBefore.UTC().Format(time.RFC3339), "notAfter", c.NotAfter.UTC().Format(time.RFC3339))
	}
	i.mu.Unlock()
	if i.opts.Observe != nil {
		var cert *x509.Certificate
		if auth != nil {
			cert = auth.Certificate()
		}
		i.opts.Observe(cert, err)
	}
	close(f.done)
}

// bounded is issue under opts.Bound; fenced says Bound refused or cut it.
func (i *Issuer) bounded(ctx context.Context, parent *authority.Authority) (*authority.Authority, bool, error) {
	if i.opts.Bound == nil {
		auth, err := i.issue(ctx, parent)
		return auth, false, err
	}
	bctx, cancel, err := i.opts.Bound(ctx)
	if err != nil {
		return nil, true, fmt.Errorf("not signed: %w", err)
	}
	defer cancel()
	auth, err := i.issue(bctx, parent)
	if err != nil && bctx.Err() != nil && ctx.Err() == nil {
		// Cut by the bound, not by SignTimeout.
		return nil, true, fmt.Errorf("cut off: %w", context.Cause(bctx))
	}
	return auth, false, err
}

// issue generates a key and its certificate under parent.
func (i *Issuer) issue(ctx context.Context, parent *authority.Authority) (*authority.Authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generating the intermediate's key: %w", err)
	}
	cert, err := parent.SignIntermediate(ctx, i.template(), key.Public(), authority.Policy{
		Lifetime: i.opts.Validity, Backdate: i.opts.Backdate,
		// Less than a whole leaf's lifetime could issue nothing.
		MinLifetime: i.opts.MaxLifetime, Now: i.opts.Clock.Now,
	})
	if err != nil {
		return nil, err
	}
	mk, err := newMemoryKey(key, cert)
	if err != nil {
		return nil, err
	}
	return authority.New(cert, parent.Chain(), mk)
}

// template names the signer name and the replica: in the subject (a CN
// of at most 64 characters) and, whole, in a URI SAN.
func (i *Issuer) template() *x509.Certificate {
	cn := "keyward intermediate " + i.opts.Replica
	if r := []rune(cn); len(r) > 64 {
		cn = string(r[:64])
	}
	return &x509.Certificate{
		Subject: pkix.Name{CommonName: cn},
		URIs:    []*url.URL{BindingURI(i.opts.SignerName, i.opts.Replica)},
	}
}

// BindingURI is the URI SAN of an intermediate of signerName made by
// replica.
func BindingURI(signerName, replica string) *url.URL {
	return &url.URL{Scheme: "urn", Opaque: "keyward:intermediate:" + url.PathEscape(signerName) + ":" + url.PathEscape(replica)}
}

// chainEnd is when the first certificate of a's chain ends: no
// intermediate under a outlives it.
func chainEnd(a *authority.Authority) time.Time {
	var end time.Time
	for _, c := range a.Chain() {
		if end.IsZero() || c.NotAfter.Before(end) {
			end = c.NotAfter
		}
	}
	return end
}

// memoryKey is the intermediate's key as a backends.Signer. Its URI names
// the certificate, never the key.
type memoryKey struct {
	backends.KeyInfo
	key *ecdsa.PrivateKey
}

func newMemoryKey(key *ecdsa.PrivateKey, cert *x509.Certificate) (*memoryKey, error) {
	info, err := backends.NewKeyInfo(key.Public(), backends.ECDSAP256SHA256, "",
		"memory:intermediate?serial="+cert.SerialNumber.Text(16))
	if err != nil {
		return nil, err
	}
	return &memoryKey{KeyInfo: info, key: key}, nil
}

// Sign implements crypto.Signer.
func (k *memoryKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), digest, opts)
}

// SignContext signs in memory.
func (k *memoryKey) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, "sign", k.URI(), "", err)
	}
	if err := k.Algorithm().CheckOpts(opts); err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "sign", k.URI(), "", err)
	}
	if len(digest) != k.Algorithm().Hash().Size() {
		return nil, backends.Errorf(backends.ErrPermanent, "sign", k.URI(), "", "digest is %d bytes, want %d", len(digest), k.Algorithm().Hash().Size())
	}
	sig, err := ecdsa.SignASN1(rand.Reader, k.key, digest)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, "sign", k.URI(), "", err)
	}
	return sig, nil
}

// Close does nothing: a leaf being signed may still use the key; it is
// dropped with the intermediate.
func (k *memoryKey) Close() error { return nil }

// String never shows the key (%v of the Signer in a log line).
func (k *memoryKey) String() string { return "intermediate key " + k.URI() }

// GoString never shows the key (%#v).
func (k *memoryKey) GoString() string { return k.String() }
