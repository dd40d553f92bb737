package observability

import (
	"fmt"
	"slices"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// Rule is one rule of a Prometheus rule file.
type Rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []Rule `json:"rules"`
	} `json:"groups"`
}

// ParseRules reads a Prometheus rule file (a PrometheusRule's spec) and
// returns its rules in order; unknown fields are an error.
func ParseRules(data []byte) ([]Rule, error) {
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("reading the rules: %w", err)
	}
	var out []Rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out, nil
}

// ParseExpr parses a PromQL expression with Prometheus's own parser.
func ParseExpr(expr string) (parser.Expr, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parsing %q: %w", expr, err)
	}
	return e, nil
}

// MetricNames are the metric names expr selects, sorted, each once.
func MetricNames(expr string) ([]string, error) {
	e, err := ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		if v, ok := node.(*parser.VectorSelector); ok && !slices.Contains(names, v.Name) {
			names = append(names, v.Name)
		}
		return nil
	})
	slices.Sort(names)
	return names, nil
}
