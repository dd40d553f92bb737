//go:build cgo

// Package pkcs11 is the PKCS#11 key backend (SoftHSM2, network HSMs, cloud
// HSMs with a PKCS#11 module), built on github.com/ThalesGroup/crypto11.
//
//	pkcs11:token=keyward;object=ca-2026;id=%01?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/keyward/pin
//
// Each token gets one crypto11 context with a bounded session pool and a
// non-zero wait for a free session. When the module reports that the device,
// the session, the token or the key handle went away, the token is marked
// down and re-opened — C_Initialize, C_Login and finding the key again —
// without restarting the process.
package pkcs11

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/keyward/keyward/backends"
	p11 "github.com/miekg/pkcs11"
	"github.com/thales-e-security/pool"
)

// Options configure a Provider. The zero value is usable.
type Options struct {
	// AllowedModules lists the PKCS#11 module paths URIs may name
	// (default DefaultAllowedModules()).
	AllowedModules []string
	// MaxSessions bounds the session pool of each token (default 16).
	MaxSessions int
	// PoolWaitTimeout bounds the wait for a free session (default 5s).
	PoolWaitTimeout time.Duration
	// ReopenInterval is the least time between two attempts to re-open a
	// token that went down (default 500ms).
	ReopenInterval time.Duration
}

// Provider opens keys on PKCS#11 tokens. It is safe for concurrent use.
type Provider struct {
	opts Options

	mu     sync.Mutex
	tokens map[tokenKey]*token

	reopens atomic.Uint64
}

var _ backends.KeyCreator = (*Provider)(nil)

// New validates and defaults opts. It loads no module.
func New(opts Options) (*Provider, error) {
	if len(opts.AllowedModules) == 0 {
		opts.AllowedModules = DefaultAllowedModules()
	}
	if opts.MaxSessions == 0 {
		opts.MaxSessions = 16
	}
	if opts.MaxSessions < 2 {
		return nil, fmt.Errorf("pkcs11: %w", &backends.OptionError{Option: "MaxSessions", Reason: fmt.Sprintf("%d is less than 2 (crypto11 keeps one session for itself)", opts.MaxSessions)})
	}
	if opts.PoolWaitTimeout <= 0 {
		opts.PoolWaitTimeout = 5 * time.Second
	}
	if opts.ReopenInterval <= 0 {
		opts.ReopenInterval = 500 * time.Millisecond
	}
	return &Provider{opts: opts, tokens: map[tokenKey]*token{}}, nil
}

func (*Provider) Scheme() string { return Scheme }

// Algorithms: ECDSA P-256/P-384 and RSA 2048/3072/4096 with PKCS#1 v1.5 and
// PSS. Ed25519 is not offered: crypto11 has no EdDSA support.
func (*Provider) Algorithms() []backends.Algorithm {
	var out []backends.Algorithm
	for _, a := range backends.AllAlgorithms() {
		if a.Kind() == backends.KindECDSA || a.Kind() == backends.KindRSA {
			out = append(out, a)
		}
	}
	return out
}

// Reopens is how many times a token that went down has been re-opened —
// the module initialised again and logged into — since New. Signers find
// their key again on the re-opened token before they next sign.
func (p *Provider) Reopens() uint64 { return p.reopens.Load() }

// Close logs out of and closes every token.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for k, t := range p.tokens {
		errs = append(errs, t.close())
		delete(p.tokens, k)
	}
	return errors.Join(errs...)
}

// tokenFor returns the shared token for loc, opening it on first use.
func (p *Provider) tokenFor(op string, loc location) (*token, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := loc.tokenKey()
	if t, ok := p.tokens[k]; ok {
		return t, nil
	}
	t := &token{loc: loc, opts: p.opts, reopens: &p.reopens}
	if err := t.open(op); err != nil {
		return nil, err
	}
	p.tokens[k] = t
	return t, nil
}

