//go:build cgo

// Package pkcs11 is the PKCS#11 key backend (SoftHSM2, network HSMs, cloud
// HSMs with a PKCS#11 module), built on github.com/ThalesGroup/crypto11.
//
//	pkcs11:token=keyward;object=ca-2026;id=%01?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-source=file:/etc/keyward/hsm/pin
//
// Each token gets one crypto11 context per process, shared by every Provider,
// with a bounded session pool and a non-zero wait for a free session; every
// open checks its PIN against the one the token accepted. When the module
// reports that the device, the session, the token or the key handle went
// away, the token is marked down and re-opened — C_Initialize, C_Login and
// finding the key again — without restarting the process.
package pkcs11

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
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
	// (default DefaultAllowedModules()). Paths are compared with symlinks
	// resolved.
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
//
// A module's initialisation and a token's login belong to the process, so
// tokens are shared by all Providers of a process: the first Provider to open
// a token sets its session pool and re-open interval, and the token is closed
// when the last Provider holding it is closed.
type Provider struct {
	opts Options

	mu     sync.Mutex
	tokens map[tokenKey]*held

	closed atomic.Bool // read by Signers without mu
}

// held is a token a Provider holds a reference on.
type held struct {
	tok  *token
	base uint64 // the token's re-opens when the Provider took it
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
	return &Provider{opts: opts, tokens: map[tokenKey]*held{}}, nil
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

// Reopens is how many times the tokens this Provider holds have been
// re-opened — the module initialised again and logged into — since it took
// them. Signers find their key again on the re-opened token before they next
// sign.
func (p *Provider) Reopens() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n uint64
	for _, h := range p.tokens {
		n += h.tok.reopens.Load() - h.base
	}
	return n
}

// Close releases every token; a token no other Provider holds is logged out
// of and closed. Signers of a closed Provider refuse to sign, permanently.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed.Store(true)
	var errs []error
	for k, h := range p.tokens {
		errs = append(errs, modules.release(h.tok))
		delete(p.tokens, k)
	}
	return errors.Join(errs...)
}

func errProviderClosed(op, uri string) error {
	return backends.Errorf(backends.ErrPermanent, op, uri, "", "the pkcs11 provider was closed")
}

// tokenFor returns the token for loc, opening it on first use, after
// checking the PIN from loc's pin-source against the token's: on every open,
// not only the first.
func (p *Provider) tokenFor(op string, loc location) (*token, error) {
	pin, err := loc.readPIN()
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, op, loc.String(), "pin-source", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, errProviderClosed(op, loc.String())
	}
	k := loc.tokenKey()
	if h, ok := p.tokens[k]; ok {
		if !h.tok.pinMatches(pin) {
			return nil, errPINIncorrect(op, loc)
		}
		return h.tok, nil
	}
	t, err := modules.acquire(op, loc, pin, p.opts)
	if err != nil {
		return nil, err
	}
	p.tokens[k] = &held{tok: t, base: t.reopens.Load()}
	return t, nil
}

// errPINIncorrect is the error for a PIN the token refused, or that differs
// from the PIN the token was opened with. It never carries the PIN.
func errPINIncorrect(op string, loc location) error {
	return backends.Wrap(backends.ErrPermanent, op, loc.String(), "pin-source",
		fmt.Errorf("PIN incorrect: the token refused the PIN from this pin-source: %w (%w)", p11.Error(p11.CKR_PIN_INCORRECT), backends.ErrLoginRefused))
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
	key, gen, err := t.find("open", loc)
	if err != nil {
		return nil, err
	}
	id := loc.id
	if id == nil {
		id = t.keyID(key)
	}
	return newSigner(p, t, loc, key, gen, id)
}

// keyID reads the CKA_ID of key, or nil if it has none or cannot be read.
func (t *token) keyID(key crypto11.Signer) []byte {
	c, _, _, release, err := t.ready("open")
	if err != nil {
		return nil
	}
	defer release()
	a, err := c.GetAttribute(key, crypto11.CkaId)
	if err != nil || a == nil || len(a.Value) == 0 {
		return nil
	}
	return a.Value
}

