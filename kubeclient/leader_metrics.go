package kubeclient

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// NewLeaderGauge is keyward_leader{lease}: 1 while this process does its
// leader's work for lease (it holds the Lease, or runs without leader
// election), else 0. Summed over the replicas it tells whether anyone leads.
func NewLeaderGauge(lease string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "keyward_leader",
		Help:        "1 while this replica does the leader's work for the Lease (or runs without leader election), else 0.",
		ConstLabels: prometheus.Labels{"lease": lease},
	})
}

// Leading wraps lead so that g reads 1 while lead runs.
func Leading(g prometheus.Gauge, lead func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		g.Set(1)
		defer g.Set(0)
		return lead(ctx)
	}
}

// NewFenceRefusals is keyward_leader_fence_refused_total{lease}: how many
// times this replica's fence refused to let a signature or status write
// start (it held the Lease but had not renewed it within renewDeadline, or
// no longer held it). A refused request waits, parked, until the fence
// opens again, so each counts about once per time the fence shuts;
// operations cut off under way are not counted. A steady rise on the leader means its Lease renewals are late:
// the control plane is slower than the leaderElection settings allow
// (docs/signer.md, "The trade").
func NewFenceRefusals(lease string, f *Fence) prometheus.CounterFunc {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name:        "keyward_leader_fence_refused_total",
		Help:        "Tries to start a signature or status write refused because this replica could not be sure it still held the Lease (a refused request waits until the fence opens again).",
		ConstLabels: prometheus.Labels{"lease": lease},
	}, func() float64 { return float64(f.Refused()) })
}
