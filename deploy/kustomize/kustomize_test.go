// Package kustomize_test builds deploy/kustomize's base and every overlay
// with the pinned kustomize CLI and checks what users would apply: the
// objects' shape, the configuration files through keyward's own loaders, and
// a server-side dry-run on a real kube-apiserver.
package kustomize_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/agent"
	signerconfig "github.com/keyward/keyward/signer/config"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/promcrds"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

const root = "../.."

const image = "ghcr.io/keyward/keyward"

// build is what a user applies.
type build struct {
	// dir is a kustomization under deploy/kustomize, or several joined by
	// "+": the first as resource, the others as components, in a
	// kustomization made in a temp dir (as a user's own overlay).
	dir string
	// signerReplicas is the signer Deployment's replica count.
	signerReplicas int32
	// signerImage is the signer container's image.
	signerImage string
	// tokenService: the overlay runs the token service.
	tokenService bool
	// otherImages are images allowed besides keyward's (a vendor's library).
	otherImages []string
	// monitoring: the build holds prometheus-operator objects.
	monitoring bool
}

// The token service is opt-in (components/token-service), as in the Helm
// chart: no overlay runs it, and the builds with the component are the
// ones a user would write.
var builds = []build{
	{dir: "base", signerReplicas: 2, signerImage: image + ":0.1.0"},
	{dir: "overlays/softhsm", signerReplicas: 1, signerImage: image + ":0.1.0-softhsm"},
	{dir: "overlays/pkcs11", signerReplicas: 2, signerImage: image + ":0.1.0",
		otherImages: []string{"registry.example.com/hsm-client:VERSION"}},
	{dir: "overlays/gcpkms", signerReplicas: 2, signerImage: image + ":0.1.0"},
	{dir: "overlays/awskms", signerReplicas: 2, signerImage: image + ":0.1.0"},
	{dir: "overlays/pkcs11+components/token-service+components/token-service-pkcs11", signerReplicas: 2, signerImage: image + ":0.1.0",
		tokenService: true, otherImages: []string{"registry.example.com/hsm-client:VERSION"}},
	{dir: "overlays/gcpkms+components/token-service", signerReplicas: 2, signerImage: image + ":0.1.0", tokenService: true},
	{dir: "overlays/awskms+components/monitoring+components/node-agent-metrics", signerReplicas: 2, signerImage: image + ":0.1.0", monitoring: true},
}

// kustomizeCLI is the pinned kustomize (make tools): $KEYWARD_KUSTOMIZE,
// else <repo>/bin/kustomize. Missing is a failure, never a skip.
func kustomizeCLI(t *testing.T) string {
	t.Helper()
	path := os.Getenv("KEYWARD_KUSTOMIZE")
	if path == "" {
		abs, err := filepath.Abs(filepath.Join(root, "bin", "kustomize"))
		if err != nil {
			t.Fatal(err)
		}
		path = abs
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("kustomize not found (%v): run make tools", err)
	}
	return path
}

func kustomizeBuild(t *testing.T, dir string) []byte {
	t.Helper()
	path := filepath.Join(root, "deploy", "kustomize", dir)
	if parts := strings.Split(dir, "+"); len(parts) > 1 {
		path = t.TempDir()
		rel := func(p string) string {
			abs, err := filepath.Abs(filepath.Join(root, "deploy", "kustomize", p))
			if err != nil {
				t.Fatal(err)
			}
			// kustomize refuses absolute paths to other kustomizations.
			r, err := filepath.Rel(path, abs)
			if err != nil {
				t.Fatal(err)
			}
			return r
		}
		k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- " + rel(parts[0]) + "\ncomponents:\n"
		for _, c := range parts[1:] {
			k += "- " + rel(c) + "\n"
		}
		if err := os.WriteFile(filepath.Join(path, "kustomization.yaml"), []byte(k), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(kustomizeCLI(t), "build", path)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kustomize build deploy/kustomize/%s: %v\n%s", dir, err, stderr.String())
	}
	return out
}

func decode(t *testing.T, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs
			}
			t.Fatalf("decoding the build: %v", err)
		}
		if len(obj.Object) > 0 {
			objs = append(objs, &obj)
		}
	}
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	var out T
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &out); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
	return &out
}

