package signer

import (
	"context"
	"errors"
	"net/http"
	"testing"

	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"

	"github.com/keyward/keyward/signer/config"
	"github.com/prometheus/client_golang/prometheus"
)

// pprof is served on the metrics address only when profiling is on.
func TestProfilingIsOptIn(t *testing.T) {
	for _, on := range []bool{false, true} {
		cfg := &config.SignerConfiguration{MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0", Profiling: on}
		metricsAddr, _, stop, err := serve(context.Background(), cfg, prometheus.NewRegistry(), &state{})
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + metricsAddr + "/debug/pprof/")
		stop()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := map[bool]int{false: http.StatusNotFound, true: http.StatusOK}[on]; resp.StatusCode != want {
			t.Errorf("profiling %v: /debug/pprof/ answered %d, want %d", on, resp.StatusCode, want)
		}
	}
}

type failingSink struct{ err error }

func (f failingSink) Create(e *corev1.Event) (*corev1.Event, error) { return nil, f.err }
func (f failingSink) Update(e *corev1.Event) (*corev1.Event, error) { return nil, f.err }
func (f failingSink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return nil, f.err
}

// Event writes the apiserver refuses are counted: client-go drops such an
// Event after a few retries, and nothing else would show it.
func TestFailedEventWritesAreCounted(t *testing.T) {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	sink := &countingSink{EventSink: failingSink{err: errors.New("apiserver unavailable")}, failed: c}
	_, _ = sink.Create(&corev1.Event{})
	_, _ = sink.Update(&corev1.Event{})
	_, _ = sink.Patch(&corev1.Event{}, nil)
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); got != 3 {
		t.Fatalf("counted %v failed writes, want 3", got)
	}
}
