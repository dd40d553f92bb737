package signer

import (
	"errors"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// MaxStuck is documented as a cap on backend calls that outlived their
// caller (each holds a goroutine and, with PKCS#11, a token session). It is
// only checked when a call starts, so calls already in the backend when
// the device hangs all become stuck: with W concurrent callers the cap is
// MaxStuck+W-1. With workers: 16 and a hung token, that is 19 calls, more
// than the 15 sessions crypto11 leaves by default.
func TestReviewMaxStuckIsACapUnderConcurrency(t *testing.T) {
	hk := newHungKey(t, false)
	clk := clocktesting.NewFakeClock(time.Now())
	g, err := newKeyGuard(hk, keyOptions{Clock: clk, MaxStuck: 1})
	if err != nil {
		t.Fatal(err)
	}
	const callers = 4
	var ctxs []*expiringCtx
	var results []<-chan signResult
	var releases []chan<- error
	for range callers {
		ctx := newExpiringCtx()
		ctxs = append(ctxs, ctx)
		results = append(results, startSign(g, ctx))
		releases = append(releases, recv(t, hk.entered, "the call to reach the backend"))
	}
	clk.Step(30 * time.Second)
	for i, ctx := range ctxs {
		ctx.expire()
		recv(t, results[i], "the caller to be freed")
	}
	var se *stuckError
	if err := g.stuckCalls(); errors.As(err, &se) && se.N > 1 {
		t.Errorf("%d calls stuck in the backend with MaxStuck 1", se.N)
	}
	for _, r := range releases {
		r <- nil
	}
}
