// Package workers runs a controller's queue workers: the few lines every
// keyward controller ended its Run with.
package workers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// LoudRetries is how many times a key is requeued with backoff before
// its next failure is logged at default verbosity (once).
const LoudRetries = 5

// Settle ends a key's turn after a sync that returned after and err. An
// error requeues the key with backoff, first calling retrying with
// whether this failure is the one to log loudly and the attempts so far;
// a positive after looks at the key again then; either way but the error
// the key's backoff is forgotten.
func Settle[T comparable](q workqueue.TypedRateLimitingInterface[T], key T, after time.Duration, err error, retrying func(loud bool, attempts int)) {
	switch {
	case err != nil:
		n := q.NumRequeues(key)
		retrying(n == LoudRetries, n+1)
		q.AddRateLimited(key)
	case after > 0:
		q.Forget(key)
		q.AddAfter(key, after)
	default:
		q.Forget(key)
	}
}

// RunSynced waits for the informers of syncs, calls synced (which marks
// the controller ready and says so), then runs n workers as Run does, until
// ctx ends. A ctx that ends before the caches synced is a normal shutdown
// (WaitForCacheSync gives up only then), so there is no error to return.
func RunSynced(ctx context.Context, syncs []cache.InformerSynced, synced func(), n int, queue Queue, processNext func(context.Context) bool) {
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return
	}
	synced()
	Run(ctx, n, queue, processNext)
}

// Queue is what Run needs of a workqueue: a way to make Get return.
type Queue interface{ ShutDown() }

// Run starts n workers, each calling processNext until it returns false
// (the queue was shut down, or ctx ended) and started again a second later
// while ctx lasts. When ctx ends it shuts queue down, so that workers
// blocked in Get return, and waits for every worker to return.
func Run(ctx context.Context, n int, queue Queue, processNext func(context.Context) bool) {
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(ctx context.Context) {
				for processNext(ctx) {
				}
			}, time.Second)
		})
	}
	<-ctx.Done()
	queue.ShutDown()
	wg.Wait()
}
