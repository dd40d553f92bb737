package signer

import (
	"context"
	"crypto"
	"crypto/sha256"
	"errors"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	clocktesting "k8s.io/utils/clock/testing"
)

// hungKey blocks every signature until the test releases it, ignoring its
// context (as a PKCS#11 C_Sign may) unless honoursCtx is set.
type hungKey struct {
	backends.Signer
	honoursCtx bool
	// entered receives, for each call that reached the backend, the channel
	// that lets it return: send nil to sign, an error to fail.
	entered chan chan<- error

	calls          atomic.Int32
	running        atomic.Int32
	cancelled      atomic.Int32 // calls that returned because their context was cancelled
	closed         atomic.Bool
	runningAtClose atomic.Int32
}

func newHungKey(t *testing.T, honoursCtx bool) *hungKey {
	t.Helper()
	key, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	return &hungKey{Signer: key, honoursCtx: honoursCtx, entered: make(chan chan<- error, 16)}
}

func (k *hungKey) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	k.calls.Add(1)
	k.running.Add(1)
	defer k.running.Add(-1)
	release := make(chan error, 1)
	k.entered <- release
	var err error
	if k.honoursCtx {
		select {
		case err = <-release:
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.Canceled) {
				k.cancelled.Add(1)
			}
			return nil, ctx.Err()
		}
	} else {
		err = <-release
	}
	if err != nil {
		return nil, err
	}
	return k.Signer.SignContext(context.Background(), d, o)
}

func (k *hungKey) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), d, o)
}

func (k *hungKey) Close() error {
	k.runningAtClose.Store(k.running.Load())
	k.closed.Store(true)
	return k.Signer.Close()
}

// expiringCtx is a context whose deadline passes when the test says so.
type expiringCtx struct {
	context.Context
	done chan struct{}
	once sync.Once
}

func newExpiringCtx() *expiringCtx {
	return &expiringCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *expiringCtx) Done() <-chan struct{} { return c.done }

func (c *expiringCtx) Err() error {
	select {
	case <-c.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

func (c *expiringCtx) expire() { c.once.Do(func() { close(c.done) }) }

var testDigest = sha256.Sum256([]byte("x"))

// startSign signs in the background; the result arrives on the channel.
func startSign(k backends.Signer, ctx context.Context) <-chan signResult {
	res := make(chan signResult, 1)
	go func() {
		sig, err := k.SignContext(ctx, testDigest[:], crypto.SHA256)
		res <- signResult{sig, err}
	}()
	return res
}

// recv waits for ch. The bound only turns a hang (the bug) into a failure.
func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("still waiting for %s", what)
		panic("unreachable")
	}
}

// abandon makes one call stuck in hk's (context-ignoring) backend, its
// deadline passing after the given time, and returns what releases it.
func abandon(t *testing.T, k backends.Signer, hk *hungKey, clk *clocktesting.FakeClock, after time.Duration) chan<- error {
	t.Helper()
	ctx := newExpiringCtx()
	res := startSign(k, ctx)
	release := recv(t, hk.entered, "the call to reach the backend")
	clk.Step(after)
	ctx.expire()
	if r := recv(t, res, "the caller to be freed at its deadline"); r.err == nil {
		t.Fatal("a call past its deadline succeeded")
	}
	return release
}

