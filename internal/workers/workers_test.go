package workers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Run processes every key with n workers and returns only after ctx ended
// and every worker stopped.
func TestRunProcessesKeysAndStopsWithContext(t *testing.T) {
	q := workqueue.NewTyped[int]()
	const keys = 20
	for i := range keys {
		q.Add(i)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var done, running atomic.Int32
	processNext := func(ctx context.Context) bool {
		running.Add(1)
		defer running.Add(-1)
		k, quit := q.Get()
		if quit {
			return false
		}
		defer q.Done(k)
		if done.Add(1) == keys {
			cancel()
		}
		return true
	}
	Run(ctx, 3, q, processNext)
	if got := done.Load(); got != keys {
		t.Fatalf("processed %d keys, want %d", got, keys)
	}
	if !q.ShuttingDown() {
		t.Fatal("queue not shut down after Run returned")
	}
	if n := running.Load(); n != 0 {
		t.Fatalf("%d workers still running after Run returned", n)
	}
}

// A shutdown before the caches synced is a normal exit: the
// controller never marked ready and no worker started.
func TestRunSyncedEndsQuietlyWhenCtxEndsBeforeTheCachesSync(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	q := workqueue.NewTyped[int]()
	var marked, ran atomic.Bool
	RunSynced(ctx, []cache.InformerSynced{func() bool { return false }}, func() { marked.Store(true) },
		2, q, func(context.Context) bool { ran.Store(true); return false })
	if marked.Load() || ran.Load() {
		t.Fatalf("ready %v, workers ran %v; want false, false", marked.Load(), ran.Load())
	}
}

// Once the caches synced the controller is marked ready before a worker
// runs, and the workers run until ctx ends.
func TestRunSyncedMarksReadyThenRunsWorkers(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	q := workqueue.NewTyped[int]()
	q.Add(1)
	var marked, readyFirst atomic.Bool
	RunSynced(ctx, []cache.InformerSynced{func() bool { return true }}, func() { marked.Store(true) },
		1, q, func(context.Context) bool {
			k, quit := q.Get()
			if quit {
				return false
			}
			defer q.Done(k)
			readyFirst.Store(marked.Load())
			cancel()
			return true
		})
	if !readyFirst.Load() {
		t.Fatal("a worker ran before the controller was marked ready")
	}
}

// A key failing again and again is requeued with backoff each time and
// logged loudly once, after LoudRetries requeues; a success forgets its
// backoff.
func TestSettleRequeuesFailuresAndIsLoudOnce(t *testing.T) {
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](time.Hour, time.Hour))
	defer q.ShutDown()
	var loud []int
	failure := errors.New("apiserver unavailable")
	for range 3 * LoudRetries {
		Settle(q, "k", 0, failure, func(l bool, attempts int) {
			if l {
				loud = append(loud, attempts)
			}
		})
	}
	if len(loud) != 1 || loud[0] != LoudRetries+1 {
		t.Fatalf("loud at attempts %v, want only at %d", loud, LoudRetries+1)
	}
	if n := q.NumRequeues("k"); n != 3*LoudRetries {
		t.Fatalf("requeued %d times, want %d", n, 3*LoudRetries)
	}
	Settle(q, "k", time.Hour, nil, func(bool, int) { t.Fatal("retrying called without an error") })
	if n := q.NumRequeues("k"); n != 0 {
		t.Fatalf("a key to look at later keeps %d requeues, want 0", n)
	}
}