// Open finds the private key the URI names and loads its public key.
func (p *Provider) Open(ctx context.Context, req backends.OpenRequest) (backends.Signer, error) {
	loc, err := parseLocation("open", req.URI, p.opts.AllowedModules)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, "open", loc.String(), "", err)
	}
	t, err := p.tokenFor("open", loc)
	if err != nil {
		return nil, err
	}
	key, gen, err := t.find(loc)
	if err != nil {
		return nil, err
	}
	return newSigner(t, loc, key, gen)
}

func newSigner(t *token, loc location, key crypto11.Signer, gen uint64) (*Signer, error) {
	alg := loc.alg
	if alg == "" {
		var err error
		if alg, err = backends.DefaultAlgorithm(key.Public()); err != nil {
			return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "open", loc.String(), "object", err)
		}
	}
	version := t.name() + "/id:" + hex.EncodeToString(loc.id)
	if loc.id == nil {
		version = t.name() + "/label:" + loc.object
	}
	info, err := backends.NewKeyInfo(key.Public(), alg, version, loc.String())
	if err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "open", loc.String(), "algorithm", err)
	}
	return &Signer{KeyInfo: info, tok: t, loc: loc, key: key, gen: gen}, nil
}

// CreateKey generates a key pair on the token: non-extractable, sensitive,
// private, with the URI's object label and id (a random 16-byte id if the
// URI gives none). An existing key with that label or id is an error.
func (p *Provider) CreateKey(ctx context.Context, req backends.CreateKeyRequest) (backends.Signer, error) {
	loc, err := parseLocation("create-key", req.URI, p.opts.AllowedModules)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(p.Algorithms(), req.Algorithm) {
		return nil, backends.Errorf(backends.ErrUnsupportedAlgorithm, "create-key", loc.String(), "algorithm",
			"%q is not supported by the pkcs11 backend (supported: %v)", req.Algorithm, p.Algorithms())
	}
	if loc.object == "" {
		return nil, backends.Errorf(backends.ErrInvalidURI, "create-key", loc.String(), "object", "a new key needs a label (object=)")
	}
	if loc.id == nil {
		loc.id = make([]byte, 16)
		if _, err := rand.Read(loc.id); err != nil {
			return nil, err
		}
	}
	if def, _ := defaultFor(req.Algorithm); def != req.Algorithm {
		loc.alg = req.Algorithm
	}
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, "create-key", loc.String(), "", err)
	}
	t, err := p.tokenFor("create-key", loc)
	if err != nil {
		return nil, err
	}
	key, gen, err := t.generate(loc, req.Algorithm)
	if err != nil {
		return nil, err
	}
	return newSigner(t, loc, key, gen)
}

// defaultFor is the algorithm a key of alg's shape gets without an
// algorithm attribute.
func defaultFor(alg backends.Algorithm) (backends.Algorithm, error) {
	switch alg.Kind() {
	case backends.KindECDSA:
		return backends.DefaultAlgorithm(&ecdsa.PublicKey{Curve: alg.Curve()})
	case backends.KindRSA:
		return backends.ParseAlgorithm(fmt.Sprintf("rsa-%d-pkcs1-sha256", alg.RSABits()))
	}
	return alg, nil
}

// Signer is a private key on a PKCS#11 token.
type Signer struct {
	backends.KeyInfo
	tok *token
	loc location

	mu  sync.Mutex
	key crypto11.Signer
	gen uint64 // token generation key belongs to
}

