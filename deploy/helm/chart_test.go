package helm

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/keyward/keyward/nodehelper/agent"
	signerconfig "github.com/keyward/keyward/signer/config"
	tokenconfig "github.com/keyward/keyward/signer/tokenservice/config"
)

// kubeVersion is the version `helm template` renders for (the chart needs
// 1.35 or later; the test apiserver is v1.37.1).
const kubeVersion = "1.37.1"

// namespace is where the samples are rendered.
const namespace = "keyward"

// nodeNamespace is the node agent's own namespace: the release
// namespace + "-node" by default (nodeAgent.namespace).
const nodeNamespace = namespace + "-node"

func repoRoot(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the test file")
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

func chartDir(t testing.TB) string { return filepath.Join(repoRoot(t), "deploy", "helm", "keyward") }

// helmBin is $KEYWARD_HELM, else <repo>/bin/helm; missing fails the test.
func helmBin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("KEYWARD_HELM")
	if bin == "" {
		bin = filepath.Join(repoRoot(t), "bin", "helm")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("helm not found at %s (run make tools): %v", bin, err)
	}
	return bin
}

// samples are the chart's ci/*-values.yaml files by short name.
func samples(t testing.TB) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(chartDir(t), "ci", "*-values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, f := range files {
		out[strings.TrimSuffix(filepath.Base(f), "-values.yaml")] = f
	}
	for _, want := range []string{"default", "softhsm", "pkcs11", "gcpkms", "awskms", "csr-off", "token-service-on"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("sample ci/%s-values.yaml is missing", want)
		}
	}
	return out
}

// helmTemplate renders the chart with the values files and returns the
// manifest, or the error with helm's output.
func helmTemplate(t testing.TB, valuesFiles ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", "keyward", chartDir(t), "--namespace", namespace, "--kube-version", kubeVersion}
	for _, f := range valuesFiles {
		args = append(args, "--values", f)
	}
	return runHelm(t, args...)
}

// runHelm runs helm; on failure the error carries its stderr.
func runHelm(t testing.TB, args ...string) ([]byte, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("helm %s: %w: %s", args[0], err, stderr.String())
	}
	return stdout.Bytes(), nil
}

func mustTemplate(t testing.TB, valuesFiles ...string) []byte {
	t.Helper()
	out, err := helmTemplate(t, valuesFiles...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// objects decodes a multi-document manifest.
func objects(t testing.TB, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	var out []*unstructured.Unstructured
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return out
			}
			t.Fatalf("decoding the rendered manifest: %v", err)
		}
		if len(obj.Object) > 0 {
			out = append(out, &obj)
		}
	}
}

func find(objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	return nil
}

func convert[T any](t testing.TB, u *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	if err := kruntime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, &out, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &out
}

// configMapData returns a ConfigMap's key, failing when either is absent.
func configMapData(t testing.TB, objs []*unstructured.Unstructured, name, key string) []byte {
	t.Helper()
	u := find(objs, "ConfigMap", name)
	if u == nil {
		t.Fatalf("no ConfigMap %s", name)
	}
	cm := convert[corev1.ConfigMap](t, u)
	data, ok := cm.Data[key]
	if !ok {
		t.Fatalf("ConfigMap %s has no key %s", name, key)
	}
	return []byte(data)
}