func TestKeyGuardFreesTheCallerWhenTheDeadlinePassesInAHungBackend(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	g, err := newKeyGuard(hk, keyOptions{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	late := make(chan error, 1)
	g.late = func(err error) { late <- err }

	ctx := newExpiringCtx()
	res := startSign(g, ctx)
	release := recv(t, hk.entered, "the call to reach the backend")
	clk.Step(30 * time.Second)
	ctx.expire()
	r := recv(t, res, "the caller to be freed at its deadline")
	if r.sig != nil || !errors.Is(r.err, context.DeadlineExceeded) || !backends.IsTransient(r.err) {
		t.Fatalf("got %x, %v; want no signature and a transient deadline error", r.sig, r.err)
	}
	clk.Step(time.Minute)
	var se *stuckError
	if err := g.stuckCalls(); !errors.As(err, &se) || se.N != 1 || se.Oldest != 90*time.Second {
		t.Fatalf("stuck calls: %v; want 1, the oldest for 1m30s", err)
	}

	// The late answer frees the slot and reaches late, not the caller.
	release <- nil
	if err := recv(t, late, "the late result"); err != nil {
		t.Fatalf("late result: %v, want the backend's success", err)
	}
	if err := g.stuckCalls(); err != nil {
		t.Fatalf("still stuck after the call returned: %v", err)
	}
}

func TestKeyGuardRefusesSignaturesWithoutCallingTheBackendWhileMaxStuckAreStuck(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	g, err := newKeyGuard(hk, keyOptions{Clock: clk, MaxStuck: 2})
	if err != nil {
		t.Fatal(err)
	}
	late := make(chan error, 2)
	g.late = func(err error) { late <- err }
	first := abandon(t, g, hk, clk, 30*time.Second)
	second := abandon(t, g, hk, clk, 30*time.Second)

	r := recv(t, startSign(g, context.Background()), "a refusal")
	var se *stuckError
	if !errors.Is(r.err, errNotSent) || !backends.IsTransient(r.err) || !errors.As(r.err, &se) || se.N != 2 || se.Oldest != time.Minute {
		t.Fatalf("with 2 calls stuck: %v; want a transient refusal naming 2 calls stuck, the oldest for 1m", r.err)
	}
	if n := hk.calls.Load(); n != 2 {
		t.Fatalf("the backend was called %d times, want 2 (the refused call must not reach it)", n)
	}

	// One stuck call returns: its slot is free again.
	first <- nil
	recv(t, late, "the late result")
	res := startSign(g, context.Background())
	release := recv(t, hk.entered, "a call to reach the backend once a slot is free")
	release <- nil
	if r := recv(t, res, "the signature"); r.err != nil || len(r.sig) == 0 {
		t.Fatalf("sign once a slot is free: %v", r.err)
	}
	second <- nil
	recv(t, late, "the last late result")
}

type observation struct {
	backend string
	d       time.Duration
	err     error
}

func TestKeyGuardObservesEachCallThatReachedTheBackendOnce(t *testing.T) {
	backendErr := &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: io.ErrUnexpectedEOF}
	tests := []struct {
		name string
		run  func(t *testing.T, g *keyGuard, hk *hungKey, clk *clocktesting.FakeClock, late <-chan error)
		want []observation // err: what errors.Is must find, nil for success
	}{{
		name: "a signature the backend answers is observed with its duration",
		run: func(t *testing.T, g *keyGuard, hk *hungKey, clk *clocktesting.FakeClock, _ <-chan error) {
			res := startSign(g, newExpiringCtx())
			release := recv(t, hk.entered, "the call")
			clk.Step(2 * time.Second)
			release <- nil
			recv(t, res, "the signature")
		},
		want: []observation{{"file", 2 * time.Second, nil}},
	}, {
		name: "a signature without a deadline is observed too",
		run: func(t *testing.T, g *keyGuard, hk *hungKey, clk *clocktesting.FakeClock, _ <-chan error) {
			res := startSign(g, context.Background())
			release := recv(t, hk.entered, "the call")
			clk.Step(time.Second)
			release <- nil
			recv(t, res, "the signature")
		},
		want: []observation{{"file", time.Second, nil}},
	}, {
		name: "a backend error is observed with that error",
		run: func(t *testing.T, g *keyGuard, hk *hungKey, clk *clocktesting.FakeClock, _ <-chan error) {
			res := startSign(g, newExpiringCtx())
			release := recv(t, hk.entered, "the call")
			clk.Step(time.Second)
			release <- backendErr
			recv(t, res, "the error")
		},
		want: []observation{{"file", time.Second, io.ErrUnexpectedEOF}},
	}, {
		name: "a call that outlives its deadline is observed once, when its caller is freed",
		run: func(t *testing.T, g *keyGuard, hk *hungKey, clk *clocktesting.FakeClock, late <-chan error) {
			release := abandon(t, g, hk, clk, 30*time.Second)
			clk.Step(time.Minute)
			release <- nil
			recv(t, late, "the late result")
		},
		want: []observation{{"file", 30 * time.Second, context.DeadlineExceeded}},
	}, {
		name: "a signature refused because calls are stuck is not observed",
		run: func(t *testing.T, g *keyGuard, hk *hungKey, clk *clocktesting.FakeClock, late <-chan error) {
			release := abandon(t, g, hk, clk, 30*time.Second)
			if _, err := g.SignContext(context.Background(), testDigest[:], crypto.SHA256); !errors.Is(err, errNotSent) {
				t.Fatalf("sign with MaxStuck calls stuck: %v, want a refusal", err)
			}
			release <- nil
			recv(t, late, "the late result")
		},
		want: []observation{{"file", 30 * time.Second, context.DeadlineExceeded}},
	}, {
		name: "a signature whose context already ended is not observed",
		run: func(t *testing.T, g *keyGuard, _ *hungKey, _ *clocktesting.FakeClock, _ <-chan error) {
			ctx := newExpiringCtx()
			ctx.expire()
			if _, err := g.SignContext(ctx, testDigest[:], crypto.SHA256); !errors.Is(err, errNotSent) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("sign with an expired context: %v, want a refusal", err)
			}
		},
	}, {
		name: "a signature on a closed key is not observed",
		run: func(t *testing.T, g *keyGuard, _ *hungKey, _ *clocktesting.FakeClock, _ <-chan error) {
			if err := g.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := g.SignContext(context.Background(), testDigest[:], crypto.SHA256); !errors.Is(err, errNotSent) || backends.IsTransient(err) {
				t.Fatalf("sign on a closed key: %v, want a permanent refusal", err)
			}
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hk := newHungKey(t, false)
			clk := clocktesting.NewFakeClock(time.Now())
			var mu sync.Mutex
			var got []observation
			g, err := newKeyGuard(hk, keyOptions{Clock: clk, MaxStuck: 1, Observer: func(b string, d time.Duration, err error) {
				mu.Lock()
				got = append(got, observation{b, d, err})
				mu.Unlock()
			}})
			if err != nil {
				t.Fatal(err)
			}
			late := make(chan error, 1)
			g.late = func(err error) { late <- err }
			tt.run(t, g, hk, clk, late)

			mu.Lock()
			defer mu.Unlock()
			if len(got) != len(tt.want) {
				t.Fatalf("observed %d calls (%v), want %d", len(got), got, len(tt.want))
			}
			for i, w := range tt.want {
				g := got[i]
				if g.backend != w.backend || g.d != w.d || (w.err == nil) != (g.err == nil) || (w.err != nil && !errors.Is(g.err, w.err)) {
					t.Errorf("observation %d: %s %s %v, want %s %s %v", i, g.backend, g.d, g.err, w.backend, w.d, w.err)
				}
			}
		})
	}
}

