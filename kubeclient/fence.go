package kubeclient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// ErrFenced is returned by Fence.Bound when this replica may not act as the
// leader now: it does not hold the Lease, or it has not renewed it recently
// enough to be sure that no standby has taken it.
var ErrFenced = errors.New("not leading: the Lease is not held or not renewed in time")

// Fence says until when this replica may still act as the leader, from
// what it knows of its own Lease writes and nothing else.
//
// A standby takes the Lease only after it has seen the same record for
// leaseDuration, by its own clock, and it sees a record only after the
// leader sent it. So a write the leader sent at t, once it succeeded,
// keeps every standby out until at least t + leaseDuration. The fence is
// t + renewDeadline for the last such write: the leader stops starting
// (and cuts off) signatures a margin of leaseDuration − renewDeadline
// before the earliest instant a standby could start its own, a margin that
// absorbs a difference in clock rates and a request still on the wire.
// Times are Go's monotonic clock readings: a step of the wall clock moves
// nothing.
//
// The zero Fence is closed; a nil *Fence is always open (no leader
// election: the only replica is always the leader).
type Fence struct {
	mu    sync.Mutex
	until time.Time
	// leading is set while the Lease is held; a write sent while this
	// replica held the Lease but answered after it lost it opens nothing.
	leading bool
	// closed is set by close for good: a write answered after the Lease
	// was lost or released never opens the fence again.
	closed bool
	now    func() time.Time
	// refused counts Bound's ErrFenced answers.
	refused atomic.Uint64
	// loggedLate is when Bound last logged a refusal while the Lease was
	// still held (renewals late); under mu.
	loggedLate time.Time
}

// lateLogEvery spaces Bound's lines about late renewals.
const lateLogEvery = time.Minute

// NewFence returns a closed fence.
func NewFence() *Fence { return &Fence{now: time.Now} }

// Until is the instant up to which this replica may sign as the leader;
// the zero time when it may not (it does not lead). Always in the future
// for a nil Fence.
func (f *Fence) Until() time.Time {
	if f == nil {
		return time.Now().Add(24 * time.Hour)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.leading {
		return time.Time{}
	}
	return f.until
}

// Open reports whether the fence lets this replica act now.
func (f *Fence) Open() bool {
	if f == nil {
		return true
	}
	return f.clock().Before(f.Until())
}

// Bound returns ctx cut off at the fence as it stands now, or ErrFenced
// when it is closed. An operation begun under it (a signature, a status
// write) ends before any standby may have taken the Lease; a renewal
// meanwhile does not extend it, which only makes it safer. A nil Fence
// returns ctx itself.
func (f *Fence) Bound(ctx context.Context) (context.Context, context.CancelFunc, error) {
	if f == nil {
		return ctx, func() {}, nil
	}
	until := f.Until()
	if now := f.clock(); !now.Before(until) {
		f.refused.Add(1)
		f.logLate(ctx, now, until)
		return ctx, func() {}, ErrFenced
	}
	bctx, cancel := context.WithDeadlineCause(ctx, until, ErrFenced)
	return bctx, cancel, nil
}

// logLate logs, at most once per lateLogEvery, that the fence refused work
// while this replica still held the Lease: its last renewal was sent
// renewDeadline ago or more, so renewals are slower than the leader
// election settings allow. (A replica that lost the Lease logs that and
// exits; it logs nothing here.)
func (f *Fence) logLate(ctx context.Context, now, until time.Time) {
	f.mu.Lock()
	if !f.leading || (!f.loggedLate.IsZero() && now.Sub(f.loggedLate) < lateLogEvery) {
		f.mu.Unlock()
		return
	}
	f.loggedLate = now
	f.mu.Unlock()
	klog.FromContext(ctx).Info("Not signing until the Lease is renewed: its last renewal is older than renewDeadline; Lease writes are slow (see keyward_leader_fence_refused_total and docs/troubleshooting.md#keywardleaserenewalslate)",
		"lateBy", now.Sub(until).Round(time.Millisecond))
}

// Refused is how many times Bound has answered ErrFenced.
func (f *Fence) Refused() uint64 {
	if f == nil {
		return 0
	}
	return f.refused.Load()
}

func (f *Fence) clock() time.Time {
	if f.now != nil {
		return f.now()
	}
	return time.Now()
}

// renewed records a Lease write sent at sent, which succeeded with this
// replica as the holder.
func (f *Fence) renewed(sent time.Time, renewDeadline time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return
	}
	f.leading = true
	if u := sent.Add(renewDeadline); u.After(f.until) {
		f.until = u
	}
}

// close shuts the fence for good: the Lease is lost or released
// (RunLeader runs once per process: a replica that lost the Lease exits).
func (f *Fence) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.leading, f.closed = false, true
	f.until = time.Time{}
}

// fencedLock is the Lease lock with every successful write of this
// replica's holdership recorded in a Fence.
type fencedLock struct {
	resourcelock.Interface
	fence         *Fence
	renewDeadline time.Duration
}

func (l *fencedLock) Create(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ler, func() error { return l.Interface.Create(ctx, ler) })
}

func (l *fencedLock) Update(ctx context.Context, ler resourcelock.LeaderElectionRecord) error {
	return l.write(ler, func() error { return l.Interface.Update(ctx, ler) })
}

func (l *fencedLock) write(ler resourcelock.LeaderElectionRecord, do func() error) error {
	if ler.HolderIdentity != l.Identity() {
		// A release (the holder emptied): nothing may be signed from here.
		l.fence.close()
		return do()
	}
	sent := l.fence.clock()
	err := do()
	if err == nil {
		l.fence.renewed(sent, l.renewDeadline)
	}
	return err
}
