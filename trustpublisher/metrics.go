package trustpublisher

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
)

var allPhases = []v1alpha1.Phase{v1alpha1.PhaseStaged, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, v1alpha1.PhaseRetiring, v1alpha1.PhaseRetired}

// metrics are the trust publisher's series, registered on the registry
// Options.Metrics names (none when it is nil).
type metrics struct {
	phase       *prometheus.GaugeVec
	bundleGen   *prometheus.GaugeVec
	gateSeconds *prometheus.GaugeVec
	caNotAfter  *prometheus.GaugeVec
	leadTime    *prometheus.GaugeVec
	held        *prometheus.GaugeVec
	foreign     *prometheus.CounterVec

	mu      sync.Mutex
	signers map[string]string // Authority name → signer name
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_trust_generation_phase",
			Help: "1 for the observed phase of each CA generation, 0 for the other phases.",
		}, []string{"signer", "generation", "phase"}),
		bundleGen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_trust_bundle_generation",
			Help: "metadata.generation of each published ClusterTrustBundle (canary, live); absent while the bundle has no member.",
		}, []string{"signer", "version"}),
		gateSeconds: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_trust_gate_opens_seconds",
			Help: "Seconds until the time-bound gate that holds a generation opens, as of the latest sync (negative: overdue).",
		}, []string{"signer", "generation", "gate"}),
		caNotAfter: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_trust_ca_not_after_timestamp_seconds",
			Help: "notAfter of each CA generation's certificate (certificatePEM), as a Unix time.",
		}, []string{"signer", "generation"}),
		leadTime: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_trust_rotation_lead_time_seconds",
			Help: "How long before the Active CA's notAfter a rotation must start: canarySoak + propagationWindow + the time until the latest leaf signed by the Active generation expires.",
		}, []string{"signer"}),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "keyward_trust_step_held_seconds",
			Help: "Seconds a generation has sat in its observed phase while a gate holds it from the phase its spec asks for, by the gate that holds it now, as of the latest sync.",
		}, []string{"signer", "generation", "phase", "gate"}),
		foreign: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keyward_trust_foreign_phases_total",
			Help: "Status phases of a CA generation that the trust publisher did not move (reason PhaseNotOurs), or that were reached with another certificate (CertificateChanged), found and not acted on.",
		}, []string{"signer", "generation", "reason"}),
		signers: map[string]string{},
	}
	if reg == nil {
		return m, nil
	}
	if err := reg.Register(m.foreign); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return nil, fmt.Errorf("registering trust publisher metrics: %w", err)
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return nil, fmt.Errorf("registering trust publisher metrics: %w", err)
		}
		m.foreign = existing
	}
	for _, v := range []**prometheus.GaugeVec{&m.phase, &m.bundleGen, &m.gateSeconds, &m.caNotAfter, &m.leadTime, &m.held} {
		err := reg.Register(*v)
		var are prometheus.AlreadyRegisteredError
		switch {
		case err == nil:
		case errors.As(err, &are):
			// A Controller built again on the same registry (a new
			// leadership term) shares the series.
			existing, ok := are.ExistingCollector.(*prometheus.GaugeVec)
			if !ok {
				return nil, fmt.Errorf("registering trust publisher metrics: %w", err)
			}
			*v = existing
		default:
			return nil, fmt.Errorf("registering trust publisher metrics: %w", err)
		}
	}
	return m, nil
}

// observe replaces one Authority's series with what this sync found.
func (m *metrics) observe(a *v1alpha1.Authority, parsed parsedGenerations, plan Plan, bundles []desiredBundle, results []publishResult, now time.Time) {
	signer := a.Spec.SignerName
	m.mu.Lock()
	m.signers[a.Name] = signer
	m.mu.Unlock()
	m.clear(signer)
	for _, g := range a.Status.Generations {
		for _, p := range allPhases {
			v := 0.0
			if g.Phase == p {
				v = 1
			}
			m.phase.WithLabelValues(signer, g.Name, string(p)).Set(v)
		}
	}
	since := map[string]time.Time{}
	for _, g := range a.Status.Generations {
		if g.Since != nil {
			since[g.Name] = g.Since.Time
		}
	}
	for _, s := range plan.Steps {
		if s.Gate != "" && s.OpensAt != nil {
			m.gateSeconds.WithLabelValues(signer, s.Generation, s.Gate).Set(s.OpensAt.Sub(now).Seconds())
		}
		if t, ok := since[s.Generation]; ok && s.Gate != "" && !s.Moves() {
			m.held.WithLabelValues(signer, s.Generation, string(s.Observed), s.Gate).Set(now.Sub(t).Seconds())
		}
	}
	for _, g := range a.Spec.Generations {
		if certs, err := parsed.certs(g); err == nil {
			m.caNotAfter.WithLabelValues(signer, g.Name).Set(float64(certs[0].NotAfter.Unix()))
		}
	}
	m.leadTime.WithLabelValues(signer).Set(rotationLeadTime(a, now).Seconds())
	for i, b := range bundles {
		if b.pem != "" && results[i].err == nil && results[i].generation > 0 {
			m.bundleGen.WithLabelValues(signer, b.version).Set(float64(results[i].generation))
		}
	}
}

func (m *metrics) clear(signer string) {
	l := prometheus.Labels{"signer": signer}
	m.phase.DeletePartialMatch(l)
	m.bundleGen.DeletePartialMatch(l)
	m.gateSeconds.DeletePartialMatch(l)
	m.caNotAfter.DeletePartialMatch(l)
	m.leadTime.DeletePartialMatch(l)
	m.held.DeletePartialMatch(l)
}

// rotationLeadTime is the shortest time a rotation takes before the old
// Active generation may expire without harm: the new root soaks in the
// canary bundle, then sits in the live bundle for the propagation window,
// and the leaves the old generation signed must run out (its
// lastIssuedNotAfter, as of now).
func rotationLeadTime(a *v1alpha1.Authority, now time.Time) time.Duration {
	soak, window := GateDurations(a)
	lead := soak + window
	for _, g := range a.Status.Generations {
		if g.Phase == v1alpha1.PhaseActive && g.LastIssuedNotAfter != nil && g.LastIssuedNotAfter.After(now) {
			lead += g.LastIssuedNotAfter.Sub(now)
		}
	}
	return lead
}

// RegisterMetrics registers the trust publisher's series on reg, as New
// does; the metrics reference (deploy/observability) reads them from there.
func RegisterMetrics(reg prometheus.Registerer) error {
	_, err := newMetrics(reg)
	return err
}

// foreignPhase counts one finding of record.Verify.
func (m *metrics) foreignPhase(signer, generation, reason string) {
	m.foreign.WithLabelValues(signer, generation, reason).Inc()
}

// forget drops the series of a deleted Authority.
func (m *metrics) forget(name string) {
	m.mu.Lock()
	signer, ok := m.signers[name]
	delete(m.signers, name)
	m.mu.Unlock()
	if ok {
		m.clear(signer)
	}
}
