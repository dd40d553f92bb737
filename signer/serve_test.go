package signer

import (
	"context"
	"net/http"
	"testing"

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
