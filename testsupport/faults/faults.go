// Package faults is the fault injection the in-process KMS fakes share:
// calls counted per method, faults queued for the next calls of a method
// or injected into all of them, and a latency every call waits. The fault
// type is the fake's own; what a fault does is the fake's business.
package faults

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// Always, as Inject's times, injects the fault into every call until
// ClearFaults.
const Always = -1

// Injector holds one fake's faults. The zero value injects nothing and is
// ready to use; an Injector is safe for concurrent use.
type Injector[F any] struct {
	mu      sync.Mutex
	latency time.Duration
	queued  map[string][]F
	always  map[string]F
	random  map[string]randomFaults[F]
	calls   map[string]int
}

// randomFaults fail a fraction of calls, each with one of fs in turn.
type randomFaults[F any] struct {
	fraction float64
	fs       []F
	next     int
}

// SetLatency delays every later call by d (or until the call's context
// ends).
func (in *Injector[F]) SetLatency(d time.Duration) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.latency = d
}

// Inject queues f for the next times calls of method, after the faults
// already queued for it; times Always injects it into every call of method
// until ClearFaults, ahead of any queued one.
func (in *Injector[F]) Inject(method string, f F, times int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if times == Always {
		if in.always == nil {
			in.always = map[string]F{}
		}
		in.always[method] = f
		return
	}
	if in.queued == nil {
		in.queued = map[string][]F{}
	}
	for range times {
		in.queued[method] = append(in.queued[method], f)
	}
}

// InjectRandomly fails each later call of method with probability
// fraction (0 < fraction ≤ 1), drawn independently per call, until
// ClearFaults; the calls it fails get fs in turn, so a mix such as
// throttling and 5xx answers is spread evenly. Always and queued faults
// come first. It panics on a fraction outside (0, 1] or no fault: a
// test that asks for that has a bug.
func (in *Injector[F]) InjectRandomly(method string, fraction float64, fs ...F) {
	if !(fraction > 0 && fraction <= 1) || len(fs) == 0 {
		panic(fmt.Sprintf("faults: InjectRandomly(%q, %v, %d faults): want 0 < fraction ≤ 1 and at least one fault", method, fraction, len(fs)))
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.random == nil {
		in.random = map[string]randomFaults[F]{}
	}
	in.random[method] = randomFaults[F]{fraction: fraction, fs: fs}
}

// ClearFaults drops every injected fault. The latency stays.
func (in *Injector[F]) ClearFaults() {
	in.mu.Lock()
	defer in.mu.Unlock()
	clear(in.queued)
	clear(in.always)
	clear(in.random)
}

// Calls is how many calls of method have begun, faulted ones included.
func (in *Injector[F]) Calls(method string) int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.calls[method]
}

// Begin counts a call of method, takes its fault (the zero F when none is
// injected) and waits the latency. It returns ctx's error, with the fault,
// when the context ends first.
func (in *Injector[F]) Begin(ctx context.Context, method string) (F, error) {
	in.mu.Lock()
	if in.calls == nil {
		in.calls = map[string]int{}
	}
	in.calls[method]++
	f, ok := in.always[method]
	if q := in.queued[method]; !ok && len(q) > 0 {
		f, in.queued[method], ok = q[0], q[1:], true
	}
	if r, random := in.random[method]; !ok && random && rand.Float64() < r.fraction {
		f = r.fs[r.next%len(r.fs)]
		r.next++
		in.random[method] = r
	}
	latency := in.latency
	in.mu.Unlock()
	if latency > 0 {
		t := time.NewTimer(latency)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return f, ctx.Err()
		}
	}
	return f, nil
}
