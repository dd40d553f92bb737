package faults

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestQueuedThenAlwaysThenCleared(t *testing.T) {
	var in Injector[string]
	ctx := context.Background()
	in.Inject("Sign", "a", 2)
	in.Inject("Sign", "b", 1)
	for i, want := range []string{"a", "a", "b", ""} {
		if got, err := in.Begin(ctx, "Sign"); err != nil || got != want {
			t.Fatalf("call %d: got %q, %v; want %q", i, got, err, want)
		}
	}
	if got, _ := in.Begin(ctx, "Other"); got != "" {
		t.Fatalf("a fault injected into Sign reached Other: %q", got)
	}
	in.Inject("Sign", "queued", 1)
	in.Inject("Sign", "every", Always)
	for i := range 3 {
		if got, _ := in.Begin(ctx, "Sign"); got != "every" {
			t.Fatalf("call %d with Always: got %q", i, got)
		}
	}
	in.ClearFaults()
	if got, _ := in.Begin(ctx, "Sign"); got != "" {
		t.Fatalf("after ClearFaults: got %q", got)
	}
	if n := in.Calls("Sign"); n != 8 {
		t.Fatalf("Calls(Sign) = %d, want 8", n)
	}
}

func TestLatencyEndsWithTheContext(t *testing.T) {
	var in Injector[int]
	in.SetLatency(time.Hour)
	in.Inject("Sign", 7, 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	f, err := in.Begin(ctx, "Sign")
	if !errors.Is(err, context.Canceled) || f != 7 {
		t.Fatalf("got %d, %v; want the fault and context.Canceled", f, err)
	}
}

// A random fault hits about its fraction of calls, spreads its faults
// evenly, yields to a queued one, and ends with ClearFaults.
func TestInjectRandomlyFailsAFraction(t *testing.T) {
	var in Injector[string]
	ctx := context.Background()
	in.InjectRandomly("Sign", 0.3, "throttle", "5xx")
	in.Inject("Sign", "queued", 1)
	if got, _ := in.Begin(ctx, "Sign"); got != "queued" {
		t.Fatalf("first call: got %q, want the queued fault ahead of the random ones", got)
	}
	const n = 10000
	count := map[string]int{}
	for range n {
		got, _ := in.Begin(ctx, "Sign")
		count[got]++
	}
	// Binomial(10000, 0.3): mean 3000, standard deviation 46; ±200 is
	// more than 4 deviations, so this fails by chance about once in 10⁵.
	failed := count["throttle"] + count["5xx"]
	if failed < 2800 || failed > 3200 {
		t.Errorf("%d of %d calls faulted, want about 30%% (2800..3200): %v", failed, n, count)
	}
	if d := count["throttle"] - count["5xx"]; d < 0 || d > 1 {
		t.Errorf("faults not taken in turn: %v", count)
	}
	if got, _ := in.Begin(ctx, "Other"); got != "" {
		t.Fatalf("a fault injected into Sign reached Other: %q", got)
	}
	in.ClearFaults()
	for i := range 100 {
		if got, _ := in.Begin(ctx, "Sign"); got != "" {
			t.Fatalf("call %d after ClearFaults: got %q", i, got)
		}
	}
}

func TestInjectRandomlyRefusesANonsenseFraction(t *testing.T) {
	for _, fraction := range []float64{0, -0.1, 1.5} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("InjectRandomly with fraction %v did not panic", fraction)
				}
			}()
			var in Injector[string]
			in.InjectRandomly("Sign", fraction, "x")
		}()
	}
}
