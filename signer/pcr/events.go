package pcr

import (
	"fmt"
	"time"

	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/signer/config"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/clock"
)

// EventPolicy says which Events the controller records and how many. An
// Event is for a person running `kubectl describe`: Warnings (denials,
// failures, delays, refused writes) always; Issued only when asked for,
// since at thousands of issuances a second the audit log line, the
// metrics and the PCR's own Issued condition are the record. Events beyond
// the rates are dropped and counted (keyward_events_dropped_total), never
// queued without bound and never in the way of issuance.
type EventPolicy struct {
	// Issued records a Normal Event for every issued certificate.
	Issued bool
	// WarningsPerSecond and NormalPerSecond bound each kind (token buckets
	// with a burst of 10 seconds' worth); default config.DefaultEventsPerSecond.
	// The Events client's own QPS (signer/run.go) is above their sum, so
	// client-go's broadcaster queue never fills and drops silently.
	WarningsPerSecond float64
	NormalPerSecond   float64
}

// delayedEventEvery coalesces SigningDelayed Events of one request.
const delayedEventEvery = 5 * time.Minute

// eventLog records Events within EventPolicy's rates.
type eventLog struct {
	rec              record.EventRecorder
	policy           EventPolicy
	warnings, normal *rate.Limiter
	clock            clock.Clock
	metrics          *Metrics
}

func newEventLog(rec record.EventRecorder, p EventPolicy, c clock.Clock, m *Metrics) *eventLog {
	if p.WarningsPerSecond <= 0 {
		p.WarningsPerSecond = config.DefaultEventsPerSecond
	}
	if p.NormalPerSecond <= 0 {
		p.NormalPerSecond = config.DefaultEventsPerSecond
	}
	return &eventLog{rec: rec, policy: p, clock: c, metrics: m,
		warnings: rate.NewLimiter(rate.Limit(p.WarningsPerSecond), int(max(1, 10*p.WarningsPerSecond))),
		normal:   rate.NewLimiter(rate.Limit(p.NormalPerSecond), int(max(1, 10*p.NormalPerSecond))),
	}
}

// issued records an Issued Event if the policy asks for them.
func (e *eventLog) issued(obj runtime.Object, format string, args ...any) {
	if e.rec == nil || !e.policy.Issued {
		return
	}
	e.record(obj, corev1.EventTypeNormal, ReasonIssued, fmt.Sprintf(format, args...))
}

// warning records a Warning Event.
func (e *eventLog) warning(obj runtime.Object, reason, format string, args ...any) {
	if e.rec == nil {
		return
	}
	e.record(obj, corev1.EventTypeWarning, reason, fmt.Sprintf(format, args...))
}

func (e *eventLog) record(obj runtime.Object, typ, reason, msg string) {
	l := e.normal
	if typ == corev1.EventTypeWarning {
		l = e.warnings
	}
	if !l.AllowN(e.clock.Now(), 1) {
		e.metrics.EventsDropped.WithLabelValues(typ).Inc()
		return
	}
	e.metrics.Events.WithLabelValues(typ, reason).Inc()
	e.rec.Event(obj, typ, reason, kubemsg.Truncate(msg, kubemsg.MaxEventMessage))
}
