package softhsmtests

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
)

// A signer whose configuration says nothing about rate limits still holds
// each node to the default per-node bucket (5/s, burst 110), in delay mode:
// one node creating 150 PCRs at once has no more Issued than its bucket
// allows at any moment, another node's PCR is Issued while the flooder is
// held back, and every flooding PCR ends Issued (never Denied or Failed).
func TestDefaultPerNodeLimitHoldsAFloodingNode(t *testing.T) {
	const (
		qps, burst = config.DefaultPerNodeQPS, config.DefaultPerNodeBurst
		floodN     = burst + 40 // 8 s of tokens past the burst
	)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	suffix := uniqueName(t, "dl")
	name := "keyward.dev/deflimit-" + suffix
	keyURI, caFile, _ := caInToken(t, "ca-"+suffix)
	cfg := baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile))
	cfg.Signers[0].RateLimits = config.RateLimits{} // silent, as a shipped configuration
	cfg.Default()
	if r := cfg.Signers[0].RateLimits; r.PerNode == nil || r.PerNode.QPS != qps || r.PerNode.Burst != burst || r.OnLimit != "delay" {
		t.Fatalf("rateLimits after defaulting: %+v, want perNode %d/s burst %d, delay", r, qps, burst)
	}
	rs := runSigner(t, cfg, "deflimit")

	flood := podOnNode(t, ctx, uniqueName(t, "flood"), name)
	quiet := podOnNode(t, ctx, uniqueName(t, "quiet"), name)
	floodWatch := watchIssuedIn(t, ctx, flood.Pod.Namespace, floodN)
	quietWatch := watchIssuedIn(t, ctx, quiet.Pod.Namespace, 1)

	var mu sync.Mutex
	var errs []error
	start := time.Now()
	node := nodeClient(t, flood.Node.Name)
	parallel(floodN, 8, func(int) {
		if _, _, err := tryCreatePCR(ctx, node, flood, name, pcrOptions{}); err != nil {
			mu.Lock()
			errs = append(errs, err)
			mu.Unlock()
		}
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("flooding node creating PCRs: %v", err)
	}
	// The other node asks once the flood is in: it is not queued behind it.
	if _, _, err := tryCreatePCR(ctx, nodeClient(t, quiet.Node.Name), quiet, name, pcrOptions{}); err != nil {
		t.Fatalf("other node creating its PCR: %v", err)
	}
	quietWatch.wait(t, time.Minute)
	var quietAt time.Time
	quietWatch.mu.Lock()
	for _, at := range quietWatch.seen {
		quietAt = at
	}
	quietWatch.mu.Unlock()
	floodWatch.wait(t, 2*time.Minute)

	floodWatch.mu.Lock()
	var floodTimes []time.Time
	for _, at := range floodWatch.seen {
		floodTimes = append(floodTimes, at)
	}
	floodWatch.mu.Unlock()
	slices.SortFunc(floodTimes, func(a, b time.Time) int { return a.Compare(b) })
	before := 0
	for _, at := range floodTimes {
		if at.Before(quietAt) {
			before++
		}
	}
	t.Logf("flooding node: %d PCRs Issued over %s; the other node's PCR Issued %s into the flood, when the flooder had %d",
		len(floodTimes), floodTimes[len(floodTimes)-1].Sub(start).Round(time.Millisecond), quietAt.Sub(start).Round(time.Millisecond), before)
	if before >= floodN {
		t.Errorf("the other node's PCR was Issued only after all %d of the flooder's", floodN)
	}
	for i, at := range floodTimes {
		if allowed := float64(burst) + 1 + qps*at.Sub(start).Seconds(); float64(i+1) > allowed {
			t.Errorf("the flooding node had %d PCRs Issued %s into the flood; the default bucket allows %.0f", i+1, at.Sub(start).Round(time.Millisecond), allowed)
			break
		}
	}
	if n := floodWatch.failed.Load(); n != 0 {
		t.Errorf("%d of the flooder's PCRs ended Denied or Failed, want every one delayed and Issued", n)
	}
	reconcileIssued(t, floodN+1, time.Minute, namespacesOf(flood, quiet), logFileOf(rs.LogPath))
}
