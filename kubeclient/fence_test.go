package kubeclient

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// fakeLock is a Lease lock whose writes succeed or fail on demand.
type fakeLock struct {
	id   string
	fail error
}

func (l *fakeLock) Get(context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	return nil, nil, errors.New("not used")
}
func (l *fakeLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return l.fail }
func (l *fakeLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return l.fail }
func (l *fakeLock) RecordEvent(string)                                              {}
func (l *fakeLock) Identity() string                                                { return l.id }
func (l *fakeLock) Describe() string                                                { return "fake" }

func TestFenceFollowsTheLeaseWrites(t *testing.T) {
	now := time.Unix(1000, 0)
	f := &Fence{now: func() time.Time { return now }}
	inner := &fakeLock{id: "me"}
	lock := &fencedLock{Interface: inner, fence: f, renewDeadline: 750 * time.Millisecond}
	ctx := context.Background()
	mine := resourcelock.LeaderElectionRecord{HolderIdentity: "me"}

	if _, _, err := f.Bound(ctx); !errors.Is(err, ErrFenced) {
		t.Fatalf("a fence that never saw a write: %v, want ErrFenced", err)
	}
	if err := lock.Create(ctx, mine); err != nil {
		t.Fatal(err)
	}
	bctx, cancel, err := f.Bound(ctx)
	if err != nil {
		t.Fatalf("just acquired: %v", err)
	}
	if d, ok := bctx.Deadline(); !ok || !d.Equal(now.Add(750*time.Millisecond)) {
		t.Errorf("deadline %v (%v), want the write's send time + renewDeadline %v", d, ok, now.Add(750*time.Millisecond))
	}
	cancel()

	// A renewal that fails extends nothing: 750 ms after the last good
	// write the fence shuts, though the elector may still think it leads.
	now = now.Add(500 * time.Millisecond)
	inner.fail = errors.New("apiserver unreachable")
	if err := lock.Update(ctx, mine); err == nil {
		t.Fatal("the failing write succeeded")
	}
	if !f.Open() {
		t.Error("shut 500 ms after a good write")
	}
	now = now.Add(250 * time.Millisecond)
	if f.Open() {
		t.Error("still open renewDeadline after the last good write")
	}
	if _, _, err := f.Bound(ctx); !errors.Is(err, ErrFenced) {
		t.Errorf("Bound after the fence: %v, want ErrFenced", err)
	}

	// The next good write opens it again, from when it was sent.
	inner.fail = nil
	if err := lock.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if got := f.Until(); !got.Equal(now.Add(750 * time.Millisecond)) {
		t.Errorf("until %v after a renewal, want %v", got, now.Add(750*time.Millisecond))
	}

	// A release (the holder emptied) shuts it for good, before the write.
	if err := lock.Update(ctx, resourcelock.LeaderElectionRecord{}); err != nil {
		t.Fatal(err)
	}
	if f.Open() || !f.Until().IsZero() {
		t.Errorf("open after the release: until %v", f.Until())
	}
	// A write of our holdership answered after that opens nothing.
	if err := lock.Update(ctx, mine); err != nil {
		t.Fatal(err)
	}
	if f.Open() {
		t.Error("a write answered after the release opened the fence again")
	}
	// Each ErrFenced answer is counted for keyward_leader_fence_refused_total.
	if got := f.Refused(); got != 2 {
		t.Errorf("Refused() = %d, want 2 (before the first write, after the shut fence)", got)
	}
	if got := testutil.ToFloat64(NewFenceRefusals("l", f)); got != 2 {
		t.Errorf("keyward_leader_fence_refused_total = %v, want 2", got)
	}
}

func TestFenceCutsOffAnOperationAtTheFence(t *testing.T) {
	f := NewFence()
	f.renewed(time.Now(), 50*time.Millisecond)
	ctx, cancel, err := f.Bound(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	<-ctx.Done()
	if !errors.Is(context.Cause(ctx), ErrFenced) {
		t.Errorf("cause %v, want ErrFenced", context.Cause(ctx))
	}
}

func TestNilFenceIsOpen(t *testing.T) {
	var f *Fence
	ctx := context.Background()
	got, cancel, err := f.Bound(ctx)
	defer cancel()
	if err != nil || got != ctx || !f.Open() {
		t.Errorf("nil fence: %v, same ctx %v, open %v", err, got == ctx, f.Open())
	}
}

// A fence shut while the Lease is still held (renewals late) says so at
// the default verbosity, once a minute at most; a replica that lost the
// Lease says nothing here (it logs the loss and exits).
func TestFenceLogsLateRenewalsOnceAMinute(t *testing.T) {
	now := time.Unix(1000, 0)
	f := &Fence{now: func() time.Time { return now }}
	f.renewed(now, 750*time.Millisecond)
	var buf bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&buf))))
	lines := func() int { return strings.Count(buf.String(), "Not signing until the Lease is renewed") }

	now = now.Add(800 * time.Millisecond)
	for range 50 {
		if _, _, err := f.Bound(ctx); !errors.Is(err, ErrFenced) {
			t.Fatalf("late renewal: %v, want ErrFenced", err)
		}
	}
	if lines() != 1 {
		t.Fatalf("%d lines for 50 refusals in a moment, want 1:\n%s", lines(), buf.String())
	}
	now = now.Add(time.Minute)
	_, _, _ = f.Bound(ctx)
	if lines() != 2 {
		t.Fatalf("%d lines a minute later, want 2", lines())
	}
	f.close()
	now = now.Add(2 * time.Minute)
	_, _, _ = f.Bound(ctx)
	if lines() != 2 {
		t.Fatalf("a fence closed for good logged %d lines, want still 2", lines())
	}
	if f.Refused() != 52 {
		t.Errorf("Refused() = %d, want 52", f.Refused())
	}
}
