package workers

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Parked keys, each once however often parked, come back all together
// once the gate opens, and not before.
func TestParkedKeysComeBackWhenTheGateOpens(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var p Parked[string]
	var open atomic.Bool
	var mu sync.Mutex
	var got []string
	go p.Release(ctx, open.Load, func(k string) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, k)
	})
	for range 3 {
		p.Park("a")
		p.Park("b")
	}
	time.Sleep(5 * ParkPoll)
	mu.Lock()
	early := len(got)
	mu.Unlock()
	if early != 0 || p.Len() != 2 {
		t.Fatalf("%d keys released while shut, %d waiting; want 0 and 2", early, p.Len())
	}
	open.Store(true)
	deadline := time.Now().Add(time.Minute)
	for p.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("keys never released")
		}
		time.Sleep(ParkPoll)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	if !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("released %q, want [a b]", got)
	}
}
