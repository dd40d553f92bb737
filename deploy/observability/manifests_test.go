package observability_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/deploy/observability"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/promcrds"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// tool finds a CLI that `make tools` installs: env (an absolute path the
// Makefile exports) or <repo>/bin/<name>. A missing tool fails the test.
func tool(t *testing.T, env, name string) string {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		abs, err := filepath.Abs(filepath.Join(root, "bin", name))
		if err != nil {
			t.Fatal(err)
		}
		path = abs
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("%s not found (%v): run make tools", name, err)
	}
	return path
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// kustomizeBuild builds a kustomization made in a temp dir from the given
// resources and components (directories relative to the repository root).
func kustomizeBuild(t *testing.T, resources, components []string) []byte {
	t.Helper()
	dir := t.TempDir()
	rel := func(p string) string {
		abs, err := filepath.Abs(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		// kustomize refuses absolute paths to other kustomizations.
		r, err := filepath.Rel(dir, abs)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	var b strings.Builder
	b.WriteString("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n")
	for _, list := range []struct {
		key   string
		paths []string
	}{{"resources", resources}, {"components", components}} {
		if len(list.paths) > 0 {
			b.WriteString(list.key + ":\n")
			for _, p := range list.paths {
				b.WriteString("  - " + rel(p) + "\n")
			}
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return run(t, tool(t, "KEYWARD_KUSTOMIZE", "kustomize"), "build", dir)
}

// chartValues are the chart's values (SHIP.md) that the monitoring
// templates read.
const chartValues = `namespaceOverride: ""
nodeAgent: {enabled: true}
metrics:
  serviceMonitor: {enabled: false, interval: 30s, labels: {}}
  prometheusRule: {enabled: false, labels: {}}
  dashboard: {enabled: false, labels: {grafana_dashboard: "1"}}
`

// helmTemplate renders the monitoring templates and files in a chart made
// of them alone (the rest of the chart is another's), with set values.
func helmTemplate(t *testing.T, set ...string) []byte {
	t.Helper()
	dir := t.TempDir()
	chart := filepath.Join(root, "deploy", "helm", "keyward")
	templates, err := filepath.Glob(filepath.Join(chart, "templates", "monitoring-*.yaml"))
	if err != nil || len(templates) == 0 {
		t.Fatalf("no monitoring templates in %s (%v)", chart, err)
	}
	files := map[string]string{
		"Chart.yaml":  "apiVersion: v2\nname: keyward\nversion: 0.0.0\nappVersion: test\n",
		"values.yaml": chartValues,
	}
	for _, p := range templates {
		files[filepath.Join("templates", filepath.Base(p))] = ""
	}
	files[filepath.Join("files", "dashboards", "keyward.json")] = ""
	// The templates label their objects with the chart's keyward.labels.
	files[filepath.Join("templates", "_helpers.tpl")] = ""
	for name, content := range files {
		full := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		data := []byte(content)
		if content == "" {
			if data, err = os.ReadFile(filepath.Join(chart, name)); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(full, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"template", "keyward", dir, "--namespace", "keyward"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	return run(t, tool(t, "KEYWARD_HELM", "helm"), args...)
}

// objects decodes a multi-document manifest.
func objects(t *testing.T, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decoding manifest: %v", err)
		}
		if len(u.Object) > 0 {
			out = append(out, &u)
		}
	}
}

func kinds(objs []*unstructured.Unstructured) map[string]int {
	out := map[string]int{}
	for _, o := range objs {
		out[o.GetKind()]++
	}
	return out
}

// The kustomize monitoring component and the chart's monitoring templates
// render the ServiceMonitor, the node agent's PodMonitor, the
// PrometheusRule and the dashboard ConfigMap, and kube-apiserver accepts
// each (server-side apply, dryRun=All) against prometheus-operator's own
// CRDs.
func TestMonitoringManifestsPassServerSideDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rendered := []struct {
		name     string
		manifest []byte
	}{
		{"the kustomize components on their own", kustomizeBuild(t, nil, []string{"deploy/kustomize/components/monitoring", "deploy/kustomize/components/node-agent-metrics"})},
		{"the chart with every metrics option on", helmTemplate(t, "metrics.serviceMonitor.enabled=true", "nodeAgent.exposeMetrics=true",
			"metrics.prometheusRule.enabled=true", "metrics.dashboard.enabled=true", "metrics.prometheusRule.labels.release=prom")},
	}
	for _, r := range rendered {
		got := kinds(objects(t, r.manifest))
		for _, k := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"} {
			if got[k] != 1 {
				t.Errorf("%s renders %d %s, want 1", r.name, got[k], k)
			}
		}
	}
	// What reaches the cluster is rules.yaml itself: Helm's escaping of the
	// alert templates gives back the source, and nothing is lost on the way.
	var want map[string]any
	if err := yaml.Unmarshal(observability.Rules, &want); err != nil {
		t.Fatal(err)
	}
	for _, r := range rendered {
		for _, o := range objects(t, r.manifest) {
			if o.GetKind() != "PrometheusRule" {
				continue
			}
			got, _, _ := unstructured.NestedMap(o.Object, "spec")
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s: the PrometheusRule's spec differs from rules.yaml", r.name)
			}
		}
	}
	if off := objects(t, helmTemplate(t)); len(off) != 0 {
		t.Errorf("the chart with its default values renders %d monitoring objects, want none", len(off))
	}

	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	if err := promcrds.Install(ctx, cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"keyward", "keyward-node"} {
		_, err = cp.AdminClient().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	for _, r := range rendered {
		t.Run(r.name+" is accepted", func(t *testing.T) {
			if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), r.manifest); err != nil {
				t.Error(err)
			}
		})
	}
	// The CRDs' schemas do judge: a ServiceMonitor endpoint with a field
	// the schema lacks is refused.
	t.Run("a ServiceMonitor the schema forbids is refused", func(t *testing.T) {
		bad := []byte(`apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata: {name: bad, namespace: keyward}
spec:
  selector: {matchLabels: {a: b}}
  endpoints: [{port: metrics, scheme: gopher}]
`)
		err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), bad)
		if !apierrors.IsInvalid(err) {
			t.Errorf("got %v, want Invalid", err)
		}
	})
}