// Sign implements crypto.Signer.
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext signs on the token. ctx is checked before the call; a PKCS#11
// call itself cannot be interrupted, and the wait for a session is bounded by
// Options.PoolWaitTimeout. If the token has gone away it is re-opened and the
// signature attempted once more before a transient error is returned. A
// digest of the wrong length is refused, permanently, before any call.
func (s *Signer) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := s.Algorithm().CheckOpts(opts); err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "sign", s.URI(), "", err)
	}
	if h := s.Algorithm().Hash(); h != 0 && len(digest) != h.Size() {
		return nil, backends.Errorf(backends.ErrPermanent, "sign", s.URI(), "", "digest is %d bytes, %v digests are %d", len(digest), h, h.Size())
	}
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		if err := ctx.Err(); err != nil {
			return nil, backends.Wrap(backends.ErrTransient, "sign", s.URI(), "", err)
		}
		key, gen, err := s.current()
		if err != nil {
			return nil, err
		}
		sig, err := s.tok.sign(key, gen, digest, opts)
		if err == nil {
			return sig, nil
		}
		lastErr = err
		if !needsReopen(err) {
			return nil, backends.Wrap(classify(err), "sign", s.URI(), "", err)
		}
		s.tok.markDown(gen)
	}
	return nil, backends.Wrap(backends.ErrTransient, "sign", s.URI(), "token", lastErr)
}

// current returns the key handle for the token's current generation,
// re-opening the token and finding the key again if needed.
func (s *Signer) current() (crypto11.Signer, uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil && s.tok.live(s.gen) {
		return s.key, s.gen, nil
	}
	key, gen, err := s.tok.find(s.loc)
	if err != nil {
		// The key was there when we opened it: while the token recovers,
		// "not found" is transient.
		if errors.Is(err, backends.ErrNotFound) {
			return nil, 0, backends.Wrap(backends.ErrTransient, "sign", s.URI(), "token", fmt.Errorf("key not visible while the token recovers: %w", errors.Unwrap(err)))
		}
		return nil, 0, err
	}
	if fp, _ := backends.Fingerprint(key.Public()); fp != s.Fingerprint() {
		return nil, 0, backends.Errorf(backends.ErrPermanent, "sign", s.URI(), "object", "after re-opening the token the key has fingerprint %s, was %s", fp, s.Fingerprint())
	}
	s.key, s.gen = key, gen
	return key, gen, nil
}

// Close drops the key handle; the token stays open for other keys until the
// Provider is closed.
func (s *Signer) Close() error {
	s.mu.Lock()
	s.key = nil
	s.mu.Unlock()
	return nil
}

// token is one logged-in PKCS#11 token, re-opened when it goes down.
type token struct {
	loc     location
	opts    Options
	reopens *atomic.Uint64 // the Provider's count of successful re-opens

	// mu is held for reading by every operation on ctx and for writing
	// while ctx is replaced, so no call runs on a context being closed.
	mu          sync.RWMutex
	ctx         *crypto11.Context
	gen         uint64
	down        bool
	lastAttempt time.Time
}

func (t *token) open(op string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.openLocked(op)
}

func (t *token) openLocked(op string) error {
	pin, err := t.loc.readPIN()
	if err != nil {
		return backends.Wrap(backends.ErrPermanent, op, t.loc.String(), "pin-source", err)
	}
	cfg := &crypto11.Config{
		Path:            t.loc.module,
		TokenLabel:      t.loc.token,
		TokenSerial:     t.loc.serial,
		Pin:             pin,
		MaxSessions:     t.opts.MaxSessions,
		PoolWaitTimeout: t.opts.PoolWaitTimeout,
	}
	t.lastAttempt = time.Now()
	c, err := crypto11.Configure(cfg)
	if err != nil {
		part := "token"
		switch {
		case isTokenNotFound(err):
			return backends.Wrap(backends.ErrNotFound, op, t.loc.String(), part, err)
		case isCode(err, p11.CKR_PIN_INCORRECT, p11.CKR_PIN_INVALID, p11.CKR_PIN_EXPIRED, p11.CKR_PIN_LOCKED):
			return backends.Wrap(backends.ErrPermanent, op, t.loc.String(), "pin-source", errors.New("the token refused the PIN"))
		}
		return backends.Wrap(classify(err), op, t.loc.String(), part, err)
	}
	t.ctx = c
	t.gen++
	t.down = false
	return nil
}