// rendered is one build, decoded.
type rendered struct {
	objs        []*unstructured.Unstructured
	deployments map[string]*appsv1.Deployment
	daemonSets  map[string]*appsv1.DaemonSet
	configMaps  map[string]*corev1.ConfigMap // by name without the hash suffix
}

func render(t *testing.T, dir string) rendered {
	t.Helper()
	r := rendered{
		objs:        decode(t, kustomizeBuild(t, dir)),
		deployments: map[string]*appsv1.Deployment{},
		daemonSets:  map[string]*appsv1.DaemonSet{},
		configMaps:  map[string]*corev1.ConfigMap{},
	}
	for _, u := range r.objs {
		switch u.GetKind() {
		case "Deployment":
			r.deployments[u.GetName()] = convert[appsv1.Deployment](t, u)
		case "DaemonSet":
			r.daemonSets[u.GetName()] = convert[appsv1.DaemonSet](t, u)
		case "ConfigMap":
			cm := convert[corev1.ConfigMap](t, u)
			name := cm.Name
			if i := strings.LastIndex(name, "-"); i > 0 && strings.HasPrefix(name, "keyward-") && strings.HasSuffix(name, "-config-"+name[i+1:]) {
				name = name[:i]
			}
			r.configMaps[name] = cm
		}
	}
	return r
}

// Every build holds every component, labelled, with the replicas and images
// its backend allows, and no Secret: the user creates those.
func TestBuildsHoldTheComponents(t *testing.T) {
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			r := render(t, b.dir)
			for _, u := range r.objs {
				if u.GetKind() == "Secret" {
					t.Errorf("the build renders Secret %s: Secrets are the user's (SHIP.md), never shipped", u.GetName())
				}
				if u.GetLabels()["app.kubernetes.io/part-of"] != "keyward" {
					t.Errorf("%s %s lacks app.kubernetes.io/part-of: keyward", u.GetKind(), u.GetName())
				}
				// The node agent alone lives in keyward-node (Pod Security
				// privileged); everything else in keyward (restricted).
				want := "keyward"
				if u.GetLabels()["app.kubernetes.io/component"] == "node-agent" || strings.HasPrefix(u.GetName(), "keyward-node-agent") {
					want = "keyward-node"
				}
				if ns := u.GetNamespace(); ns != "" && ns != want {
					t.Errorf("%s %s is in namespace %q, want %s", u.GetKind(), u.GetName(), ns, want)
				}
			}
			want := []string{"keyward-signer", "keyward-approver"}
			if b.tokenService {
				want = append(want, "keyward-token-service")
			}
			for _, name := range want {
				if r.deployments[name] == nil {
					t.Errorf("no Deployment %s", name)
				}
			}
			if !b.tokenService && r.deployments["keyward-token-service"] != nil {
				t.Error("the token service runs, but this backend cannot share its key with it")
			}
			if r.daemonSets["keyward-node-agent"] == nil {
				t.Error("no DaemonSet keyward-node-agent")
			}
			signer := r.deployments["keyward-signer"]
			if signer == nil {
				t.FailNow()
			}
			if got := signer.Spec.Replicas; got == nil || *got != b.signerReplicas {
				t.Errorf("signer replicas %v, want %d", got, b.signerReplicas)
			}
			if got := signer.Spec.Template.Spec.Containers[0].Image; got != b.signerImage {
				t.Errorf("signer image %s, want %s", got, b.signerImage)
			}
			if a := r.deployments["keyward-approver"]; a != nil && (a.Spec.Replicas == nil || *a.Spec.Replicas != 2) {
				t.Errorf("approver replicas %v, want 2", a.Spec.Replicas)
			}
			for _, p := range pods(r) {
				for _, c := range append(slices.Clone(p.spec.InitContainers), p.spec.Containers...) {
					if !strings.HasPrefix(c.Image, image+":") && !slices.Contains(b.otherImages, c.Image) {
						t.Errorf("%s, container %s: image %s is not keyward's", p.name, c.Name, c.Image)
					}
				}
			}
		})
	}
}

type pod struct {
	name      string
	component string
	spec      corev1.PodSpec
}

func pods(r rendered) []pod {
	var out []pod
	for name, d := range r.deployments {
		out = append(out, pod{name, d.Spec.Template.Labels["app.kubernetes.io/component"], d.Spec.Template.Spec})
	}
	for name, d := range r.daemonSets {
		out = append(out, pod{name, d.Spec.Template.Labels["app.kubernetes.io/component"], d.Spec.Template.Spec})
	}
	slices.SortFunc(out, func(a, b pod) int { return strings.Compare(a.name, b.name) })
	return out
}

