package agent

import (
	"crypto/x509"
	"math/rand/v2"
	"testing"
	"time"
)

// Renewal falls between 70 % and 90 % of the lifetime, whatever the draw,
// and the draws spread over that window (kubelet's jitter).
func TestRenewalIsBetween70And90PercentOfTheLifetime(t *testing.T) {
	nb := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	leaf := &x509.Certificate{NotBefore: nb, NotAfter: nb.Add(10 * time.Hour)}
	from, until := nb.Add(7*time.Hour), nb.Add(9*time.Hour)
	for _, tc := range []struct {
		name string
		draw float64
		want time.Time
	}{
		{"the lowest draw renews at 70 %", 0, from},
		{"a middle draw renews at 80 %", 0.5, nb.Add(8 * time.Hour)},
		{"the highest draw renews just before 90 %", 0.999999, until},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := renewAt(leaf, func() float64 { return tc.draw })
			if d := got.Sub(tc.want).Abs(); d > time.Second {
				t.Errorf("renewAt = %s, want %s", got, tc.want)
			}
		})
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	var early, late int
	for range 1000 {
		at := renewAt(leaf, rnd.Float64)
		if at.Before(from) || !at.Before(until) {
			t.Fatalf("renewAt = %s, outside [%s, %s)", at, from, until)
		}
		if at.Before(nb.Add(8 * time.Hour)) {
			early++
		} else {
			late++
		}
	}
	if early < 400 || late < 400 {
		t.Errorf("draws are not spread: %d in the first half of the window, %d in the second", early, late)
	}
}

// Backoff doubles from the initial wait up to the maximum, each wait
// jittered within [d/2, d], and starts again after a success.
func TestBackoffDoublesWithJitterUpToTheMaximumAndResets(t *testing.T) {
	for _, tc := range []struct {
		name string
		draw float64
		want []time.Duration
	}{
		{"the lowest draw waits half", 0, []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 15 * time.Second, 15 * time.Second}},
		{"the highest draw waits almost the whole", 1, []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := backoff{initial: 2 * time.Second, max: 30 * time.Second, rnd: func() float64 { return tc.draw }}
			for i, want := range tc.want {
				if got := b.next(); got != want {
					t.Errorf("wait %d = %s, want %s", i, got, want)
				}
			}
			b.reset()
			if got, want := b.next(), tc.want[0]; got != want {
				t.Errorf("after reset: %s, want %s", got, want)
			}
		})
	}
	b := backoff{initial: 2 * time.Second, max: 5 * time.Minute, rnd: rand.New(rand.NewPCG(3, 4)).Float64}
	for i := range 100 {
		if d := b.next(); d < time.Second || d > 5*time.Minute {
			t.Fatalf("wait %d = %s, outside [1s, 5m]", i, d)
		}
	}
}
