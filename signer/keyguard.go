package signer

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/keyward/keyward/backends"
	"k8s.io/utils/clock"
)

// Defaults of keyOptions.
const (
	// defaultMaxStuck bounds the backend calls whose caller gave up but that
	// have not returned. Each holds a goroutine and, with PKCS#11, one of the
	// token's sessions (16 by default, one kept by crypto11): four stuck
	// calls leave enough for the default four workers and a probe, and four
	// calls in a row that outlived their deadline are evidence enough that
	// the backend hangs. Beyond it, signatures fail at once instead of
	// feeding a hung device.
	defaultMaxStuck = 4
	// defaultCloseWait bounds how long Close waits for calls still in the
	// backend before closing the key under them.
	defaultCloseWait = 5 * time.Second
)

// errNotSent marks a signature refused before it reached the backend: its
// context had ended, too many calls were stuck, or the key was closed.
var errNotSent = errors.New("not sent to the backend")

// signObserver is told about every call that reached the backend, exactly
// once, with how long it took and what it returned: for a call whose caller
// gave up (its context ended first), when the caller is freed, with the
// error the caller got; its late result is not observed again. A signature
// refused before reaching the backend (context already ended, too many calls
// stuck, key closed) is not observed. backend is the key URI's scheme. It
// runs on the signing goroutine and must not block.
type signObserver func(backend string, d time.Duration, err error)

// keyOptions tune how a CA key is guarded and probed.
type keyOptions struct {
	// Clock measures durations and paces probes (default the real clock).
	Clock clock.Clock
	// MaxStuck: while this many calls outlived their caller's context and
	// have not returned, no new call reaches the backend. Calls already in
	// the backend when it hangs may all become stuck, so up to MaxStuck +
	// (concurrent callers − 1) can be stuck at once; a new call never adds
	// to them. Default defaultMaxStuck; negative is refused.
	MaxStuck int
	// CloseWait bounds how long Close waits for backend calls still running
	// (default defaultCloseWait).
	CloseWait time.Duration
	// Observer, if set, is told about every backend call (see signObserver).
	Observer signObserver
}

func (o keyOptions) withDefaults() (keyOptions, error) {
	if o.MaxStuck < 0 {
		return o, &backends.OptionError{Option: "MaxStuck", Reason: fmt.Sprintf("%d is negative", o.MaxStuck)}
	}
	if o.CloseWait < 0 {
		return o, &backends.OptionError{Option: "CloseWait", Reason: fmt.Sprintf("%s is negative", o.CloseWait)}
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.MaxStuck == 0 {
		o.MaxStuck = defaultMaxStuck
	}
	if o.CloseWait == 0 {
		o.CloseWait = defaultCloseWait
	}
	if o.Observer == nil {
		o.Observer = func(string, time.Duration, error) {}
	}
	return o, nil
}

// stuckError says how many backend calls outlived their caller and are still
// running, and for how long the oldest has run.
type stuckError struct {
	N      int           // calls whose caller gave up and that have not returned
	Oldest time.Duration // since the oldest of them was sent to the backend
}

func (e *stuckError) Error() string {
	calls := "calls"
	if e.N == 1 {
		calls = "call"
	}
	return fmt.Sprintf("the backend has %d %s stuck, the oldest for %s", e.N, calls, e.Oldest)
}

// keyGuard is a CA key whose signatures never hold their caller past its
// context, even when the backend call cannot be interrupted (a PKCS#11
// C_Sign may block forever): the call runs on its own goroutine and is left
// to finish alone ("stuck") when the context ends first. At most MaxStuck
// calls may be stuck; beyond that signatures fail at once without reaching
// the backend. A stuck call's late result is never returned to anyone. It is
// safe for concurrent use.
type keyGuard struct {
	backends.Signer
	opts    keyOptions
	backend string
	// late, if set, receives the error (nil: success) of a stuck call that
	// returned. Set before the first signature.
	late func(err error)

	calls sync.WaitGroup // backend calls running

	mu     sync.Mutex
	stuck  map[*guardedCall]struct{}
	closed bool
}

// guardedCall is one backend call. finished and abandoned are guarded by
// keyGuard.mu; done holds the result for a caller still waiting.
type guardedCall struct {
	began     time.Time
	done      chan signResult
	finished  bool
	abandoned bool
}

type signResult struct {
	sig []byte
	err error
}

func newKeyGuard(k backends.Signer, o keyOptions) (*keyGuard, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("guarding CA key %s: %w", k.URI(), err)
	}
	scheme, _, _ := strings.Cut(k.URI(), ":")
	return &keyGuard{Signer: k, opts: o, backend: scheme, stuck: map[*guardedCall]struct{}{}}, nil
}

