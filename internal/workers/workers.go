// Package workers runs a controller's queue workers: the few lines every
// keyward controller ended its Run with.
package workers

import (
	"context"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
)

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
