package tokenservice

import (
	"sync"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	// RefusalLogWindow is how long refusals of one reason from one
	// client are summed into one line after the first.
	RefusalLogWindow = time.Minute
	// maxRefusalKeys bounds the (reason, client) pairs one window tracks;
	// past it, new clients are summed as "other".
	maxRefusalKeys = 1000
)

// refusalLog audits refusals of tokens the apiserver did not authenticate
// at the default verbosity, rate-limited: the first of a reason from a
// client (remote host) in a window is one line as it happens, the rest one
// summary line per window ("Refused N … from X in the last minute"). A
// flood of forged tokens is thus a handful of lines, not one per token.
// It is safe for concurrent use.
type refusalLog struct {
	clock clock.PassiveClock

	mu    sync.Mutex
	start time.Time // of the current window
	keys  map[refusalKey]int
}

type refusalKey struct{ reason, client string }

func newRefusalLog(clk clock.PassiveClock) *refusalLog {
	return &refusalLog{clock: clk, keys: map[refusalKey]int{}}
}

// note records one refusal; it logs it when it is the first of its key in
// the window, and the last window's summary when the window is over.
func (l *refusalLog) note(logger klog.Logger, r *RefusedError, client, endpoint, service string) {
	k := refusalKey{reason: r.Reason, client: remoteHost(client)}
	l.mu.Lock()
	summary := l.rollLocked()
	if _, ok := l.keys[k]; !ok && len(l.keys) >= maxRefusalKeys {
		k.client = "other"
	}
	n, seen := l.keys[k]
	l.keys[k] = n + 1
	l.mu.Unlock()
	emit(logger, summary)
	if seen {
		return
	}
	id := r.Identity
	logger.WithName("audit").Info("Registry token refused (more of this reason from this client are summed once a minute)",
		"reason", r.Reason, "message", r.Message, "signed", r.Signed,
		"namespace", id.Namespace, "sa", id.ServiceAccount, "pod", id.PodName, "podUID", id.PodUID, "node", id.NodeName,
		"service", service, "endpoint", endpoint, "remote", client)
}

// flush logs the summary of a window that is over.
func (l *refusalLog) flush(logger klog.Logger) {
	l.mu.Lock()
	summary := l.rollLocked()
	l.mu.Unlock()
	emit(logger, summary)
}

// rollLocked starts a new window when the current one is over and
// returns the counts past the first of the one that ended.
func (l *refusalLog) rollLocked() map[refusalKey]int {
	now := l.clock.Now()
	if l.start.IsZero() {
		l.start = now
	}
	if now.Sub(l.start) < RefusalLogWindow {
		return nil
	}
	ended := l.keys
	l.keys = map[refusalKey]int{}
	l.start = now
	return ended
}

func emit(logger klog.Logger, summary map[refusalKey]int) {
	for k, n := range summary {
		if n <= 1 {
			continue // the first was logged as it came
		}
		msg := "Refused service-account tokens in the last minute"
		if k.reason == ReasonBadSignature {
			msg = "Refused service-account tokens with bad signatures in the last minute"
		}
		logger.WithName("audit").Info(msg, "reason", k.reason, "count", n, "remote", k.client)
	}
}