// SignContext signs on the backend and returns when the backend answers or
// ctx ends, whichever comes first.
func (g *keyGuard) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, g.refuse(backends.ErrTransient, err)
	}
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return nil, g.refuse(backends.ErrPermanent, errors.New("the key is closed"))
	}
	if n := len(g.stuck); n >= g.opts.MaxStuck {
		err := g.stuckLocked()
		g.mu.Unlock()
		return nil, g.refuse(backends.ErrTransient, err)
	}
	c := &guardedCall{began: g.opts.Clock.Now(), done: make(chan signResult, 1)}
	g.calls.Add(1)
	g.mu.Unlock()

	if ctx.Done() == nil { // never ends: nothing to guard against
		sig, err := g.Signer.SignContext(ctx, digest, opts)
		g.calls.Done()
		g.opts.Observer(g.backend, g.opts.Clock.Since(c.began), err)
		return sig, err
	}
	// The call may outlive this one: it gets its own copy of digest.
	go g.call(ctx, c, append([]byte(nil), digest...), opts)
	select {
	case r := <-c.done:
		g.opts.Observer(g.backend, g.opts.Clock.Since(c.began), r.err)
		return r.sig, r.err
	case <-ctx.Done():
	}
	g.mu.Lock()
	if c.finished { // it answered as ctx ended: the answer counts
		g.mu.Unlock()
		r := <-c.done
		g.opts.Observer(g.backend, g.opts.Clock.Since(c.began), r.err)
		return r.sig, r.err
	}
	c.abandoned = true
	g.stuck[c] = struct{}{}
	g.mu.Unlock()
	d := g.opts.Clock.Since(c.began)
	what := "timed out"
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		what = "abandoned"
	}
	err := &backends.Error{Kind: backends.ErrTransient, Op: "sign", URI: g.URI(),
		Err: fmt.Errorf("sign %s after %s, the backend call still runs: %w", what, d, ctx.Err())}
	g.opts.Observer(g.backend, d, err)
	return nil, err
}

func (g *keyGuard) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return g.SignContext(context.Background(), digest, opts)
}

// call runs one backend call and hands its result to the caller, or, if the
// caller gave up, frees the call's stuck slot and tells late.
func (g *keyGuard) call(ctx context.Context, c *guardedCall, digest []byte, opts crypto.SignerOpts) {
	defer g.calls.Done()
	sig, err := g.Signer.SignContext(ctx, digest, opts)
	g.mu.Lock()
	c.finished = true
	abandoned := c.abandoned
	if abandoned {
		delete(g.stuck, c)
	} else {
		c.done <- signResult{sig, err} // buffered: never blocks
	}
	g.mu.Unlock()
	if abandoned && g.late != nil {
		g.late(err)
	}
}

func (g *keyGuard) refuse(kind, err error) error {
	return &backends.Error{Kind: kind, Op: "sign", URI: g.URI(), Err: fmt.Errorf("%w: %w", errNotSent, err)}
}

// stuckCalls returns a *stuckError when calls are stuck in the backend, or nil.
func (g *keyGuard) stuckCalls() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.stuck) == 0 {
		return nil
	}
	return g.stuckLocked()
}

func (g *keyGuard) stuckLocked() *stuckError {
	now := g.opts.Clock.Now()
	var oldest time.Duration
	for c := range g.stuck {
		oldest = max(oldest, now.Sub(c.began))
	}
	return &stuckError{N: len(g.stuck), Oldest: oldest}
}

// Close refuses new signatures, waits at most CloseWait for calls still in
// the backend (stuck ones included), then closes the backend key even if
// some have not returned: a hung device must not hold up shutdown.
func (g *keyGuard) Close() error {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	idle := make(chan struct{})
	go func() {
		g.calls.Wait()
		close(idle)
	}()
	select {
	case <-idle:
	case <-g.opts.Clock.After(g.opts.CloseWait):
	}
	return g.Signer.Close()
}
