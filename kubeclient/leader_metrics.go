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
