package tokenservice

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/testsupport/testca"
)

// recordingIssuer records every Reserve; it fails while err is set.
type recordingIssuer struct {
	issuer.Static
	mu       sync.Mutex
	err      error
	reserves chan time.Time
}

func (r *recordingIssuer) Reserve(_ context.Context, _ string, notAfter time.Time) error {
	r.mu.Lock()
	err := r.err
	r.mu.Unlock()
	r.reserves <- notAfter
	return err
}

func TestTheKeeperReservesAheadEveryInterval(t *testing.T) {
	auth, _ := testca.New(t)
	iss := &recordingIssuer{Static: issuer.Static{Authority: auth, Generation: "g1"}, reserves: make(chan time.Time, 10),
		err: errors.New("apiserver unreachable")}
	clk := clocktesting.NewFakeClock(time.Now())
	var mu sync.Mutex
	var lines []string
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})))
	done := make(chan struct{})
	go func() { defer close(done); keepReserved(ctx, iss, 10*time.Minute, KeeperInterval, clk) }()

	next := func() time.Time {
		t.Helper()
		for !clk.HasWaiters() {
			time.Sleep(time.Millisecond)
		}
		clk.Step(KeeperInterval)
		return <-iss.reserves
	}
	if got, want := <-iss.reserves, clk.Now().Add(10*time.Minute); !got.Equal(want) {
		t.Errorf("first reservation up to %s, want now+10m %s", got, want)
	}
	next() // still failing: not logged again
	iss.mu.Lock()
	iss.err = nil
	iss.mu.Unlock()
	if got, want := next(), clk.Now().Add(10*time.Minute); !got.Equal(want) {
		t.Errorf("reservation up to %s, want now+10m %s", got, want)
	}
	// The recovery is logged once the Reserve has returned; the next tick
	// orders it.
	next()
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 2 {
		t.Errorf("logged %q, want the failure once and the recovery once", lines)
	}
}

// TestTheKeeperRetriesSoonAndStaysQuietAtStart: a new leader's first
// Reserve usually fails because the Authority objects are not read yet.
// The keeper tries again after KeeperRetry, not a whole KeeperInterval
// later, and a failure that a retry cures is not logged as an error.
func TestTheKeeperRetriesSoonAndStaysQuietAtStart(t *testing.T) {
	auth, _ := testca.New(t)
	iss := &recordingIssuer{Static: issuer.Static{Authority: auth, Generation: "g1"}, reserves: make(chan time.Time, 10),
		err: fmt.Errorf("%w: Authority objects not read yet", issuer.ErrUnavailable)}
	clk := clocktesting.NewFakeClock(time.Now())
	var mu sync.Mutex
	var lines []string
	ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{})))
	done := make(chan struct{})
	go func() { defer close(done); keepReserved(ctx, iss, 10*time.Minute, KeeperInterval, clk) }()
	<-iss.reserves
	iss.mu.Lock()
	iss.err = nil
	iss.mu.Unlock()
	for !clk.HasWaiters() {
		time.Sleep(time.Millisecond)
	}
	clk.Step(KeeperRetry)
	select {
	case got := <-iss.reserves:
		if want := clk.Now().Add(10 * time.Minute); !got.Equal(want) {
			t.Errorf("retry reserved up to %s, want now+10m %s", got, want)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no retry %s after the failed start", KeeperRetry)
	}
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 0 {
		t.Errorf("logged %q, want nothing for a failure the retry cured", lines)
	}
}