// Every sample's configurations load with keyward's own loaders (strict
// decoding, defaults, validation), exactly as the pods will read them.
func TestSampleConfigurationsLoadWithTheRealLoaders(t *testing.T) {
	t.Setenv("NODE_NAME", "worker-1") // the DaemonSet passes it
	for name, file := range samples(t) {
		t.Run(name, func(t *testing.T) {
			objs := objects(t, mustTemplate(t, file))
			cfg, err := signerconfig.Parse(configMapData(t, objs, "keyward-signer-config", "config.yaml"))
			if err != nil {
				t.Fatalf("signer configuration: %v", err)
			}
			if le := cfg.LeaderElection; le.Namespace != namespace || le.LeaseName != "keyward-signer" {
				t.Errorf("signer Lease %s/%s, want %s/keyward-signer", le.Namespace, le.LeaseName, namespace)
			}
			if cfg.MetricsAddress != ":9090" || cfg.HealthAddress != ":9091" {
				t.Errorf("signer addresses %s %s, want :9090 :9091 (the container ports)", cfg.MetricsAddress, cfg.HealthAddress)
			}
			if find(objs, "Deployment", "keyward-token-service") != nil {
				ts, err := tokenconfig.Parse(configMapData(t, objs, "keyward-token-service-config", "config.yaml"))
				if err != nil {
					t.Fatalf("token service configuration: %v", err)
				}
				if ts.MetricsAddress != ":9092" || ts.HealthAddress != ":9093" || ts.Listen.Address != ":8443" {
					t.Errorf("token service addresses %s %s %s, want :9092 :9093 :8443", ts.MetricsAddress, ts.HealthAddress, ts.Listen.Address)
				}
			} else if find(objs, "ConfigMap", "keyward-token-service-config") != nil {
				t.Error("a token service ConfigMap without its Deployment")
			}
			if find(objs, "DaemonSet", "keyward-node-agent") != nil {
				if _, err := agent.Parse(configMapData(t, objs, "keyward-node-agent-config", "agent.yaml")); err != nil {
					t.Fatalf("node agent configuration: %v", err)
				}
			}
		})
	}
}

// podTemplates returns every Deployment's and DaemonSet's pod template.
func podTemplates(t testing.TB, objs []*unstructured.Unstructured) map[string]*corev1.PodTemplateSpec {
	t.Helper()
	out := map[string]*corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment":
			out[o.GetName()] = &convert[appsv1.Deployment](t, o).Spec.Template
		case "DaemonSet":
			out[o.GetName()] = &convert[appsv1.DaemonSet](t, o).Spec.Template
		}
	}
	return out
}

// The workloads run as the base runs them: non-root 65532 with a read-only
// root filesystem, no privilege escalation, every capability dropped and
// the runtime's seccomp profile; the node agent is the one root container
// (host files), with CHOWN and FOWNER only and no ServiceAccount token.
// No sample renders a Secret (users create them; keyward never reads them).
func TestSamplesRunWithTheBaseSecurityContexts(t *testing.T) {
	for name, file := range samples(t) {
		t.Run(name, func(t *testing.T) {
			objs := objects(t, mustTemplate(t, file))
			for _, o := range objs {
				if o.GetKind() == "Secret" {
					t.Errorf("the chart renders Secret %s", o.GetName())
				}
			}
			pods := podTemplates(t, objs)
			if pods["keyward-signer"] == nil {
				t.Fatal("no signer Deployment")
			}
			for workload, pod := range pods {
				checkPod(t, workload, pod)
			}
		})
	}
}

