package approver

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the approver's Prometheus metrics.
type Metrics struct {
	// Decisions counts CSRs approved or denied, by signer name, outcome
	// (approved, denied) and condition reason.
	Decisions *prometheus.CounterVec
	// Retries counts syncs that failed transiently (or found a kubelet
	// client CSR whose requester no SubjectAccessReview allowed yet).
	Retries *prometheus.CounterVec
}

// NewMetrics registers the approver's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		Decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_approver_decisions_total",
			Help: "CertificateSigningRequests approved or denied, by signer name, outcome and reason.",
		}, []string{"signer", "outcome", "reason"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_approver_retries_total",
			Help: "CertificateSigningRequest syncs retried with backoff, by signer name.",
		}, []string{"signer"}),
	}
	for _, c := range []prometheus.Collector{m.Decisions, m.Retries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
