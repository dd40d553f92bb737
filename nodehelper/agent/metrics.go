package agent

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Reasons of keyward_node_credential_renew_errors_total.
const (
	ReasonDenied   = "Denied"   // the CSR was denied
	ReasonFailed   = "Failed"   // the signer marked the CSR Failed
	ReasonDeleted  = "Deleted"  // the CSR was deleted while waited for
	ReasonTimeout  = "Timeout"  // not issued within renewal.waitTimeout
	ReasonConflict = "Conflict" // a CSR of that name with other content exists
	ReasonAPI      = "API"      // creating or reading the CSR failed
	ReasonInvalid  = "Invalid"  // the issued chain is unusable (key mismatch, expired)
	ReasonStore    = "Store"    // reading or writing the state directory failed
	ReasonOutput   = "Output"   // writing the output files failed
	ReasonSchedule = "Schedule" // the certificate issued was due for renewal at once
)

// metrics are the agent's, in its own registry (prefix keyward_node_);
// keyward_node_credential_expired{credential} is a GaugeFunc per credential
// (newCredential).
type metrics struct {
	registry     *prometheus.Registry
	expiration   *prometheus.GaugeVec
	renewals     *prometheus.CounterVec
	renewErrors  *prometheus.CounterVec
	trustWrites  *prometheus.CounterVec
	trustUpdated *prometheus.GaugeVec
	trustCerts   *prometheus.GaugeVec
	// trustOverLimit and trustIgnored: see newMetrics.
	trustOverLimit *prometheus.GaugeVec
	trustIgnored   *prometheus.GaugeVec
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		expiration: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "keyward_node", Name: "credential_expiration_seconds",
			Help: "NotAfter of the credential's current certificate, as Unix time (0: none yet).",
		}, []string{"credential"}),
		renewals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyward_node", Name: "credential_renewals_total",
			Help: "Certificates obtained and written, per credential.",
		}, []string{"credential"}),
		renewErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyward_node", Name: "credential_renew_errors_total",
			Help: "Failed renewal attempts, per credential and reason.",
		}, []string{"credential", "reason"}),
		trustWrites: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "keyward_node", Name: "trust_bundle_writes_total",
			Help: "Times the trust file was (re)written.",
		}, []string{"trust"}),
		trustUpdated: trustGauge("trust_bundle_last_update_seconds",
			"When the trust file was last written, as Unix time."),
		trustCerts: trustGauge("trust_bundle_certificates",
			"Certificates in the trust file."),
		trustOverLimit: trustGauge("trust_bundle_over_limit",
			"1 while the selected bundles exceed maxCertificates or maxBytes (the last good trust file stays)."),
		trustIgnored: trustGauge("trust_bundles_ignored",
			"ClusterTrustBundles of the signer and version left out because their name is neither keyward's nor in additionalBundleNames."),
	}
	m.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.registry.MustRegister(m.collectors()...)
	return m
}

// trustGauge is a keyward_node_ gauge per trust file (label trust).
func trustGauge(name, help string) *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "keyward_node", Name: name, Help: help}, []string{"trust"})
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.expiration, m.renewals, m.renewErrors, m.trustWrites, m.trustUpdated, m.trustCerts, m.trustOverLimit, m.trustIgnored}
}

// expiredGauge is keyward_node_credential_expired{credential}: expired
// reports 1 or 0.
func expiredGauge(credential string, expired func() float64) prometheus.GaugeFunc {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "keyward_node", Name: "credential_expired",
		Help:        "1 while the credential's current certificate has expired, or none exists after the first try.",
		ConstLabels: prometheus.Labels{"credential": credential},
	}, expired)
}

// RegisterMetrics registers the agent's own series on reg (not the Go and
// process collectors), with keyward_node_credential_expired for one
// credential named credential; the metrics reference (deploy/observability)
// reads them from there.
func RegisterMetrics(reg prometheus.Registerer, credential string) error {
	for _, c := range append(newMetrics().collectors(), expiredGauge(credential, func() float64 { return 0 })) {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
