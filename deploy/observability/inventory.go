// Package observability is the one source of keyward's alerts
// (rules.yaml, the spec of a PrometheusRule) and Grafana dashboard
// (dashboard.json), and lists every metric keyward exports (Inventory).
// `make generate` copies the rules and dashboard into the kustomize
// monitoring component and the Helm chart, and writes docs/metrics.md.
package observability

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/nodehelper/agent"
	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/csr"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/signer/tokenservice"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Metric is one metric family keyward exports.
type Metric struct {
	Name string
	// Type is counter, gauge, histogram or summary.
	Type string
	// Labels are the label names, sorted (constant labels included).
	Labels []string
	Help   string
	// Components are the keyward components that export it (signer,
	// approver, token-service, node-agent).
	Components []string
}

// Series are the names a scrape shows for the family: a histogram's
// _bucket, _sum and _count, a summary's _sum and _count besides its
// quantiles, the name itself otherwise.
func (m Metric) Series() []string {
	switch m.Type {
	case "histogram":
		return []string{m.Name + "_bucket", m.Name + "_sum", m.Name + "_count"}
	case "summary":
		return []string{m.Name, m.Name + "_sum", m.Name + "_count"}
	}
	return []string{m.Name}
}

// component is a keyward process and the metrics it registers on its
// registry (besides the Go and process collectors every one of them adds).
type component struct {
	name     string
	register func(prometheus.Registerer) error
}

// components mirror what each command's Run registers: signer.Run (PCR
// and CSR controllers, the trust publisher it leads), approver.Run,
// tokenservice.Run (with its trust publisher) and the node agent.
func components() []component {
	all := func(fs ...func(prometheus.Registerer) error) func(prometheus.Registerer) error {
		return func(r prometheus.Registerer) error {
			for _, f := range fs {
				if err := f(r); err != nil {
					return err
				}
			}
			return nil
		}
	}
	leader := func(lease string) func(prometheus.Registerer) error {
		return func(r prometheus.Registerer) error { return r.Register(kubeclient.NewLeaderGauge(lease)) }
	}
	return []component{
		{"signer", all(pcr.RegisterMetrics, csr.RegisterMetrics, trustpublisher.RegisterMetrics, leader("keyward-signer"),
			func(r prometheus.Registerer) error {
				return r.Register(kubeclient.NewFenceRefusals("keyward-signer", kubeclient.NewFence()))
			})},
		{"approver", all(func(r prometheus.Registerer) error { _, err := approver.NewMetrics(r); return err }, leader("keyward-approver"))},
		{"token-service", all(func(r prometheus.Registerer) error { _, err := tokenservice.NewMetrics(r); return err },
			trustpublisher.RegisterMetrics, leader("keyward-token-service"))},
		{"node-agent", func(r prometheus.Registerer) error { return agent.RegisterMetrics(r, "kubelet") }},
	}
}

// Inventory lists every metric keyward's components export, sorted by
// name, as their own code registers it (Go runtime and process metrics,
// go_* and process_*, aside).
func Inventory() ([]Metric, error) {
	byName := map[string]*Metric{}
	for _, c := range components() {
		reg := prometheus.NewPedanticRegistry()
		rec := &recorder{Registerer: reg}
		if err := c.register(rec); err != nil {
			return nil, fmt.Errorf("registering the metrics of %s: %w", c.name, err)
		}
		if err := rec.instantiate(); err != nil {
			return nil, fmt.Errorf("listing the metrics of %s: %w", c.name, err)
		}
		families, err := reg.Gather()
		if err != nil {
			return nil, fmt.Errorf("gathering the metrics of %s: %w", c.name, err)
		}
		for _, f := range families {
			m := metricOf(f)
			if prev, ok := byName[m.Name]; ok {
				if prev.Type != m.Type || !slices.Equal(prev.Labels, m.Labels) || prev.Help != m.Help {
					return nil, fmt.Errorf("metric %s differs between %s and %s", m.Name, strings.Join(prev.Components, ","), c.name)
				}
				prev.Components = append(prev.Components, c.name)
				continue
			}
			m.Components = []string{c.name}
			byName[m.Name] = &m
		}
	}
	out := make([]Metric, 0, len(byName))
	for _, m := range byName {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func metricOf(f *dto.MetricFamily) Metric {
	m := Metric{Name: f.GetName(), Help: f.GetHelp(), Type: strings.ToLower(f.GetType().String())}
	if len(f.Metric) > 0 {
		for _, l := range f.Metric[0].GetLabel() {
			m.Labels = append(m.Labels, l.GetName())
		}
		sort.Strings(m.Labels)
	}
	return m
}

// recorder passes registrations on and remembers the collectors, so that
// each labelled vector can be given one child: a vector without children
// shows nothing when gathered.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// maxLabels bounds the search for a vector's label count.
const maxLabels = 10

func (r *recorder) instantiate() error {
	for _, c := range r.collectors {
		var vec *prometheus.MetricVec
		switch v := c.(type) {
		case *prometheus.CounterVec:
			vec = v.MetricVec
		case *prometheus.GaugeVec:
			vec = v.MetricVec
		case *prometheus.HistogramVec:
			vec = v.MetricVec
		case *prometheus.SummaryVec:
			vec = v.MetricVec
		default:
			continue
		}
		// The vector's label count is not exported; the one count it
		// accepts is it.
		found := false
		for n := 0; n <= maxLabels && !found; n++ {
			_, err := vec.GetMetricWithLabelValues(slices.Repeat([]string{"x"}, n)...)
			found = err == nil
		}
		if !found {
			return fmt.Errorf("a metric vector takes more than %d labels", maxLabels)
		}
	}
	return nil
}
