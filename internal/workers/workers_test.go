package workers

import (
	"context"
	"sync/atomic"
	"testing"

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
