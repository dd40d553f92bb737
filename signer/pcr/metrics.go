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
	// SignDuration and SignErrors describe calls that reached the key
	// backend (ObserveSign); refusals before the backend are not counted.
	SignDuration *prometheus.HistogramVec
	SignErrors   *prometheus.CounterVec
	// StatusRejected counts status writes kube-apiserver refused, by
	// signer and what the refusal meant (classifyWrite).
	StatusRejected *prometheus.CounterVec
	// PermissionMissing is 1 while the signer lacks a grant it needs for a
	// signer name (it then signs nothing for that name).
	PermissionMissing *prometheus.GaugeVec
	// ClockSkew is 1 while kube-apiserver refuses the notBefore of fresh
	// certificates (signing paused for that signer).
	ClockSkew *prometheus.GaugeVec
	// Events and EventsDropped count Events recorded and dropped by type.
	Events        *prometheus.CounterVec
	EventsDropped *prometheus.CounterVec
	// EventWriteErrors counts Event writes to the apiserver that failed.
	EventWriteErrors prometheus.Counter
	// CANotAfter is the expiry of each CA generation whose key is open, as
	// a Unix time, by signer and generation.
	CANotAfter *prometheus.GaugeVec
	// Retries counts transient failures that were requeued.
	Retries *prometheus.CounterVec
	// IntermediateNotAfter is the expiry of the in-memory intermediate
	// (signers[].intermediate) each signer name issues with, by signer;
	// IntermediateSigned counts the intermediates the CA key signed, and
	// the attempts that failed, by signer and result (signed, failed).
	IntermediateNotAfter *prometheus.GaugeVec
	IntermediateSigned   *prometheus.CounterVec

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
			Help:    "Time from keyward first seeing a PodCertificateRequest (or its creation, if that was over a second earlier) to its terminal status being written.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"signer"}),
		SignDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keyward_backend_sign_duration_seconds",
			Help:    "Duration of signature calls that reached the CA key backend (calls refused before reaching it are not counted).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 5},
		}, []string{"backend"}),
		SignErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_backend_sign_errors_total",
			Help: "Signature calls that reached the CA key backend and failed, by backend and kind (transient, permanent).",
		}, []string{"backend", "kind"}),
		CANotAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_ca_not_after_timestamp_seconds",
			Help: "Expiry of the CA certificate of every generation whose key the signer has open (Staged, Promoted or Active), by signer name and generation.",
		}, []string{"signer", "generation"}),
		IntermediateNotAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_intermediate_not_after_timestamp_seconds",
			Help: "Expiry of the in-memory intermediate CA (signers[].intermediate) this replica issues with, by signer name; absent until the first is signed.",
		}, []string{"signer"}),
		IntermediateSigned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_intermediate_signatures_total",
			Help: "In-memory intermediate CAs (signers[].intermediate) the CA key was asked to sign, by signer name and result (signed, failed).",
		}, []string{"signer", "result"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_pcr_retries_total",
			Help: "Transient failures (backend or API) that were requeued, by signer.",
		}, []string{"signer"}),
		StatusRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_pcr_status_rejected_total",
			Help: "Status writes kube-apiserver refused, by signer and meaning (noPermission, notBeforeWindow, rejected, alreadyTerminal, conflict, gone, transient).",
		}, []string{"signer", "result"}),
		PermissionMissing: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_signer_permission_missing",
			Help: "1 while the signer lacks an RBAC grant it needs for the signer name (nothing is signed for it meanwhile), else 0.",
		}, []string{"signer"}),
		ClockSkew: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_signer_clock_skew_suspected",
			Help: "1 while kube-apiserver refuses the notBefore of freshly signed certificates for the signer name (clocks more than 5 minutes minus the backdate apart; signing paused), else 0.",
		}, []string{"signer"}),
		Events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_events_total",
			Help: "Events handed to the Event broadcaster, by type and reason.",
		}, []string{"type", "reason"}),
		EventWriteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "keyward_event_write_errors_total",
			Help: "Failed Event write attempts to the apiserver (client-go retries a few times, then drops the Event); a Patch of an expired Event, which client-go re-creates, is not counted.",
		}),
		EventsDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_events_dropped_total",
			Help: "Events not recorded because their type's rate was exhausted, by type.",
		}, []string{"type"}),
	}
	for _, c := range []prometheus.Collector{m.Issuances, m.Latency, m.SignDuration, m.SignErrors, m.CANotAfter, m.Retries,
		m.IntermediateNotAfter, m.IntermediateSigned, m.StatusRejected, m.PermissionMissing, m.ClockSkew, m.Events, m.EventsDropped, m.EventWriteErrors} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// ObserveSign records one signature call that reached the backend.
func (m *Metrics) ObserveSign(backend string, seconds float64, err error) {
	m.SignDuration.WithLabelValues(backend).Observe(seconds)
	if err != nil {
		m.SignErrors.WithLabelValues(backend, Classify(err).String()).Inc()
	}
}

// registerQueueGauges exposes the work queue's length and the requests
// not yet terminal, wherever they wait.
func (m *Metrics) registerQueueGauges(depth, pending func() int) error {
	if err := m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keyward_pcr_queue_depth",
		Help: "PodCertificateRequests ready to be worked on now (excludes those waiting for a retry, a rate-limit token or a permission: see keyward_pcr_pending_requests).",
	}, func() float64 { return float64(depth()) })); err != nil {
		return err
	}
	return m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "keyward_pcr_pending_requests",
		Help: "PodCertificateRequests seen by this leader and not yet brought to a terminal status, wherever they wait (queue, retry backoff, rate limit, missing permission).",
	}, func() float64 { return float64(pending()) }))
}

// RegisterMetrics registers every series the PodCertificateRequest
// controller exports on reg, as NewMetrics and New do; the metrics reference
// (deploy/observability) reads them from there.
func RegisterMetrics(reg prometheus.Registerer) error {
	m, err := NewMetrics(reg)
	if err != nil {
		return err
	}
	zero := func() int { return 0 }
	return m.registerQueueGauges(zero, zero)
}