// newSigner wraps key. Its version id is the token and the key's CKA_ID
// (id, read from the key when the URI names it by label only), so that a
// key has one version id however its URI names it; a key without CKA_ID
// is named by label.
func newSigner(p *Provider, t *token, loc location, key crypto11.Signer, gen uint64, id []byte) (*Signer, error) {
	alg := loc.alg
	if alg == "" {
		var err error
		if alg, err = backends.DefaultAlgorithm(key.Public()); err != nil {
			return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "open", loc.String(), "object", err)
		}
	}
	version := t.name() + "/id:" + hex.EncodeToString(id)
	if id == nil {
		version = t.name() + "/label:" + loc.object
	}
	info, err := backends.NewKeyInfo(key.Public(), alg, version, loc.String())
	if err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "open", loc.String(), "algorithm", err)
	}
	return &Signer{KeyInfo: info, prov: p, tok: t, loc: loc, key: key, gen: gen}, nil
}

// CreateKey generates a sign-only key pair on the token: non-extractable,
// sensitive, private, with the URI's object label and id (a random 16-byte id
// if the URI gives none). An existing key with that label or id is an error,
// and so is an algorithm= attribute other than the requested algorithm; both
// are checked before anything is generated. Creates on one token are
// serialised within the process, so two creates of one label cannot both
// succeed.
func (p *Provider) CreateKey(ctx context.Context, req backends.CreateKeyRequest) (backends.Signer, error) {
	loc, err := parseLocation("create-key", req.URI, p.opts.AllowedModules)
	if err != nil {
		return nil, err
	}
	if !slices.Contains(p.Algorithms(), req.Algorithm) {
		return nil, backends.Errorf(backends.ErrUnsupportedAlgorithm, "create-key", loc.String(), "algorithm",
			"%q is not supported by the pkcs11 backend (supported: %v)", req.Algorithm, p.Algorithms())
	}
	if loc.alg != "" && loc.alg != req.Algorithm {
		return nil, backends.Errorf(backends.ErrInvalidURI, "create-key", loc.String(), "algorithm",
			"the URI says algorithm=%s but the request is for %s", loc.alg, req.Algorithm)
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
	s, err := newSigner(p, t, loc, key, gen, loc.id)
	if err != nil {
		return nil, err
	}
	s.created = true
	return s, nil
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
	prov *Provider
	tok  *token
	loc  location

	mu  sync.Mutex
	key crypto11.Signer
	gen uint64 // token generation key belongs to
	// created: by CreateKey; only such a key may be destroyed.
	created bool
}

// Sign implements crypto.Signer.
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext signs on the token. ctx is checked before the call; a PKCS#11
// call itself cannot be interrupted, and the wait for a session is bounded by
// Options.PoolWaitTimeout. If the token has gone away it is re-opened and the
// signature attempted once more before a transient error is returned. A
// digest of the wrong length is refused, permanently, before any call, and so
// is every signature after the Provider was closed.
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
		key, gen, err := s.current("sign")
		if err != nil {
			return nil, err
		}
		sig, epoch, err := s.tok.sign(key, gen, digest, opts)
		if err == nil {
			return sig, nil
		}
		if errors.Is(err, errTokenClosed) {
			return nil, errProviderClosed("sign", s.URI())
		}
		lastErr = err
		if !needsReopen(err) {
			return nil, backends.Wrap(classify(err), "sign", s.URI(), "", err)
		}
		s.tok.failed(gen, epoch, err)
	}
	return nil, backends.Wrap(backends.ErrTransient, "sign", s.URI(), "token", lastErr)
}