// isTokenNotFound reports whether err is crypto11.Configure's "no token
// with this label or serial". crypto11 v1.6.0 keeps that error unexported
// (errTokenNotFound) and returns it unwrapped, so its text is the only way
// to tell it from other Configure failures. The "token that does not exist"
// case of TestURIErrorsNameThePart fails if an upgrade changes the text.
func isTokenNotFound(err error) bool {
	return err != nil && err.Error() == "could not find PKCS#11 token"
}

// live reports whether generation gen is the current, working one.
func (t *token) live(gen uint64) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.gen == gen && !t.down && t.ctx != nil
}

// name is the token's label, or its serial when chosen by serial.
func (t *token) name() string {
	if t.loc.token != "" {
		return t.loc.token
	}
	return "serial:" + t.loc.serial
}

// markDown records that generation gen failed. Only the first report for a
// generation counts; the next user re-opens the token.
func (t *token) markDown(gen uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen == gen {
		t.down = true
	}
}

// ready returns the live context, re-opening the token if it is down and
// ReopenInterval has passed since the last attempt.
func (t *token) ready(op string) (*crypto11.Context, uint64, func(), error) {
	t.mu.RLock()
	if !t.down && t.ctx != nil {
		return t.ctx, t.gen, t.mu.RUnlock, nil
	}
	t.mu.RUnlock()

	t.mu.Lock()
	if t.down || t.ctx == nil {
		if wait := t.opts.ReopenInterval - time.Since(t.lastAttempt); wait > 0 {
			t.mu.Unlock()
			return nil, 0, nil, backends.Errorf(backends.ErrTransient, op, t.loc.String(), "token", "token is down; next re-open attempt in %s", wait.Round(time.Millisecond))
		}
		if t.ctx != nil {
			_ = t.ctx.Close()
			t.ctx = nil
		}
		if err := t.openLocked(op); err != nil {
			t.mu.Unlock()
			if errors.Is(err, backends.ErrNotFound) {
				// The token was there before: its absence now is an outage.
				return nil, 0, nil, backends.Wrap(backends.ErrTransient, op, t.loc.String(), "token", errors.Unwrap(err))
			}
			return nil, 0, nil, err
		}
		t.reopens.Add(1)
	}
	t.mu.Unlock()
	return t.ready(op)
}

func (t *token) find(loc location) (crypto11.Signer, uint64, error) {
	c, gen, release, err := t.ready("open")
	if err != nil {
		return nil, 0, err
	}
	var label []byte
	if loc.object != "" {
		label = []byte(loc.object)
	}
	keys, err := c.FindKeyPairs(loc.id, label)
	release()
	if err != nil {
		if needsReopen(err) {
			t.markDown(gen)
		}
		return nil, 0, backends.Wrap(classify(err), "open", loc.String(), "object", err)
	}
	if len(keys) == 0 {
		part := "object"
		if loc.object == "" {
			part = "id"
		}
		return nil, 0, backends.Errorf(backends.ErrNotFound, "open", loc.String(), part, "no private key with this label and id on the token")
	}
	if len(keys) > 1 {
		return nil, 0, backends.Errorf(backends.ErrPermanent, "open", loc.String(), "object", "%d keys match: add id= to choose one", len(keys))
	}
	return keys[0], gen, nil
}

