package credbundle

import (
	"context"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// pollChanges stats paths every interval until ctx ends and, when they differ
// from what the last load read (*loaded), calls reloadLocked under mu. A
// failed reload keeps what is current; it is logged and tried again at the
// next tick.
func pollChanges(ctx context.Context, interval time.Duration, paths []string, mu *sync.Mutex, loaded *fingerprint, reloadLocked func() error, what string) {
	logger := klog.FromContext(ctx)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f, err := stat(paths)
		mu.Lock()
		if err == nil && f != *loaded {
			if err := reloadLocked(); err != nil {
				logger.Error(err, "Keeping the current "+what)
			} else {
				logger.V(2).Info("Reloaded a changed "+what, "files", paths)
			}
		}
		mu.Unlock()
	}
}