func TestKeyOptionsRefuseNegativeValues(t *testing.T) {
	key := newHungKey(t, false)
	tests := []struct {
		name   string
		opts   keyOptions
		option string
	}{
		{"a negative MaxStuck is refused", keyOptions{MaxStuck: -1}, "MaxStuck"},
		{"a negative CloseWait is refused", keyOptions{CloseWait: -time.Second}, "CloseWait"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newHealthKey(key, tt.opts)
			var oe *backends.OptionError
			if !errors.As(err, &oe) || oe.Option != tt.option {
				t.Fatalf("got %v, want an OptionError for %s", err, tt.option)
			}
		})
	}
}

// MaxStuck's documented bound: calls already in the backend when it hangs
// may all become stuck (MaxStuck + callers − 1 at most), but once MaxStuck
// are stuck no new call reaches the backend.
func TestKeyGuardMaxStuckBoundUnderConcurrency(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	g, err := newKeyGuard(hk, keyOptions{Clock: clk, MaxStuck: 1})
	if err != nil {
		t.Fatal(err)
	}
	const callers = 4
	var ctxs []*expiringCtx
	var results []<-chan signResult
	var releases []chan<- error
	for range callers {
		ctx := newExpiringCtx()
		ctxs = append(ctxs, ctx)
		results = append(results, startSign(g, ctx))
		releases = append(releases, recv(t, hk.entered, "the call to reach the backend"))
	}
	clk.Step(30 * time.Second)
	for i, ctx := range ctxs {
		ctx.expire()
		recv(t, results[i], "the caller to be freed")
	}
	var se *stuckError
	if err := g.stuckCalls(); !errors.As(err, &se) || se.N > 1+callers-1 {
		t.Fatalf("stuck calls: %v; want at most MaxStuck + callers − 1 = %d", err, callers)
	}
	before := hk.calls.Load()
	r := recv(t, startSign(g, newExpiringCtx()), "the refusal")
	if r.err == nil || hk.calls.Load() != before {
		t.Fatalf("a new call with %d stuck: err %v, backend calls %d → %d; want a refusal that never reaches the backend", se.N, r.err, before, hk.calls.Load())
	}
	for _, rel := range releases {
		rel <- nil
	}
}
