package signer

// Tests written by the third review (commits fcb6d6a, b9e6b6c, 6b80f6f,
// ffd50dd). Each one fails on the code as reviewed.

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
)

// goneEventSink is an apiserver whose Events expired (the default Event
// TTL is one hour): a Patch of an aggregated Event finds nothing, a Create
// succeeds.
type goneEventSink struct {
	mu      sync.Mutex
	created int
}

func (s *goneEventSink) Create(e *corev1.Event) (*corev1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.created++
	return e, nil
}

func (s *goneEventSink) Update(e *corev1.Event) (*corev1.Event, error) { return e, nil }

func (s *goneEventSink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "events"}, e.Name)
}

func (s *goneEventSink) creates() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.created
}

// keyward_event_write_errors_total is meant to count Events client-go
// failed to write (and dropped). client-go's recordEvent patches a
// repeated Event and, when the Patch answers 404 (the Event expired),
// creates it instead: both Events reach the apiserver, yet the 404 of the
// Patch is counted as a failed write. (It also counts every one of the up
// to 12 tries of an Event as a separate failure.) An alert on this metric
// fires on a healthy cluster once any warning repeats for over an hour.
func TestAnExpiredEventRecreatedIsNotAWriteError(t *testing.T) {
	failed := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	sink := &goneEventSink{}
	b := record.NewBroadcaster(record.WithSleepDuration(time.Millisecond))
	b.StartRecordingToSink(&countingSink{EventSink: sink, failed: failed})
	defer b.Shutdown()
	rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "keyward-signer"})
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u"}}
	rec.Event(pod, corev1.EventTypeWarning, "SigningDelayed", "will retry")
	rec.Event(pod, corev1.EventTypeWarning, "SigningDelayed", "will retry") // aggregated: a Patch
	deadline := time.Now().Add(5 * time.Second)
	for sink.creates() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if sink.creates() != 2 {
		t.Fatalf("%d Events created, want 2", sink.creates())
	}
	var m dto.Metric
	if err := failed.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 0 {
		t.Errorf("both Events were written, yet keyward_event_write_errors_total = %v; want 0", got)
	}
}
