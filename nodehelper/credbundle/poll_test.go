package credbundle

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A bundle that does not load is read once per change, not at every tick:
// a broken file left in place costs no busy re-reading (each load may
// re-read ReadAttempts times) and no log line per tick.
func TestABrokenBundleIsReadAgainOnlyWhenItChanges(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bundle.pem")
	if err := os.WriteFile(path, []byte("not a bundle"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var loaded fingerprint // nothing loaded yet: the file differs from it
	var calls atomic.Int64
	reload := func() error { calls.Add(1); return errors.New("no PRIVATE KEY block") }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollChanges(ctx, time.Millisecond, []string{path}, &mu, &loaded, reload, "test bundle")
	}()
	defer func() { cancel(); <-done }()

	waitCalls := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for calls.Load() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%d reloads, want %d", calls.Load(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitCalls(1)
	time.Sleep(100 * time.Millisecond) // about 100 ticks
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d reloads of an unchanged broken file, want 1", n)
	}
	if err := os.WriteFile(path, []byte("still not a bundle, but changed"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitCalls(2)
}
