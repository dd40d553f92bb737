package backends

import (
	"errors"
	"testing"
	"time"
)

func TestBackoffDoublesFromBaseStaysInTheUpperHalfAndIsCapped(t *testing.T) {
	p, err := RetryPolicy{BaseBackoff: 100 * time.Millisecond, MaxBackoff: time.Second}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		attempt int
		ceiling time.Duration
	}{
		{1, 100 * time.Millisecond},
		{2, 200 * time.Millisecond},
		{4, 800 * time.Millisecond},
		{5, time.Second},
		{40, time.Second},
		{1000, time.Second},
	} {
		seen := map[time.Duration]bool{}
		for range 1000 {
			d := p.Backoff(tt.attempt)
			if d < tt.ceiling/2 || d > tt.ceiling {
				t.Fatalf("Backoff(%d) = %v, want within [%v, %v]", tt.attempt, d, tt.ceiling/2, tt.ceiling)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("Backoff(%d) took only %d values in 1000 draws: not jittered", tt.attempt, len(seen))
		}
	}
	huge, err := RetryPolicy{BaseBackoff: time.Hour, MaxBackoff: 1<<63 - 1}.WithDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if d := huge.Backoff(40); d < (1<<63-1)/2 {
		t.Errorf("Backoff(40) from an hour, capped at the largest Duration, = %v: the doubling overflowed", d)
	}
}

func TestRetryPolicyDefaultsAndRefusals(t *testing.T) {
	p, err := RetryPolicy{}.WithDefaults()
	if err != nil || p != (RetryPolicy{MaxAttempts: 5, BaseBackoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second}) {
		t.Errorf("zero policy defaulted to %+v (%v)", p, err)
	}
	if p, _ := (RetryPolicy{BaseBackoff: time.Minute}).WithDefaults(); p.MaxBackoff != time.Minute {
		t.Errorf("a base above the default cap gave MaxBackoff %v, want the base", p.MaxBackoff)
	}
	for _, tc := range []struct {
		name string
		p    RetryPolicy
		want string
	}{
		{"a negative MaxAttempts", RetryPolicy{MaxAttempts: -1}, "Retry.MaxAttempts"},
		{"a negative BaseBackoff", RetryPolicy{BaseBackoff: -time.Second}, "Retry.BaseBackoff"},
		{"a negative MaxBackoff", RetryPolicy{MaxBackoff: -time.Second}, "Retry.MaxBackoff"},
		{"a MaxBackoff shorter than BaseBackoff", RetryPolicy{BaseBackoff: time.Second, MaxBackoff: time.Millisecond}, "Retry.MaxBackoff"},
	} {
		_, err := tc.p.WithDefaults()
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Option != tc.want {
			t.Errorf("%s: got %v, want an *OptionError naming %s", tc.name, err, tc.want)
		}
	}
}
