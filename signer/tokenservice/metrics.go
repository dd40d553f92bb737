package tokenservice

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the token service's Prometheus metrics (prefix
// keyward_token_). A nil *Metrics records nothing.
type Metrics struct {
	Requests       *prometheus.CounterVec // endpoint, code
	IssueDuration  prometheus.Histogram   // request to response, 200s only
	ReviewDuration prometheus.Histogram   // TokenReview + Pod + ServiceAccount, cache misses
	ReviewHits     prometheus.Counter
	GrantedScopes  prometheus.Counter
	DroppedScopes  prometheus.Counter
	SigningErrors  prometheus.Counter
	Refused        *prometheus.CounterVec // reason
}

// NewMetrics builds the metrics and registers them with reg (nil: not
// registered). Registering twice on one registry reuses the first set.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	buckets := []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "keyward_token_requests_total",
			Help: "Requests to the token service, by endpoint (token, credential) and HTTP status code."}, []string{"endpoint", "code"}),
		IssueDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "keyward_token_issue_duration_seconds",
			Help: "Time from request to response of requests answered 200.", Buckets: buckets}),
		ReviewDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "keyward_token_review_duration_seconds",
			Help: "Time to validate a service-account token with the apiserver (TokenReview, Pod, ServiceAccount), cache misses only.", Buckets: buckets}),
		ReviewHits: prometheus.NewCounter(prometheus.CounterOpts{Name: "keyward_token_review_cache_hits_total",
			Help: "Service-account token validations answered from the review cache."}),
		GrantedScopes: prometheus.NewCounter(prometheus.CounterOpts{Name: "keyward_token_granted_scopes_total",
			Help: "Scopes granted in minted registry tokens."}),
		DroppedScopes: prometheus.NewCounter(prometheus.CounterOpts{Name: "keyward_token_dropped_scopes_total",
			Help: "Requested scopes dropped from registry tokens (not granted by the policy, or not parsed)."}),
		SigningErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "keyward_token_signing_errors_total",
			Help: "Registry tokens that could not be signed (key backend errors)."}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "keyward_token_refused_total",
			Help: "Service-account tokens refused, by reason (BadSignature: not signed by the cluster's service-account issuer, refused without a TokenReview)."}, []string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	register := func(c prometheus.Collector) (prometheus.Collector, error) {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if errors.As(err, &are) {
				return are.ExistingCollector, nil
			}
			return nil, fmt.Errorf("registering token service metrics: %w", err)
		}
		return c, nil
	}
	var err error
	var c prometheus.Collector
	if c, err = register(m.Requests); err != nil {
		return nil, err
	}
	m.Requests = c.(*prometheus.CounterVec)
	if c, err = register(m.Refused); err != nil {
		return nil, err
	}
	m.Refused = c.(*prometheus.CounterVec)
	for _, h := range []*prometheus.Histogram{&m.IssueDuration, &m.ReviewDuration} {
		if c, err = register(*h); err != nil {
			return nil, err
		}
		*h = c.(prometheus.Histogram)
	}
	for _, k := range []*prometheus.Counter{&m.ReviewHits, &m.GrantedScopes, &m.DroppedScopes, &m.SigningErrors} {
		if c, err = register(*k); err != nil {
			return nil, err
		}
		*k = c.(prometheus.Counter)
	}
	return m, nil
}

func (m *Metrics) request(endpoint string, code int) {
	if m != nil {
		m.Requests.WithLabelValues(endpoint, fmt.Sprint(code)).Inc()
	}
}

func (m *Metrics) issued(seconds float64) {
	if m != nil {
		m.IssueDuration.Observe(seconds)
	}
}

func (m *Metrics) reviewed(seconds float64) {
	if m != nil {
		m.ReviewDuration.Observe(seconds)
	}
}

func (m *Metrics) cacheHit() {
	if m != nil {
		m.ReviewHits.Inc()
	}
}

func (m *Metrics) scopes(granted, dropped int) {
	if m != nil {
		m.GrantedScopes.Add(float64(granted))
		m.DroppedScopes.Add(float64(dropped))
	}
}

func (m *Metrics) signingError() {
	if m != nil {
		m.SigningErrors.Inc()
	}
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.Refused.WithLabelValues(reason).Inc()
	}
}
