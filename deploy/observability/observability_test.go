package observability_test

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/keyward/keyward/deploy/observability"
	"github.com/prometheus/prometheus/promql/parser"
)

var update = flag.Bool("update", false, "write the generated files (make generate)")

// root is the repository root, seen from this package.
const root = "../.."

// The copies in the kustomize component and the Helm chart, and
// docs/metrics.md, are what the sources and the code make of them.
func TestGeneratedFilesAreCurrent(t *testing.T) {
	files, err := observability.Generated()
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		full := filepath.Join(root, path)
		if *update {
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, want, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		got, err := os.ReadFile(full)
		if err != nil {
			t.Errorf("%s: %v; run make generate", path, err)
			continue
		}
		if string(got) != string(want) {
			t.Errorf("%s is stale; run make generate", path)
		}
	}
}

func loadRules(t *testing.T) []observability.Rule {
	t.Helper()
	rules, err := observability.ParseRules(observability.Rules)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) == 0 {
		t.Fatal("rules.yaml has no rules")
	}
	return rules
}

type dashboard struct {
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

// grafanaVariables are replaced by what Grafana would put in their place
// before an expression is parsed.
var grafanaVariables = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// expression is one PromQL expression and where it is used.
type expression struct{ where, expr string }

func expressions(t *testing.T) []expression {
	t.Helper()
	var out []expression
	for _, r := range loadRules(t) {
		out = append(out, expression{"alert " + r.Alert, r.Expr})
	}
	var d dashboard
	if err := json.Unmarshal(observability.Dashboard, &d); err != nil {
		t.Fatalf("reading dashboard.json: %v", err)
	}
	for _, p := range d.Panels {
		for i, tg := range p.Targets {
			out = append(out, expression{fmt.Sprintf("panel %q target %d", p.Title, i), grafanaVariables.Replace(tg.Expr)})
		}
	}
	return out
}

// inventorySeries maps every series name keyward exports to its family.
func inventorySeries(t *testing.T) map[string]observability.Metric {
	t.Helper()
	ms, err := observability.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]observability.Metric{}
	for _, m := range ms {
		for _, s := range m.Series() {
			out[s] = m
		}
	}
	return out
}

// scrapeSeries are series Prometheus makes itself for every target.
var scrapeSeries = map[string]bool{"up": true}

// Every expression in the alerts and the dashboard parses with Prometheus's
// own parser and names only metrics keyward exports, each used as its type
// allows: rate() and increase() over counters (or a histogram's
// _bucket/_sum/_count), histogram_quantile() over a histogram's _bucket.
func TestExpressionsParseAndUseKnownMetrics(t *testing.T) {
	series := inventorySeries(t)
	for _, e := range expressions(t) {
		t.Run(e.where, func(t *testing.T) {
			expr, err := observability.ParseExpr(e.expr)
			if err != nil {
				t.Fatalf("%s: %v", e.expr, err)
			}
			var problems []string
			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				switch n := node.(type) {
				case *parser.VectorSelector:
					if !scrapeSeries[n.Name] {
						if _, ok := series[n.Name]; !ok {
							problems = append(problems, n.Name+" is not a metric keyward exports")
						}
					}
				case *parser.Call:
					problems = append(problems, checkCall(n, series)...)
				}
				return nil
			})
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
}

func checkCall(c *parser.Call, series map[string]observability.Metric) []string {
	var problems []string
	names := func() []string {
		var out []string
		for _, a := range c.Args {
			parser.Inspect(a, func(node parser.Node, _ []parser.Node) error {
				if v, ok := node.(*parser.VectorSelector); ok {
					out = append(out, v.Name)
				}
				return nil
			})
		}
		return out
	}
	switch c.Func.Name {
	case "rate", "irate", "increase":
		for _, n := range names() {
			m, ok := series[n]
			if ok && m.Type != "counter" && m.Type != "histogram" && m.Type != "summary" {
				problems = append(problems, fmt.Sprintf("%s(%s): %s is a %s, not a counter", c.Func.Name, n, m.Name, m.Type))
			}
			if ok && (m.Type == "histogram" || m.Type == "summary") && n == m.Name {
				problems = append(problems, fmt.Sprintf("%s(%s): take it of the %s's _count, _sum or _bucket", c.Func.Name, n, m.Type))
			}
		}
	case "histogram_quantile":
		for _, n := range names() {
			if m, ok := series[n]; ok && (m.Type != "histogram" || n != m.Name+"_bucket") {
				problems = append(problems, fmt.Sprintf("histogram_quantile over %s: want a histogram's _bucket series", n))
			}
		}
	case "deriv", "delta", "predict_linear":
		for _, n := range names() {
			if m, ok := series[n]; ok && m.Type != "gauge" {
				problems = append(problems, fmt.Sprintf("%s(%s): %s is a %s, not a gauge", c.Func.Name, n, m.Name, m.Type))
			}
		}
	}
	return problems
}

// The checks above refuse what they should: a misused metric is caught.
func TestExpressionChecksCatchMisuse(t *testing.T) {
	series := inventorySeries(t)
	for _, tc := range []struct {
		name, expr string
	}{
		{"a metric that does not exist is refused", `rate(keyward_no_such_metric_total[5m])`},
		{"rate of a gauge is refused", `rate(keyward_pcr_queue_depth[5m])`},
		{"histogram_quantile over a counter is refused", `histogram_quantile(0.9, rate(keyward_pcr_outcomes_total[5m]))`},
		{"_bucket of a counter is refused", `keyward_pcr_outcomes_total_bucket`},
		{"histogram_quantile over a histogram's _count is refused", `histogram_quantile(0.9, rate(keyward_pcr_latency_seconds_count[5m]))`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expr, err := observability.ParseExpr(tc.expr)
			if err != nil {
				t.Fatal(err)
			}
			var problems []string
			parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
				switch n := node.(type) {
				case *parser.VectorSelector:
					if _, ok := series[n.Name]; !ok {
						problems = append(problems, n.Name)
					}
				case *parser.Call:
					problems = append(problems, checkCall(n, series)...)
				}
				return nil
			})
			if len(problems) == 0 {
				t.Errorf("%s passed the checks", tc.expr)
			}
		})
	}
}