func checkPod(t *testing.T, workload string, pod *corev1.PodTemplateSpec) {
	t.Helper()
	spec := pod.Spec
	if p := spec.SecurityContext; p == nil || p.SeccompProfile == nil || p.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: pod seccomp profile is not RuntimeDefault", workload)
	}
	nodeAgent := workload == "keyward-node-agent"
	if nodeAgent {
		if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
			t.Errorf("%s: mounts a ServiceAccount token; it acts as the node", workload)
		}
		if !spec.HostNetwork {
			t.Errorf("%s: not in the host's network namespace", workload)
		}
	} else {
		p := spec.SecurityContext
		if p == nil || p.RunAsNonRoot == nil || !*p.RunAsNonRoot || p.RunAsUser == nil || *p.RunAsUser != 65532 ||
			p.RunAsGroup == nil || *p.RunAsGroup != 65532 || p.FSGroup == nil || *p.FSGroup != 65532 {
			t.Errorf("%s: pod does not run as 65532:65532 non-root with fsGroup 65532: %+v", workload, p)
		}
	}
	for _, c := range slicesConcat(spec.InitContainers, spec.Containers) {
		sc := c.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
			sc.Capabilities == nil || !equalCaps(sc.Capabilities.Drop, "ALL") {
			t.Errorf("%s/%s: not read-only root, no escalation, drop ALL: %+v", workload, c.Name, sc)
			continue
		}
		wantAdd := []corev1.Capability(nil)
		if nodeAgent {
			wantAdd = []corev1.Capability{"CHOWN", "FOWNER"}
		}
		if !equalCaps(sc.Capabilities.Add, capNames(wantAdd)...) {
			t.Errorf("%s/%s: adds capabilities %v, want %v", workload, c.Name, sc.Capabilities.Add, wantAdd)
		}
		if c.Resources.Requests == nil {
			t.Errorf("%s/%s: no resource requests", workload, c.Name)
		}
	}
	for _, c := range spec.Containers {
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("%s/%s: missing a readiness or liveness probe", workload, c.Name)
		}
	}
}

func slicesConcat(a, b []corev1.Container) []corev1.Container {
	return append(append([]corev1.Container(nil), a...), b...)
}

func capNames(cs []corev1.Capability) []string {
	var out []string
	for _, c := range cs {
		out = append(out, string(c))
	}
	return out
}

func equalCaps(got []corev1.Capability, want ...string) bool {
	g := capNames(got)
	if len(g) != len(want) {
		return false
	}
	for i := range g {
		if g[i] != want[i] {
			return false
		}
	}
	return true
}

// The chart installs the very CRDs controller-gen writes to deploy/crds
// (`make generate` copies them; this catches a copy left stale).
func TestChartCRDsAreDeployCRDs(t *testing.T) {
	want, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy", "crds", "*_*.yaml"))
	if err != nil || len(want) == 0 {
		t.Fatalf("no CRDs in deploy/crds (%v)", err)
	}
	got, err := filepath.Glob(filepath.Join(chartDir(t), "files", "crds", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("the chart has %d CRD files, deploy/crds %d: run make generate", len(got), len(want))
	}
	for _, w := range want {
		a, err := os.ReadFile(w)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(chartDir(t), "files", "crds", filepath.Base(w)))
		if err != nil || !bytes.Equal(a, b) {
			t.Errorf("the chart's copy of %s differs or is missing (run make generate): %v", filepath.Base(w), err)
		}
	}
}

