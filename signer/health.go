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
	"k8s.io/utils/clock"
)

// Probe settings of a CA key whose last signature failed.
const (
	probeEvery   = 10 * time.Second
	probeTimeout = 5 * time.Second
)

// healthKey is a CA key that remembers whether its backend answered the last
// signature. /readyz reports a key whose last signature failed; while it
// does, a probe signature (at most one every probeEvery, none while the key
// is healthy) tells when the backend is back even if no request needs
// signing. It is safe for concurrent use.
type healthKey struct {
	backends.Signer
	clock clock.Clock

	mu        sync.Mutex
	lastErr   error
	lastProbe time.Time
	probing   bool
}

func newHealthKey(k backends.Signer, c clock.Clock) *healthKey {
	return &healthKey{Signer: k, clock: c}
}

func (k *healthKey) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := k.Signer.SignContext(ctx, digest, opts)
	k.record(err)
	return sig, err
}

func (k *healthKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), digest, opts)
}

// record keeps the outcome of a signature. A cancelled call (shutdown, a
// request that went away) says nothing about the backend.
func (k *healthKey) record(err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	k.mu.Lock()
	k.lastErr = err
	k.mu.Unlock()
}

// check returns why the key is not ready, or nil. When the last signature
// failed it starts a probe in the background if none ran for probeEvery.
func (k *healthKey) check() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.lastErr == nil {
		return nil
	}
	if now := k.clock.Now(); !k.probing && now.Sub(k.lastProbe) >= probeEvery {
		k.probing, k.lastProbe = true, now
		go k.probe()
	}
	return fmt.Errorf("CA key %s: last signature failed: %w", k.URI(), k.lastErr)
}

func (k *healthKey) probe() {
	defer func() {
		k.mu.Lock()
		k.probing = false
		k.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
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