// Every container runs with no privilege it does not need: non-root 65532
// (the node agent is root on the host, with CHOWN and FOWNER only), a
// read-only root file system, no capabilities, RuntimeDefault seccomp,
// resource requests, and probes on the long-running containers.
func TestContainersAreLockedDown(t *testing.T) {
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			r := render(t, b.dir)
			for _, p := range pods(r) {
				if len(p.component) == 0 {
					t.Errorf("%s: pod template lacks app.kubernetes.io/component", p.name)
				}
				psc := p.spec.SecurityContext
				podSeccomp := psc != nil && psc.SeccompProfile != nil && psc.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault
				for _, c := range p.spec.InitContainers {
					checkContainer(t, p, c, podSeccomp, false)
				}
				for _, c := range p.spec.Containers {
					checkContainer(t, p, c, podSeccomp, true)
				}
			}
		})
	}
}

func checkContainer(t *testing.T, p pod, c corev1.Container, podSeccomp, main bool) {
	t.Helper()
	where := p.name + ", container " + c.Name
	psc := p.spec.SecurityContext
	sc := c.SecurityContext
	if sc == nil {
		t.Errorf("%s: no securityContext", where)
		return
	}
	user := sc.RunAsUser
	if user == nil && psc != nil {
		user = psc.RunAsUser
	}
	if p.component == "node-agent" {
		// Root on the host: it reads kubelet's key and writes root-owned
		// host directories; its only capabilities chown what it writes.
		if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Add, []corev1.Capability{"CHOWN", "FOWNER"}) {
			t.Errorf("%s: capabilities add %v, want [CHOWN FOWNER]", where, sc.Capabilities)
		}
		if p.spec.AutomountServiceAccountToken == nil || *p.spec.AutomountServiceAccountToken {
			t.Errorf("%s: the service account token is mounted; the agent is its node", where)
		}
	} else {
		if user == nil || *user != 65532 {
			t.Errorf("%s: runs as %v, want 65532", where, user)
		}
		if sc.Capabilities != nil && len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: adds capabilities %v", where, sc.Capabilities.Add)
		}
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: root file system is writable", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: allows privilege escalation", where)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s: does not drop ALL capabilities", where)
	}
	if !podSeccomp && (sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault) {
		t.Errorf("%s: seccomp profile is not RuntimeDefault", where)
	}
	if c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: no memory request or limit", where)
	}
	if main && (c.ReadinessProbe == nil || c.LivenessProbe == nil) {
		t.Errorf("%s: no readiness or liveness probe", where)
	}
}