// With monitoring on, the ServiceMonitor selects every metrics Service by
// its labels and port name, and the PodMonitor the node agent's pods.
func TestMonitoringSelectsTheChartsMetricsEndpoints(t *testing.T) {
	objs := objects(t, mustTemplate(t, samples(t)["monitoring"]))
	sm := find(objs, "ServiceMonitor", "keyward")
	pm := find(objs, "PodMonitor", "keyward-node-agent")
	if sm == nil || pm == nil {
		t.Fatal("the monitoring sample renders no ServiceMonitor keyward or PodMonitor keyward-node-agent")
	}
	smSel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	selected := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() != "Service" || !labelsMatch(smSel, o.GetLabels()) {
			continue
		}
		svc := convert[corev1.Service](t, o)
		if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "metrics" }) {
			t.Errorf("Service %s is selected but has no port named metrics", svc.Name)
		}
		selected[svc.Name] = true
	}
	for _, want := range []string{"keyward-signer-metrics", "keyward-approver-metrics"} {
		if !selected[want] {
			t.Errorf("the ServiceMonitor does not select Service %s", want)
		}
	}
	pmSel, _, _ := unstructured.NestedStringMap(pm.Object, "spec", "selector", "matchLabels")
	pod := podTemplates(t, objs)["keyward-node-agent"]
	if pod == nil || !labelsMatch(pmSel, pod.Labels) {
		t.Fatalf("the PodMonitor's selector %v does not select the node agent's pods", pmSel)
	}
	if !slices.ContainsFunc(pod.Spec.Containers[0].Ports, func(p corev1.ContainerPort) bool { return p.Name == "metrics" && p.ContainerPort == 9465 }) {
		t.Error("the node agent has no container port metrics 9465")
	}
	t.Setenv("NODE_NAME", "worker-1") // the DaemonSet passes it
	cfg, err := agent.Parse(configMapData(t, objs, "keyward-node-agent-config", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsAddress != ":9465" {
		t.Errorf("with exposeMetrics the node agent's metricsAddress is %q, want :9465 (the PodMonitor's port)", cfg.MetricsAddress)
	}
}

// By default the node agent, which shares the host network, serves its
// metrics on the node's loopback only: no port named, no PodMonitor, even
// with the ServiceMonitor on.
func TestNodeAgentMetricsStayOnLoopbackByDefault(t *testing.T) {
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte("metrics:\n  serviceMonitor:\n    enabled: true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, mustTemplate(t, values))
	if find(objs, "PodMonitor", "keyward-node-agent") != nil {
		t.Error("a PodMonitor scrapes the node agent, whose metrics listen on loopback")
	}
	pod := podTemplates(t, objs)["keyward-node-agent"]
	if pod == nil {
		t.Fatal("no node agent DaemonSet")
	}
	if len(pod.Spec.Containers[0].Ports) != 0 {
		t.Errorf("the node agent names ports %v, but listens on loopback only", pod.Spec.Containers[0].Ports)
	}
	t.Setenv("NODE_NAME", "worker-1")
	cfg, err := agent.Parse(configMapData(t, objs, "keyward-node-agent-config", "agent.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsAddress != "127.0.0.1:9465" || cfg.HealthAddress != "127.0.0.1:9466" {
		t.Errorf("metricsAddress %q healthAddress %q, want both on 127.0.0.1", cfg.MetricsAddress, cfg.HealthAddress)
	}
}

func labelsMatch(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// namespaceOverride moves every namespaced object, every RBAC subject and
// the Leases the configurations name, and the node agent's objects to
// namespaceOverride + "-node"; cluster-scoped objects stay so.
func TestNamespaceOverrideMovesEverything(t *testing.T) {
	const ns = "certs"
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte("namespaceOverride: "+ns+"\ntokenService: {enabled: true, config: {issuer: i.example.com, registries: [{service: r.example.com}], rules: [{namespaces: [\"*\"], repositories: [\"${namespace}/**\"]}]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := objects(t, mustTemplate(t, f))
	clusterScoped := map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true, "CustomResourceDefinition": true, "Namespace": true}
	for _, o := range objs {
		want := ns
		if o.GetLabels()["app.kubernetes.io/component"] == "node-agent" || o.GetName() == "keyward-node-agent" {
			want = ns + "-node"
		}
		if o.GetKind() == "Namespace" && o.GetName() != ns+"-node" {
			t.Errorf("the chart renders Namespace %s, want only %s-node", o.GetName(), ns)
		}
		if clusterScoped[o.GetKind()] != (o.GetNamespace() == "") || (o.GetNamespace() != "" && o.GetNamespace() != want) {
			t.Errorf("%s %s is in namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), want)
		}
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			if got := s.(map[string]any)["namespace"]; got != ns {
				t.Errorf("%s %s binds a subject in namespace %v", o.GetKind(), o.GetName(), got)
			}
		}
	}
	cfg, err := signerconfig.Parse(configMapData(t, objs, "keyward-signer-config", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	ts, err := tokenconfig.Parse(configMapData(t, objs, "keyward-token-service-config", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LeaderElection.Namespace != ns || ts.LeaderElection.Namespace != ns {
		t.Errorf("Leases in %s and %s, want %s", cfg.LeaderElection.Namespace, ts.LeaderElection.Namespace, ns)
	}
}
