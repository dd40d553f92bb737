package pcr

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the signer's Prometheus series. Build them with NewMetrics on
// a registry of the caller's; nothing registers itself globally.
type Metrics struct {
	// Issuances counts terminal outcomes by signer, outcome (Issued,
	// Denied, Failed) and reason.
	Issuances *prometheus.CounterVec
	// Latency is the time from PCR creation to its status being written.
	Latency *prometheus.HistogramVec
	// SignDuration and SignErrors describe calls to the key backend.
	SignDuration *prometheus.HistogramVec
	SignErrors   *prometheus.CounterVec
	// CANotAfter is the CA certificate's expiry, as a Unix time.
	CANotAfter *prometheus.GaugeVec
	// Retries counts transient failures that were requeued.
	Retries *prometheus.CounterVec

	reg prometheus.Registerer
}

// NewMetrics creates and registers the series on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		reg: reg,
		Issuances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_pcr_outcomes_total",
			Help: "PodCertificateRequests brought to a terminal state, by signer, outcome and reason.",
		}, []string{"signer", "outcome", "reason"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keyward_pcr_latency_seconds",
			Help:    "Time from a PodCertificateRequest's creation to keyward writing its status.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"signer"}),
		SignDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keyward_backend_sign_duration_seconds",
			Help:    "Duration of signatures by the CA key backend.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"backend"}),
		SignErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_backend_sign_errors_total",
			Help: "Failed signatures by backend and kind (transient, permanent).",
		}, []string{"backend", "kind"}),
		CANotAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_ca_not_after_timestamp_seconds",
			Help: "Expiry of the CA certificate each signer issues under.",
		}, []string{"signer"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_pcr_retries_total",
			Help: "Transient failures (backend or API) that were requeued, by signer.",
		}, []string{"signer"}),
	}
	for _, c := range []prometheus.Collector{m.Issuances, m.Latency, m.SignDuration, m.SignErrors, m.CANotAfter, m.Retries} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// registerQueueDepth exposes the work queue's length.
func (m *Metrics) registerQueueDepth(depth func() int) error {
	return m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keyward_pcr_queue_depth",
		Help: "PodCertificateRequests waiting in the work queue.",
	}, func() float64 { return float64(depth()) }))
}
