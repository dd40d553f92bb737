package signer

import (
	"context"
	"crypto"
	"crypto/sha256"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	clocktesting "k8s.io/utils/clock/testing"
)

// switchKey fails every signature with a transient error while down is set.
type switchKey struct {
	backends.Signer
	down  atomic.Bool
	calls atomic.Int32
}

func (k *switchKey) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	k.calls.Add(1)
	if k.down.Load() {
		return nil, &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	}
	return k.Signer.SignContext(ctx, d, o)
}

func (k *switchKey) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), d, o)
}

func TestHealthKeyReportsAFailedBackendUntilAProbeSucceeds(t *testing.T) {
	key, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	sw := &switchKey{Signer: key}
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHealthKey(sw, clk)
	digest := sha256.Sum256([]byte("x"))
	sign := func() error { _, err := h.SignContext(context.Background(), digest[:], crypto.SHA256); return err }
	waitProbe := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			h.mu.Lock()
			probing := h.probing
			h.mu.Unlock()
			if !probing {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("probe did not finish")
			}
			time.Sleep(time.Millisecond)
		}
	}

	if err := h.check(); err != nil {
		t.Fatalf("a fresh key is not ready: %v", err)
	}
	sw.down.Store(true)
	if err := sign(); !backends.IsTransient(err) {
		t.Fatalf("sign while down: %v", err)
	}
	if err := h.check(); !backends.IsTransient(err) {
		t.Fatalf("check after a failed signature: %v, want the transient error", err)
	}
	waitProbe()
	calls := sw.calls.Load()
	if calls != 2 {
		t.Fatalf("%d signatures, want the request's and one probe", calls)
	}
	// A probe runs at most every probeEvery.
	if err := h.check(); err == nil {
		t.Fatal("ready while the backend is still down")
	}
	waitProbe()
	if n := sw.calls.Load(); n != calls {
		t.Fatalf("a second probe ran within %s", probeEvery)
	}

	// The backend is back; the next probe, due after probeEvery, finds it.
	sw.down.Store(false)
	clk.Step(probeEvery)
	if err := h.check(); err == nil {
		t.Fatal("ready before the probe answered")
	}
	waitProbe()
	if err := h.check(); err != nil {
		t.Fatalf("not ready after a successful probe: %v", err)
	}

	// A cancelled signature says nothing about the backend.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	h2 := newHealthKey(cancelledKey{key}, clk)
	_, _ = h2.SignContext(ctx, digest[:], crypto.SHA256)
	if err := h2.check(); err != nil {
		t.Fatalf("a cancelled signature made the key unready: %v", err)
	}
}

// cancelledKey returns the context's error, as a backend does when the
// caller gives up.
type cancelledKey struct{ backends.Signer }

func (k cancelledKey) SignContext(ctx context.Context, _ []byte, _ crypto.SignerOpts) ([]byte, error) {
	return nil, ctx.Err()
}
