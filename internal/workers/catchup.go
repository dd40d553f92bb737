package workers

import (
	"context"
	"math"
	"strconv"
	"sync/atomic"
	"time"
)

// CatchUp tells whether an informer that was running before this replica
// became the leader has shown every write made before that moment: those
// of the previous leader in particular. Until it has, a request its cache
// shows pending may already be signed, and must be read from the
// apiserver before it is signed.
//
// The mark is the resourceVersion of a quorum read made once leading; the
// informer has caught up once its store has applied a resourceVersion (of
// an object, a list or a bookmark) at or past it. The store's, not the
// reflector's: the reflector's LastSyncResourceVersion moves when an event
// is queued, before the store and the handlers have it. client-go keeps
// the store's only with its AtomicFIFO feature (on by default since 1.36);
// without it the store answers "" and the informer stays behind. Resource versions are compared as the
// etcd revisions kube-apiserver serves; one that is not a number keeps
// the informer "behind" for good, which only costs a read per signature.
// The zero CatchUp (never Marked) is caught up: an informer started once
// leading lists with a quorum read.
type CatchUp struct {
	mark   atomic.Uint64
	marked atomic.Bool
	done   atomic.Bool
}

// MarkTimeout bounds Mark's read: a takeover waits for it.
const MarkTimeout = 2 * time.Second

// Mark reads the current resourceVersion with rv (a quorum LIST with
// limit 1). On an error the informer stays behind for good.
func (c *CatchUp) Mark(ctx context.Context, rv func(context.Context) (string, error)) error {
	c.mark.Store(math.MaxUint64)
	c.marked.Store(true)
	v, err := rv(ctx)
	if err != nil {
		return err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return err
	}
	c.mark.Store(n)
	return nil
}

// Versioned is what Fresh needs of an informer's store (its
// cache.Indexer has it).
type Versioned interface{ LastStoreSyncResourceVersion() string }

// Fresh reports whether the store has caught up with the mark.
func (c *CatchUp) Fresh(store Versioned) bool {
	if !c.marked.Load() || c.done.Load() {
		return true
	}
	n, err := strconv.ParseUint(store.LastStoreSyncResourceVersion(), 10, 64)
	if err != nil || n < c.mark.Load() {
		return false
	}
	c.done.Store(true)
	return true
}
