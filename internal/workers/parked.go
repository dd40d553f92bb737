package workers

import (
	"context"
	"sync"
	"time"
)

// ParkPoll is how often Parked looks whether its gate has opened.
const ParkPoll = 20 * time.Millisecond

// Parked holds the keys that wait for a gate (the Lease's fence) to open,
// each once, and hands them all back to the queue when it does: a shut
// fence costs one poll every ParkPoll, not a sync of every waiting key.
// The zero Parked is ready; it is safe for concurrent use.
type Parked[T comparable] struct {
	mu   sync.Mutex
	keys map[T]struct{}
}

// Park holds key until the gate opens.
func (p *Parked[T]) Park(key T) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil {
		p.keys = map[T]struct{}{}
	}
	p.keys[key] = struct{}{}
}

// Len is how many keys wait.
func (p *Parked[T]) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys)
}

// Release hands every waiting key to add once open reports true, looking
// every ParkPoll, until ctx ends.
func (p *Parked[T]) Release(ctx context.Context, open func() bool, add func(T)) {
	t := time.NewTicker(ParkPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if p.Len() == 0 || !open() {
			continue
		}
		p.mu.Lock()
		keys := p.keys
		p.keys = nil
		p.mu.Unlock()
		for k := range keys {
			add(k)
		}
	}
}