func (t *token) generate(loc location, alg backends.Algorithm) (crypto11.Signer, uint64, error) {
	c, gen, release, err := t.ready("create-key")
	if err != nil {
		return nil, 0, err
	}
	defer release()
	if existing, err := c.FindKeyPairs(loc.id, nil); err == nil && len(existing) > 0 {
		return nil, 0, backends.Errorf(backends.ErrPermanent, "create-key", loc.String(), "id", "a key with this id already exists")
	}
	if existing, err := c.FindKeyPairs(nil, []byte(loc.object)); err == nil && len(existing) > 0 {
		return nil, 0, backends.Errorf(backends.ErrPermanent, "create-key", loc.String(), "object", "a key with this label already exists")
	}
	pub, err := crypto11.NewAttributeSetWithIDAndLabel(loc.id, []byte(loc.object))
	if err != nil {
		return nil, 0, backends.Wrap(backends.ErrInvalidURI, "create-key", loc.String(), "id", err)
	}
	priv := pub.Copy()
	for attr, v := range map[crypto11.AttributeType]bool{
		crypto11.CkaToken: true, crypto11.CkaPrivate: true, crypto11.CkaSensitive: true,
		crypto11.CkaExtractable: false, crypto11.CkaSign: true,
	} {
		if err := priv.Set(attr, v); err != nil {
			return nil, 0, err
		}
	}
	var key crypto11.Signer
	switch alg.Kind() {
	case backends.KindECDSA:
		key, err = c.GenerateECDSAKeyPairWithAttributes(pub, priv, alg.Curve())
	case backends.KindRSA:
		key, err = c.GenerateRSAKeyPairWithAttributes(pub, priv, alg.RSABits())
	}
	if err != nil {
		return nil, 0, backends.Wrap(classify(err), "create-key", loc.String(), "", err)
	}
	return key, gen, nil
}

// sign runs one signature on generation gen's context.
func (t *token) sign(key crypto11.Signer, gen uint64, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.gen != gen || t.down {
		// The token was re-opened or went down since key was found.
		return nil, p11.Error(p11.CKR_OBJECT_HANDLE_INVALID)
	}
	return key.Sign(rand.Reader, digest, opts)
}

func (t *token) close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ctx == nil {
		return nil
	}
	err := t.ctx.Close()
	t.ctx = nil
	return err
}

// needsReopen reports errors after which the token must be re-initialised
// and the key found again.
func needsReopen(err error) bool {
	return isCode(err,
		p11.CKR_DEVICE_ERROR, p11.CKR_DEVICE_REMOVED, p11.CKR_DEVICE_MEMORY,
		p11.CKR_SESSION_HANDLE_INVALID, p11.CKR_SESSION_CLOSED,
		p11.CKR_TOKEN_NOT_PRESENT, p11.CKR_TOKEN_NOT_RECOGNIZED,
		p11.CKR_CRYPTOKI_NOT_INITIALIZED, p11.CKR_USER_NOT_LOGGED_IN,
		p11.CKR_OBJECT_HANDLE_INVALID, p11.CKR_KEY_HANDLE_INVALID,
		p11.CKR_GENERAL_ERROR)
}

// classify maps an error from crypto11 or the module to a backends kind:
// transient when the device, the session or the wait for a session failed
// and a retry may succeed; permanent for everything else, notably the
// caller's mistakes (bad arguments, data or mechanism parameters) and
// crypto11's own refusals, which carry no PKCS#11 code.
func classify(err error) error {
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return backends.ErrTransient
	case errors.Is(err, pool.ErrTimeout):
		// No session came free within Options.PoolWaitTimeout.
		return backends.ErrTransient
	case needsReopen(err):
		return backends.ErrTransient
	case isCode(err, p11.CKR_MECHANISM_INVALID, p11.CKR_MECHANISM_PARAM_INVALID, p11.CKR_KEY_TYPE_INCONSISTENT,
		p11.CKR_KEY_FUNCTION_NOT_PERMITTED, p11.CKR_KEY_SIZE_RANGE, p11.CKR_DOMAIN_PARAMS_INVALID):
		return backends.ErrUnsupportedAlgorithm
	case isCode(err, p11.CKR_FUNCTION_FAILED, p11.CKR_SESSION_COUNT, p11.CKR_HOST_MEMORY):
		return backends.ErrTransient
	}
	return backends.ErrPermanent
}

func isCode(err error, codes ...uint) bool {
	var pe p11.Error
	if !errors.As(err, &pe) {
		return false
	}
	return slices.Contains(codes, uint(pe))
}
