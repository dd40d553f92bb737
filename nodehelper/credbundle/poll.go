package credbundle

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"
)

// retryFailedEvery is how often files that failed to load are read again
// while they stay unchanged (a change is read at the next tick).
const retryFailedEvery = time.Minute

// pollChanges stats paths every interval until ctx ends and, when they differ
// from what the last load read (*loaded), calls reloadLocked under mu. A
// failed reload keeps what is current and is logged once; the same files
// are read again only when they change, or after retryFailedEvery, so a
// broken bundle costs no busy re-reading and no log line per tick.
func pollChanges(ctx context.Context, interval time.Duration, paths []string, mu *sync.Mutex, loaded *fingerprint, reloadLocked func() error, what string) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	var failed fingerprint // the files the last failed reload read
	var failedAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f, err := stat(paths)
		if err != nil || (f == failed && time.Since(failedAt) < retryFailedEvery) {
			continue
		}
		mu.Lock()
		changed := f != *loaded
		if changed {
			err = reloadLocked()
		}
		mu.Unlock()
		if !changed {
			continue
		}
		switch {
		case err == nil:
			failed = fingerprint{}
			logger.V(2).Info("Reloaded a changed "+what, "files", paths)
		case f != failed:
			failed, failedAt = f, time.Now()
			logger.Error(err, "Keeping the current "+what+"; reading the files again when they change")
		default:
			failedAt = time.Now()
			logger.V(2).Info("The "+what+" still does not load", "err", err)
		}
	}
}

// loadedOr returns what cur holds, or, when nothing has been loaded yet,
// loads it first (under mu, once for concurrent first callers).
func loadedOr[T any](cur *atomic.Pointer[T], mu *sync.Mutex, reloadLocked func() error) (*T, error) {
	if v := cur.Load(); v != nil {
		return v, nil
	}
	mu.Lock()
	defer mu.Unlock()
	if v := cur.Load(); v != nil {
		return v, nil
	}
	if err := reloadLocked(); err != nil {
		return nil, err
	}
	return cur.Load(), nil
}
