package tokenservice

import (
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"
)

// TestRefusalsAreAuditedOnceThenSummedPerMinute: a flood of refusals from
// one client is one audit line as it starts and one summary line a minute
// ("Refused … in the last minute", with the count), at default verbosity;
// another client or reason gets its own first line.
func TestRefusalsAreAuditedOnceThenSummedPerMinute(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	l := newRefusalLog(clk)
	ctx, logged := capturedLog(t)
	logger := klog.FromContext(ctx)
	bad := &RefusedError{Reason: ReasonBadSignature, Message: "not signed by the cluster's service-account issuer"}
	for range 500 {
		l.note(logger, bad, "10.0.0.9:1234", "/token", "registry.example.com")
	}
	l.note(logger, bad, "10.0.0.7:1", "/token", "registry.example.com")
	l.note(logger, &RefusedError{Reason: ReasonExpired, Message: "expired"}, "10.0.0.9:4321", "/token", "registry.example.com")
	if lines := logged(); len(lines) != 3 {
		t.Fatalf("logged %d lines for 502 refusals from two clients, want three first lines:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	clk.Step(RefusalLogWindow - time.Second)
	l.flush(logger)
	if n := len(logged()); n != 3 {
		t.Fatalf("a summary before the minute is over (%d lines)", n)
	}
	clk.Step(time.Second)
	l.flush(logger)
	lines := logged()
	if len(lines) != 4 || !strings.Contains(lines[3], "Refused service-account tokens with bad signatures in the last minute") ||
		!strings.Contains(lines[3], `"count"=500`) || !strings.Contains(lines[3], `"remote"="10.0.0.9"`) {
		t.Fatalf("after the minute, want one summary of 500 bad signatures from 10.0.0.9:\n%s", strings.Join(lines, "\n"))
	}
	// A new window: the next refusal is a first line again.
	l.note(logger, bad, "10.0.0.9:1234", "/token", "registry.example.com")
	if n := len(logged()); n != 5 {
		t.Errorf("%d lines, want the new window's first refusal logged", n)
	}
}
