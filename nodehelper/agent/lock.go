package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// lockFile in the state directory is held (flock) by the running agent:
// two agents on one state directory (a DaemonSet rolling update with
// surge, a second unit by mistake) would commit pairs and write outputs
// at the same time, and atomicdir.Write must not run concurrently.
const lockFile = "agent.lock"

// lockPoll is how often a waiting agent tries the lock again.
const lockPoll = time.Second

// lockStateDir takes the state directory's lock, waiting while another
// agent holds it (said once). It returns the release, or nil and no error
// when ctx ended first.
func (a *Agent) lockStateDir(ctx context.Context) (func(), error) {
	if err := os.MkdirAll(a.cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating the state directory: %w", err)
	}
	path := filepath.Join(a.cfg.StateDir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the state directory's lock: %w", err)
	}
	said := false
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			if said {
				klog.FromContext(ctx).Info("State directory lock taken", "path", path)
			}
			return func() { _ = f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			_ = f.Close()
			return nil, fmt.Errorf("locking %s: %w", path, err)
		}
		if !said {
			klog.FromContext(ctx).Info("Another node agent holds the state directory; waiting for it", "path", path)
			said = true
		}
		if !a.sleep(ctx, lockPoll, nil) {
			_ = f.Close()
			return nil, nil
		}
	}
}