// current returns the key handle for the token's current generation,
// re-opening the token and finding the key again if needed; op names the
// operation in its errors.
func (s *Signer) current(op string) (crypto11.Signer, uint64, error) {
	if s.prov.closed.Load() {
		return nil, 0, errProviderClosed(op, s.URI())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.key != nil && s.tok.live(s.gen) {
		return s.key, s.gen, nil
	}
	key, gen, err := s.tok.find(op, s.loc)
	if err != nil {
		if errors.Is(err, errTokenClosed) {
			return nil, 0, errProviderClosed(op, s.URI())
		}
		// The key was there when we opened it: while the token recovers,
		// "not found" is transient.
		if errors.Is(err, backends.ErrNotFound) {
			return nil, 0, backends.Wrap(backends.ErrTransient, op, s.URI(), "token", fmt.Errorf("key not visible while the token recovers: %w", errors.Unwrap(err)))
		}
		return nil, 0, err
	}
	if fp, _ := backends.Fingerprint(key.Public()); fp != s.Fingerprint() {
		return nil, 0, backends.Errorf(backends.ErrPermanent, op, s.URI(), "object", "after re-opening the token the key has fingerprint %s, was %s", fp, s.Fingerprint())
	}
	s.key, s.gen = key, gen
	return key, gen, nil
}

var _ backends.Destroyer = (*Signer)(nil)

// Destroy destroys the key pair's private and public key objects on the
// token (backends.Destroyer): C_DestroyObject, which no backup of the
// token undoes.
func (s *Signer) Destroy(ctx context.Context) (string, error) {
	if !s.created {
		return "", backends.NotCreated(s.URI())
	}
	if err := ctx.Err(); err != nil {
		return "", backends.Wrap(backends.ErrTransient, "destroy-key", s.URI(), "", err)
	}
	// The handle of the token's current session, found again if the token
	// was re-opened since: a stale handle may name another object.
	key, gen, err := s.current("destroy-key")
	if err != nil {
		return "", err
	}
	if err := s.tok.destroy(key, gen); err != nil {
		return "", backends.Wrap(classify(err), "destroy-key", s.URI(), "", err)
	}
	s.mu.Lock()
	s.key = nil
	s.mu.Unlock()
	return "destroyed the key pair on token " + s.tok.name(), nil
}

// Close drops the key handle; the token stays open for other keys until the
// Provider is closed.
func (s *Signer) Close() error {
	s.mu.Lock()
	s.key = nil
	s.mu.Unlock()
	return nil
}

// modules holds every module and token open in the process.
var modules = &moduleSet{byPath: map[string]*module{}}

// moduleSet is the process's open modules. Lock order: moduleSet.mu, then
// module.mu, then token.mu, then module.tmu.
type moduleSet struct {
	mu     sync.Mutex // held while a token is first opened or released
	byPath map[string]*module
}

// module is one PKCS#11 module, by canonical path, and its open tokens.
type module struct {
	path string

	// mu is held for reading by every use of a context of this module
	// (including re-opening one token) and for writing while every context
	// is closed because the module was finalised under them.
	mu    sync.RWMutex
	epoch uint64 // re-initialisations; guarded by mu

	tmu    sync.Mutex
	tokens map[tokenKey]*token // guarded by tmu
}

// acquire returns the process's token for loc with one more reference,
// opening it if needed. A token already open must have been opened with pin;
// a token that fails to open is not kept, so a wrong first PIN leaves nothing
// behind.
func (ms *moduleSet) acquire(op string, loc location, pin string, opts Options) (*token, error) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	m := ms.byPath[loc.modPath]
	if m == nil {
		m = &module{path: loc.modPath, tokens: map[tokenKey]*token{}}
		ms.byPath[loc.modPath] = m
	}
	k := loc.tokenKey()
	m.tmu.Lock()
	t := m.tokens[k]
	m.tmu.Unlock()
	if t != nil {
		if !t.pinMatches(pin) {
			return nil, errPINIncorrect(op, loc)
		}
		t.refs++
		return t, nil
	}
	t = &token{mod: m, key: k, loc: loc, pin: pin, opts: opts, refs: 1}
	same, err := t.firstOpen(op)
	if err != nil {
		return nil, err
	}
	if same != nil {
		// The token was open already under another name (label and
		// serial): its PIN is the one to match.
		if !same.pinMatches(pin) {
			return nil, errPINIncorrect(op, loc)
		}
		same.refs++
		m.tmu.Lock()
		m.tokens[k] = same
		m.tmu.Unlock()
		return same, nil
	}
	return t, nil
}

