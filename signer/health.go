package signer

import (
	"context"
	"crypto"
	_ "crypto/sha256" // hashes the readiness probe
	_ "crypto/sha512"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/keyward/keyward/backends"
)

// Probe settings of a CA key whose last signature failed.
const (
	probeEvery   = 10 * time.Second
	probeTimeout = 5 * time.Second
)

// healthKey is a CA key (guarded by a keyGuard) that remembers whether its
// backend answered the last signature. /readyz reports a key whose last
// signature failed or that has calls stuck in its backend. While the last
// signature failed and no call is stuck, a probe signature (at most one
// every probeEvery, none while the key is healthy) tells when the backend is
// back even if no request needs signing; while calls are stuck, the first
// of them to return successfully tells it instead. Probes run on a context
// that Close cancels. It is safe for concurrent use.
type healthKey struct {
	*keyGuard

	probeCtx   context.Context
	stopProbes context.CancelFunc
	probes     sync.WaitGroup

	mu        sync.Mutex
	lastErr   error
	lastProbe time.Time
	probing   bool
	closed    bool
}

// newHealthKey guards k with o and watches its health. It starts nothing.
func newHealthKey(k backends.Signer, o keyOptions) (*healthKey, error) {
	g, err := newKeyGuard(k, o)
	if err != nil {
		return nil, err
	}
	h := &healthKey{keyGuard: g}
	h.probeCtx, h.stopProbes = context.WithCancel(context.Background())
	g.late = h.recordLate
	return h, nil
}

func (k *healthKey) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := k.keyGuard.SignContext(ctx, digest, opts)
	k.record(err)
	return sig, err
}

func (k *healthKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), digest, opts)
}

// record keeps the outcome of a signature. A cancelled call (shutdown, a
// request that went away) or one that never reached the backend says
// nothing about the backend.
func (k *healthKey) record(err error) {
	if errors.Is(err, context.Canceled) || errors.Is(err, errNotSent) {
		return
	}
	k.mu.Lock()
	k.lastErr = err
	k.mu.Unlock()
}

// recordLate keeps the outcome of a stuck call that finally returned: a
// success means the backend answers again; a failure adds nothing to the
// error its caller already got.
func (k *healthKey) recordLate(err error) {
	if err == nil {
		k.record(nil)
	}
}

// check returns why the key is not ready, or nil. When the last signature
// failed and no call is stuck, it starts a probe in the background if none
// ran for probeEvery.
func (k *healthKey) check() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	stuck := k.stuckCalls()
	if stuck != nil {
		stuck = fmt.Errorf("CA key %s: %w", k.URI(), stuck)
	}
	if k.lastErr == nil {
		return stuck
	}
	if now := k.opts.Clock.Now(); stuck == nil && !k.closed && !k.probing && now.Sub(k.lastProbe) >= probeEvery {
		k.probing, k.lastProbe = true, now
		k.probes.Add(1)
		go k.probe()
	}
	return errors.Join(stuck, fmt.Errorf("CA key %s: last signature failed: %w", k.URI(), k.lastErr))
}

// stuckTooLong is how long a backend call may stay stuck before the
// process reports itself not alive (/healthz), so that kubelet restarts it:
// a PKCS#11 library whose C_Sign never returns is rarely cured without a
// fresh process.
const stuckTooLong = 5 * time.Minute

// alive is nil unless a backend call has been stuck for stuckTooLong.
func (k *healthKey) alive() error {
	var se *stuckError
	if err := k.stuckCalls(); errors.As(err, &se) && se.Oldest >= stuckTooLong {
		return fmt.Errorf("CA key %s: a backend call has been stuck for %s (over %s): restart needed", k.URI(), se.Oldest.Round(time.Second), stuckTooLong)
	}
	return nil
}

func (k *healthKey) probe() {
	defer k.probes.Done()
	defer func() {
		k.mu.Lock()
		k.probing = false
		k.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(k.probeCtx, probeTimeout)
	defer cancel()
	alg := k.Algorithm()
	in := []byte("keyward readiness probe")
	if h := alg.Hash(); h != 0 {
		d := h.New()
		d.Write(in)
		in = d.Sum(nil)
	}
	_, _ = k.SignContext(ctx, in, alg.SignerOpts())
}

// Close stops probing, then closes the guarded key. It cancels a running
// probe and waits for it, which is prompt even with a hung backend (the
// guard frees a probe as soon as its context ends); the guard then waits at
// most CloseWait for backend calls still running before closing the
// backend key.
func (k *healthKey) Close() error {
	k.mu.Lock()
	k.closed = true
	k.mu.Unlock()
	k.stopProbes()
	k.probes.Wait()
	return k.keyGuard.Close()
}
