package signer

import (
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
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
	h, err := newHealthKey(sw, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
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
	h2, err := newHealthKey(cancelledKey{key}, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
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

// failOnce makes h's last signature a transient backend failure.
func failOnce(t *testing.T, h *healthKey, hk *hungKey) {
	t.Helper()
	res := startSign(h, context.Background())
	recv(t, hk.entered, "the call to reach the backend") <- &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	if r := recv(t, res, "the failure"); !backends.IsTransient(r.err) {
		t.Fatalf("sign: %v, want the transient failure", r.err)
	}
}

// eventually polls cond; the bound only turns a hang (the bug) into a failure.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("still waiting for %s", what)
		}
	}
}

func TestHealthKeyIsUnreadyWhileACallIsStuckAndReadyWhenOneAnswers(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	h, err := newHealthKey(hk, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	late := make(chan struct{}, 2)
	h.late = func(err error) { h.recordLate(err); late <- struct{}{} }

	first := abandon(t, h, hk, clk, 30*time.Second)
	second := abandon(t, h, hk, clk, 30*time.Second)
	clk.Step(probeEvery)
	var se *stuckError
	if err := h.check(); !errors.As(err, &se) || se.N != 2 || se.Oldest != time.Minute+probeEvery {
		t.Fatalf("check with 2 calls stuck: %v; want unready, 2 calls stuck, the oldest for 1m10s", err)
	}

	// A late failure frees its slot but says nothing new.
	first <- io.ErrUnexpectedEOF
	recv(t, late, "the late failure")
	if err := h.check(); !errors.As(err, &se) || se.N != 1 {
		t.Fatalf("check with 1 call stuck: %v; want unready, 1 call stuck", err)
	}
	if n := hk.calls.Load(); n != 2 {
		t.Fatalf("%d backend calls, want 2: no probe while a call is stuck", n)
	}

	// A late success: the backend answers again.
	second <- nil
	recv(t, late, "the late success")
	if err := h.check(); err != nil {
		t.Fatalf("not ready after a stuck call answered: %v", err)
	}
}

func TestHealthKeyCloseCancelsAProbeAndWaitsForItBeforeClosingTheBackend(t *testing.T) {
	hk := newHungKey(t, true)
	clk := clocktesting.NewFakeClock(time.Now())
	h, err := newHealthKey(hk, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	failOnce(t, h, hk)
	if err := h.check(); err == nil {
		t.Fatal("ready after a failed signature")
	}
	recv(t, hk.entered, "the probe to reach the backend")

	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	if err := recv(t, closed, "Close"); err != nil {
		t.Fatal(err)
	}
	if !hk.closed.Load() {
		t.Fatal("the backend key was not closed")
	}
	if n := hk.runningAtClose.Load(); n != 0 {
		t.Fatalf("the backend key was closed under %d running calls (the probe)", n)
	}
	if n := hk.cancelled.Load(); n != 1 {
		t.Fatalf("%d backend calls ended by cancellation, want 1: Close cancels the probe", n)
	}
	h.mu.Lock()
	probing := h.probing
	h.mu.Unlock()
	if probing {
		t.Fatal("a probe still runs after Close")
	}

	// No probe starts after Close.
	clk.Step(probeEvery)
	_ = h.check()
	if n := hk.calls.Load(); n != 2 {
		t.Fatalf("%d backend calls, want 2 (the failure and one probe)", n)
	}
}

func TestHealthKeyCloseWaitsForAHungBackendAtMostCloseWait(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	h, err := newHealthKey(hk, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	failOnce(t, h, hk)
	_ = h.check()
	release := recv(t, hk.entered, "the probe to reach the backend")
	defer func() { release <- nil }()

	closed := make(chan error, 1)
	go func() { closed <- h.Close() }()
	eventually(t, "Close to wait on the clock", clk.HasWaiters)
	select {
	case <-closed:
		t.Fatal("Close returned before CloseWait passed with a call in the backend")
	default:
	}
	clk.Step(defaultCloseWait)
	if err := recv(t, closed, "Close after CloseWait"); err != nil {
		t.Fatal(err)
	}
	if !hk.closed.Load() {
		t.Fatal("the backend key was not closed")
	}
}

// A backend call stuck for stuckTooLong makes /healthz fail, so that
// kubelet restarts a process whose HSM library hangs; one stuck for less
// leaves it alive (only unready), and an answer clears it.
func TestHealthKeyIsNotAliveAfterACallStuckTooLong(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	h, err := newHealthKey(hk, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	late := make(chan struct{}, 1)
	h.late = func(err error) { h.recordLate(err); late <- struct{}{} }
	release := abandon(t, h, hk, clk, 30*time.Second)
	if err := h.alive(); err != nil {
		t.Fatalf("alive after a call stuck for 30s: %v", err)
	}
	clk.Step(stuckTooLong)
	if err := h.alive(); err == nil {
		t.Fatal("alive with a call stuck for over stuckTooLong")
	}
	release <- nil
	recv(t, late, "the late answer")
	if err := h.alive(); err != nil {
		t.Fatalf("not alive after the stuck call answered: %v", err)
	}
}