// release drops one reference on t and closes it with the last.
func (ms *moduleSet) release(t *token) error {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if t.refs--; t.refs > 0 {
		return nil
	}
	t.mod.tmu.Lock()
	for k, o := range t.mod.tokens {
		if o == t {
			delete(t.mod.tokens, k)
		}
	}
	t.mod.tmu.Unlock()
	t.mod.mu.RLock()
	defer t.mod.mu.RUnlock()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closed = true
	if t.ctx == nil {
		return nil
	}
	err := t.ctx.Close()
	t.ctx = nil
	return err
}

// reinit closes every context on the module, after a call found it
// finalised (CKR_CRYPTOKI_NOT_INITIALIZED) — by C_Finalize under another
// handle, or a module that lost its state. crypto11 finalises and unloads a
// module with its last context and initialises it with its next first one,
// so closing them all is what makes the next open initialise it again. If a
// context outside keyward keeps crypto11's module handle alive, nothing
// would, so with initialise set reinit calls C_Initialize itself. Tokens are
// re-opened by their next user, at once. Only the first caller for an epoch
// acts.
func (m *module) reinit(epoch uint64, initialise bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.epoch != epoch {
		return
	}
	m.epoch++
	m.tmu.Lock()
	toks := make([]*token, 0, len(m.tokens))
	for _, t := range m.tokens {
		toks = append(toks, t)
	}
	m.tmu.Unlock()
	for _, t := range toks {
		t.mu.Lock()
		if t.ctx != nil {
			_ = t.ctx.Close()
			t.ctx = nil
		}
		t.down = true
		t.lastAttempt = time.Time{}
		t.mu.Unlock()
	}
	if initialise {
		if h := p11.New(m.path); h != nil {
			// CKR_CRYPTOKI_ALREADY_INITIALIZED is what we want; any
			// other failure shows in the next open.
			_ = h.Initialize()
			// Unloads nothing: crypto11's handle holds the module.
			h.Destroy()
		}
	}
}

// isFinalized reports whether the module was found not initialised.
func isFinalized(err error) bool { return isCode(err, p11.CKR_CRYPTOKI_NOT_INITIALIZED) }

// token is one logged-in PKCS#11 token, re-opened when it goes down.
type token struct {
	mod  *module
	key  tokenKey
	loc  location // of the first open; its module path and token selector
	pin  string   // the PIN the token accepted
	opts Options  // of the Provider that opened it first
	// ident is the token's serial and label as the module reports them;
	// two selectors of one token share it. Set before the token is
	// registered.
	ident string

	refs    int           // Providers holding the token; guarded by modules.mu
	reopens atomic.Uint64 // successful re-opens

	createMu sync.Mutex // serialises CreateKey on this token

	// mu is held for reading by every operation on ctx and for writing
	// while ctx is replaced, so no call runs on a context being closed.
	mu          sync.RWMutex
	ctx         *crypto11.Context
	gen         uint64
	down        bool
	closed      bool
	lastAttempt time.Time
}

var errTokenClosed = errors.New("token closed")