// The troubleshooting guide has one heading per alert, named as the
// alert: GitHub's anchor for it is the name in lower case.
const runbookBase = "https://github.com/keyward/keyward/blob/main/docs/troubleshooting.md#"

// Every alert says what is wrong (summary), what to do (description) and
// where to read more (runbook_url), carries a severity and waits (for).
func TestAlertsCarrySummaryDescriptionRunbookAndSeverity(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range loadRules(t) {
		t.Run(r.Alert, func(t *testing.T) {
			if r.Alert == "" {
				t.Fatalf("recording rule %q: keep rules.yaml to alerts", r.Record)
			}
			if seen[r.Alert] {
				t.Errorf("alert %s defined twice", r.Alert)
			}
			seen[r.Alert] = true
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("no %s annotation", a)
				}
			}
			if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("runbook_url %q, want %q", r.Annotations["runbook_url"], want)
			}
			if s := r.Labels["severity"]; !slices.Contains([]string{"critical", "warning", "info"}, s) {
				t.Errorf("severity %q, want critical, warning or info", s)
			}
			if r.For == "" {
				t.Error("no for: a single bad evaluation would page")
			}
		})
	}
}

// Every metric name in the code is in the inventory: a package whose
// metrics the inventory forgot to register fails here.
func TestInventoryCoversEveryMetricNameInTheCode(t *testing.T) {
	ms, err := observability.Inventory()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, m := range ms {
		known[m.Name] = true
		if m.Help == "" {
			t.Errorf("%s has no help text", m.Name)
		}
	}
	// Namespace + Name (the node agent's style) or a full name.
	namespaced := regexp.MustCompile(`Namespace:\s*"(keyward_[a-z0-9_]+)",\s*Name:\s*"([a-z0-9_]+)"`)
	full := regexp.MustCompile(`Name:\s*"(keyward_[a-z0-9_]+)"`)
	for _, dir := range []string{"signer", "trustpublisher", "nodehelper", "kubeclient", "backends", "cmd"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			var names []string
			for _, m := range namespaced.FindAllStringSubmatch(string(data), -1) {
				names = append(names, m[1]+"_"+m[2])
			}
			for _, m := range full.FindAllStringSubmatch(string(data), -1) {
				names = append(names, m[1])
			}
			for _, n := range names {
				if !known[n] {
					t.Errorf("%s registers %s, which Inventory does not list: add its package to components()", path, n)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
