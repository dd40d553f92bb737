package workers

import (
	"sync"
	"time"
)

// LoudEvery spaces the loud retry lines of one signer name.
const LoudEvery = time.Minute

// Loud decides which loud retry lines are written: at most one per key (a
// signer name) every LoudEvery, so that an outage with thousands of
// requests waiting writes one line a minute per signer name rather than
// one per request. The zero Loud is ready; it is safe for concurrent use.
type Loud struct {
	mu   sync.Mutex
	last map[string]time.Time
	// held counts the lines held back per key since its last line.
	held map[string]int
}

// Allow reports whether a loud line for key may be written at now, and
// how many were held back since the last one (to be said in the line).
func (l *Loud) Allow(key string, now time.Time) (ok bool, heldBack int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last, l.held = map[string]time.Time{}, map[string]int{}
	}
	if t, seen := l.last[key]; seen && now.Sub(t) < LoudEvery {
		l.held[key]++
		return false, 0
	}
	heldBack = l.held[key]
	l.last[key], l.held[key] = now, 0
	return true, heldBack
}