// pinMatches compares pin with the PIN the token accepted, in constant time
// (of the PINs' hashes, so their lengths do not show either).
func (t *token) pinMatches(pin string) bool {
	a, b := sha256.Sum256([]byte(pin)), sha256.Sum256([]byte(t.pin))
	return subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// firstOpen opens a new token and registers it with its module, unless the
// module reports the same token open under another selector (token= and
// serial=): then it closes its context again and returns that token, whose
// login and PIN are the ones that count.
func (t *token) firstOpen(op string) (same *token, err error) {
	m := t.mod
	for attempt := 0; ; attempt++ {
		m.mu.RLock()
		epoch := m.epoch
		t.mu.Lock()
		err := t.openLocked()
		if err == nil {
			same, err = t.register()
		}
		t.mu.Unlock()
		m.mu.RUnlock()
		if err == nil || !isFinalized(err) || attempt == 2 {
			return same, t.openError(op, err)
		}
		m.reinit(epoch, attempt == 1)
	}
}

// register (locks as for openLocked) learns which token the new context is
// logged in to and adds t to its module, or returns the token already open
// there. Unless t was added, its context is closed.
func (t *token) register() (*token, error) {
	m := t.mod
	ident, err := m.identify(t.loc.token, t.loc.serial)
	var same *token
	if err == nil {
		m.tmu.Lock()
		for _, o := range m.tokens {
			if o.ident == ident {
				same = o
				break
			}
		}
		if same == nil {
			t.ident = ident
			m.tokens[t.key] = t
		}
		m.tmu.Unlock()
		if same == nil {
			return nil, nil
		}
	}
	_ = t.ctx.Close()
	t.ctx = nil
	return same, err
}

// identify names the token that a context for label or serial logs in to,
// by the serial and label the module reports, choosing the slot as crypto11
// does (the first whose token has that serial or label). It runs while such
// a context is open, so the module is initialised.
func (m *module) identify(label, serial string) (string, error) {
	h := p11.New(m.path)
	if h == nil {
		return "", fmt.Errorf("loading %s failed", m.path)
	}
	// Unloads nothing: crypto11's handle holds the module.
	defer h.Destroy()
	slots, err := h.GetSlotList(true)
	if err != nil {
		return "", fmt.Errorf("listing slots: %w", err)
	}
	for _, slot := range slots {
		ti, err := h.GetTokenInfo(slot)
		if err != nil {
			return "", fmt.Errorf("reading token info: %w", err)
		}
		if (ti.SerialNumber != "" && ti.SerialNumber == serial) || (ti.Label != "" && ti.Label == label) {
			return ti.SerialNumber + "\x00" + ti.Label, nil
		}
	}
	return "", fmt.Errorf("the token left the slot list after logging in: %w", p11.Error(p11.CKR_TOKEN_NOT_PRESENT))
}

// openLocked (t.mu held for writing, mod.mu for reading) makes a new
// context. Errors are crypto11's; openError classifies them.
func (t *token) openLocked() error {
	cfg := &crypto11.Config{
		Path:            t.mod.path,
		TokenLabel:      t.loc.token,
		TokenSerial:     t.loc.serial,
		Pin:             t.pin,
		MaxSessions:     t.opts.MaxSessions,
		PoolWaitTimeout: t.opts.PoolWaitTimeout,
	}
	t.lastAttempt = time.Now()
	c, err := crypto11.Configure(cfg)
	if err != nil {
		return err
	}
	t.ctx = c
	t.gen++
	t.down = false
	return nil
}

func (t *token) openError(op string, err error) error {
	if err == nil {
		return nil
	}
	if _, serr := os.Stat(t.mod.path); serr != nil {
		// crypto11 says only "failed to open module".
		return backends.Errorf(backends.ErrPermanent, op, t.loc.String(), "module-path",
			"cannot load the PKCS#11 module: %w (is the HSM's PKCS#11 library installed at this path?)", serr)
	}
	switch {
	case isTokenNotFound(err):
		which := "token=" + t.loc.token
		if t.loc.token == "" {
			which = "serial=" + t.loc.serial
		}
		return backends.Errorf(backends.ErrNotFound, op, t.loc.String(), "token",
			"the module has no token with %s (softhsm2-util --show-slots lists SoftHSM2's; is SOFTHSM2_CONF or the token directory right?)", which)
	case isCode(err, p11.CKR_PIN_INCORRECT):
		return errPINIncorrect(op, t.loc)
	case isCode(err, p11.CKR_PIN_INVALID, p11.CKR_PIN_EXPIRED, p11.CKR_PIN_LOCKED):
		var code p11.Error
		errors.As(err, &code)
		return backends.Wrap(backends.ErrPermanent, op, t.loc.String(), "pin-source", fmt.Errorf("the token refused the PIN: %w (%w)", code, backends.ErrLoginRefused))
	}
	return backends.Wrap(classify(err), op, t.loc.String(), "token", err)
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

// failed records that a call on generation gen (module epoch epoch) failed
// with err, for which needsReopen holds. A finalised module closes every
// token on it; anything else marks this token down. Only the first report
// for a generation counts; the next user re-opens the token.
func (t *token) failed(gen, epoch uint64, err error) {
	if isFinalized(err) {
		t.mod.reinit(epoch, false)
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.gen == gen {
		t.down = true
	}
}

// ready returns the live context, re-opening the token if it is down and
// ReopenInterval has passed since the last attempt. release ends the use of
// the context.
func (t *token) ready(op string) (c *crypto11.Context, gen, epoch uint64, release func(), err error) {
	m := t.mod
	for attempt := 0; attempt < 4; attempt++ {
		m.mu.RLock()
		t.mu.RLock()
		if t.closed {
			t.mu.RUnlock()
			m.mu.RUnlock()
			return nil, 0, 0, nil, backends.Wrap(backends.ErrPermanent, op, t.loc.String(), "", errTokenClosed)
		}
		if !t.down && t.ctx != nil {
			return t.ctx, t.gen, m.epoch, func() { t.mu.RUnlock(); m.mu.RUnlock() }, nil
		}
		t.mu.RUnlock()

		t.mu.Lock()
		var openErr error
		switch {
		case t.closed || (!t.down && t.ctx != nil):
			// Closed or re-opened meanwhile: look again.
		case t.opts.ReopenInterval-time.Since(t.lastAttempt) > 0:
			wait := t.opts.ReopenInterval - time.Since(t.lastAttempt)
			t.mu.Unlock()
			m.mu.RUnlock()
			return nil, 0, 0, nil, backends.Errorf(backends.ErrTransient, op, t.loc.String(), "token", "token is down; next re-open attempt in %s", wait.Round(time.Millisecond))
		default:
			if t.ctx != nil {
				_ = t.ctx.Close()
				t.ctx = nil
			}
			if openErr = t.openLocked(); openErr == nil {
				t.reopens.Add(1)
			}
		}
		epoch := m.epoch
		t.mu.Unlock()
		m.mu.RUnlock()
		if openErr == nil {
			continue
		}
		if isFinalized(openErr) && attempt < 2 {
			m.reinit(epoch, attempt == 1)
			continue
		}
		err := t.openError(op, openErr)
		if errors.Is(err, backends.ErrNotFound) {
			// The token was there before: its absence now is an outage.
			return nil, 0, 0, nil, backends.Wrap(backends.ErrTransient, op, t.loc.String(), "token", errors.Unwrap(err))
		}
		return nil, 0, 0, nil, err
	}
	return nil, 0, 0, nil, backends.Errorf(backends.ErrTransient, op, t.loc.String(), "token", "token went down again while it was re-opened")
}

func (t *token) find(op string, loc location) (crypto11.Signer, uint64, error) {
	c, gen, epoch, release, err := t.ready(op)
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
			t.failed(gen, epoch, err)
		}
		return nil, 0, backends.Wrap(classify(err), op, loc.String(), "object", err)
	}
	if len(keys) == 0 {
		part := "object"
		if loc.object == "" {
			part = "id"
		}
		var want []string
		if loc.object != "" {
			want = append(want, "label "+strconv.Quote(loc.object))
		}
		if loc.id != nil {
			want = append(want, fmt.Sprintf("id %x", loc.id))
		}
		return nil, 0, backends.Errorf(backends.ErrNotFound, op, loc.String(), part, "no private key with %s on the token", strings.Join(want, " and "))
	}
	if len(keys) > 1 {
		return nil, 0, backends.Errorf(backends.ErrPermanent, op, loc.String(), "object", "%d keys match: add id= to choose one", len(keys))
	}
	return keys[0], gen, nil
}

// signOnly are the attributes of a key pair keyward creates: it can sign and
// verify, and do nothing else — no decryption, unwrapping, key derivation or
// signature recovery with the private key, no encryption or wrapping with the
// public one. A CA key that can decrypt is an oracle for whoever can call it.
var (
	signOnlyPrivate = map[crypto11.AttributeType]bool{
		crypto11.CkaToken: true, crypto11.CkaPrivate: true, crypto11.CkaSensitive: true,
		crypto11.CkaExtractable: false, crypto11.CkaSign: true,
		crypto11.CkaDecrypt: false, crypto11.CkaUnwrap: false, crypto11.CkaDerive: false, crypto11.CkaSignRecover: false,
	}
	signOnlyPublic = map[crypto11.AttributeType]bool{
		crypto11.CkaVerify:  true,
		crypto11.CkaEncrypt: false, crypto11.CkaWrap: false, crypto11.CkaDerive: false, crypto11.CkaVerifyRecover: false,
	}
)

// generate makes a key pair unless a key with loc's label or id exists.
// The check and the generation run under the token's create lock.
func (t *token) generate(loc location, alg backends.Algorithm) (crypto11.Signer, uint64, error) {
	t.createMu.Lock()
	defer t.createMu.Unlock()
	c, gen, epoch, release, err := t.ready("create-key")
	if err != nil {
		return nil, 0, err
	}
	key, err := generateOn(c, loc, alg)
	release()
	if err != nil {
		if needsReopen(err) {
			t.failed(gen, epoch, err)
		}
		return nil, 0, backends.Wrap(classify(err), "create-key", loc.String(), "", err)
	}
	return key, gen, nil
}

func generateOn(c *crypto11.Context, loc location, alg backends.Algorithm) (crypto11.Signer, error) {
	for _, q := range []struct {
		part      string
		id, label []byte
	}{{"id", loc.id, nil}, {"object", nil, []byte(loc.object)}} {
		existing, err := c.FindKeyPairs(q.id, q.label)
		if err != nil {
			return nil, err
		}
		if len(existing) > 0 {
			what := "label " + strconv.Quote(loc.object)
			if q.part == "id" {
				what = fmt.Sprintf("id %x", loc.id)
			}
			return nil, backends.Errorf(backends.ErrPermanent, "create-key", loc.String(), q.part, "a key with %s already exists on the token", what)
		}
	}
	pub, err := crypto11.NewAttributeSetWithIDAndLabel(loc.id, []byte(loc.object))
	if err != nil {
		return nil, backends.Wrap(backends.ErrInvalidURI, "create-key", loc.String(), "id", err)
	}
	priv := pub.Copy()
	for _, x := range []struct {
		set   crypto11.AttributeSet
		attrs map[crypto11.AttributeType]bool
	}{{priv, signOnlyPrivate}, {pub, signOnlyPublic}} {
		for attr, v := range x.attrs {
			if err := x.set.Set(attr, v); err != nil {
				return nil, err
			}
		}
	}
	switch alg.Kind() {
	case backends.KindECDSA:
		return c.GenerateECDSAKeyPairWithAttributes(pub, priv, alg.Curve())
	case backends.KindRSA:
		return c.GenerateRSAKeyPairWithAttributes(pub, priv, alg.RSABits())
	}
	return nil, fmt.Errorf("no key generation for %s", alg)
}

// sign runs one signature on generation gen's context and reports the
// module epoch it ran in.
func (t *token) sign(key crypto11.Signer, gen uint64, digest []byte, opts crypto.SignerOpts) ([]byte, uint64, error) {
	t.mod.mu.RLock()
	defer t.mod.mu.RUnlock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	epoch := t.mod.epoch
	if t.closed {
		return nil, epoch, errTokenClosed
	}
	if t.gen != gen || t.down || t.ctx == nil {
		// The token was re-opened or went down since key was found.
		return nil, epoch, p11.Error(p11.CKR_OBJECT_HANDLE_INVALID)
	}
	sig, err := key.Sign(rand.Reader, digest, opts)
	return sig, epoch, err
}

// destroy deletes key (private and public objects) if gen is still the
// token's generation, under the same locks as sign.
func (t *token) destroy(key crypto11.Signer, gen uint64) error {
	t.mod.mu.RLock()
	defer t.mod.mu.RUnlock()
	t.mu.RLock()
	defer t.mu.RUnlock()
	if t.closed {
		return errTokenClosed
	}
	if t.gen != gen || t.down || t.ctx == nil {
		return p11.Error(p11.CKR_OBJECT_HANDLE_INVALID)
	}
	d, ok := key.(interface{ Delete() error })
	if !ok {
		return fmt.Errorf("the key handle (%T) cannot be deleted", key)
	}
	return d.Delete()
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