// Each component's ConfigMap is one of the shipped configuration files:
// keyward's own loaders decode (strictly) and validate it, the pod mounts
// it where its --config flag points, and the container ports named metrics
// and health are the ones the configuration listens on.
func TestConfigMapsLoadAndMatchThePods(t *testing.T) {
	t.Setenv("NODE_NAME", "node-1") // the agent's ${NODE_NAME}
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			r := render(t, b.dir)
			type listens struct{ metrics, health string }
			checks := []struct {
				workload, configMap, key string
				spec                     *corev1.PodSpec
				load                     func([]byte) (listens, error)
			}{
				{"keyward-signer", "keyward-signer-config", "config.yaml", nil, func(d []byte) (listens, error) {
					c, err := signerconfig.Parse(d)
					if err != nil {
						return listens{}, err
					}
					return listens{c.MetricsAddress, c.HealthAddress}, nil
				}},
				{"keyward-approver", "keyward-signer-config", "config.yaml", nil, func(d []byte) (listens, error) {
					c, err := signerconfig.Parse(d)
					if err != nil {
						return listens{}, err
					}
					return listens{c.MetricsAddress, c.HealthAddress}, nil
				}},
				{"keyward-token-service", "keyward-token-service-config", "config.yaml", nil, func(d []byte) (listens, error) {
					c, err := tsconfig.Parse(d)
					if err != nil {
						return listens{}, err
					}
					return listens{c.MetricsAddress, c.HealthAddress}, nil
				}},
				{"keyward-node-agent", "keyward-node-agent-config", "agent.yaml", nil, func(d []byte) (listens, error) {
					c, err := agent.Parse(d)
					if err != nil {
						return listens{}, err
					}
					return listens{c.MetricsAddress, c.HealthAddress}, nil
				}},
			}
			for _, c := range checks {
				var spec *corev1.PodSpec
				if d := r.deployments[c.workload]; d != nil {
					spec = &d.Spec.Template.Spec
				} else if d := r.daemonSets[c.workload]; d != nil {
					spec = &d.Spec.Template.Spec
				} else {
					continue // checked by TestBuildsHoldTheComponents
				}
				cm := r.configMaps[c.configMap]
				if cm == nil {
					t.Errorf("%s: no ConfigMap %s", c.workload, c.configMap)
					continue
				}
				l, err := c.load([]byte(cm.Data[c.key]))
				if err != nil {
					t.Errorf("ConfigMap %s, %s: %v", cm.Name, c.key, err)
					continue
				}
				main := spec.Containers[0]
				mounted := false
				for _, v := range spec.Volumes {
					if v.ConfigMap == nil || v.ConfigMap.Name != cm.Name {
						continue
					}
					for _, m := range main.VolumeMounts {
						if m.Name == v.Name && slices.Contains(main.Args, "--config="+filepath.Join(m.MountPath, c.key)) ||
							m.Name == v.Name && slices.Contains(main.Args, filepath.Join(m.MountPath, c.key)) {
							mounted = true
						}
					}
				}
				if !mounted {
					t.Errorf("%s: does not read ConfigMap %s's %s through --config (args %v)", c.workload, cm.Name, c.key, main.Args)
				}
				for name, addr := range map[string]string{"metrics": l.metrics, "health": l.health} {
					_, port, err := net.SplitHostPort(addr)
					if err != nil {
						t.Errorf("%s: %s address %q: %v", c.workload, name, addr, err)
						continue
					}
					// A metrics address the args override (the
					// node-agent-metrics component's --metrics-address).
					for _, a := range main.Args {
						if v, ok := strings.CutPrefix(a, "--metrics-address="); ok && name == "metrics" {
							addr = v
							_, port, _ = net.SplitHostPort(v)
						}
					}
					host, _, _ := net.SplitHostPort(addr)
					loopback := host == "127.0.0.1" || host == "::1" || host == "localhost"
					switch got := containerPort(main, name); {
					case got != "" && got != port:
						t.Errorf("%s: container port %s is %s, the configuration listens on %s", c.workload, name, got, port)
					case got != "" && loopback:
						t.Errorf("%s: container port %s named, but the configuration listens on loopback (%s)", c.workload, name, addr)
					case got == "" && name == "metrics" && !loopback:
						t.Errorf("%s: no container port named metrics (the monitoring component scrapes it)", c.workload)
					}
				}
			}
		})
	}
}

func containerPort(c corev1.Container, name string) string {
	for _, p := range c.Ports {
		if p.Name == name {
			return strconv.Itoa(int(p.ContainerPort))
		}
	}
	return ""
}

// The apiserver accepts every object of every build: the CRDs and the
// namespace are applied for real, then everything is server-side applied
// with dryRun=All (decoded, defaulted, validated and admitted, not stored).
func TestBuildsPassServerSideDryRun(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	defer cp.Stop()
	if _, err := controlplane.InstallAuthorityCRD(ctx, cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	// The monitoring build's ServiceMonitor, PodMonitor and PrometheusRule,
	// judged by prometheus-operator's real CRDs.
	if err := promcrds.Install(ctx, cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			objs := decode(t, kustomizeBuild(t, b.dir))
			var first bytes.Buffer
			for _, u := range objs {
				if u.GetKind() == "Namespace" {
					if err := writeObject(&first, u); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), first.Bytes()); err != nil {
				t.Fatalf("applying the namespace: %v", err)
			}
			for _, u := range objs {
				var one bytes.Buffer
				if err := writeObject(&one, u); err != nil {
					t.Fatal(err)
				}
				if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), one.Bytes()); err != nil {
					t.Errorf("%s %s: %v", u.GetKind(), u.GetName(), err)
				}
			}
		})
	}
}

func writeObject(w io.Writer, u *unstructured.Unstructured) error {
	data, err := u.MarshalJSON()
	if err != nil {
		return fmt.Errorf("encoding %s %s: %w", u.GetKind(), u.GetName(), err)
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}
