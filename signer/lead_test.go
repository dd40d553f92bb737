package signer

import (
	"context"
	"errors"
	"testing"
)

// While leading, every controller runs until the Lease is lost; an error
// from any one (an AlsoLead hook or the PCR controller) ends them all and
// is returned, and one that finishes early leaves the others running.
func TestLeadAllEndsEveryRunOnTheFirstError(t *testing.T) {
	broken := errors.New("trust publisher failed")
	untilDone := func(ctx context.Context) error { <-ctx.Done(); return nil }
	finished := func(context.Context) error { return nil }

	err := LeadAll(context.Background(), []func(context.Context) error{untilDone, finished, func(context.Context) error { return broken }, untilDone})
	if !errors.Is(err, broken) {
		t.Fatalf("LeadAll = %v, want the failing run's error", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan error, 1)
	go func() { ended <- LeadAll(ctx, []func(context.Context) error{untilDone, finished}) }()
	select {
	case err := <-ended:
		t.Fatalf("LeadAll returned %v when one run finished early, want it to keep leading", err)
	default:
	}
	cancel()
	if err := <-ended; err != nil {
		t.Fatalf("LeadAll after the Lease ended = %v, want nil", err)
	}
}
