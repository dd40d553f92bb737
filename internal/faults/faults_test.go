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
