package helm

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/testsupport/controlplane"
)

// testServiceAccount is the helm test hook's ServiceAccount.
const testServiceAccount = "keyward-test"

// renderAs renders the chart as release in ns with values (YAML
// documents, each written to its own values file, later ones winning).
func renderAs(t testing.TB, release, ns string, values ...string) ([]byte, error) {
	t.Helper()
	args := []string{"template", release, chartDir(t), "--namespace", ns, "--kube-version", kubeVersion}
	for i, v := range values {
		f := filepath.Join(t.TempDir(), fmt.Sprintf("values-%d.yaml", i))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f)
	}
	return runHelm(t, args...)
}

// render renders release keyward in the test namespace.
func render(t testing.TB, values ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := renderAs(t, "keyward", namespace, values...)
	if err != nil {
		t.Fatal(err)
	}
	return objects(t, out)
}

// refusedNaming renders values and wants helm to refuse them with an
// error naming field.
func refusedNaming(t *testing.T, field string, values ...string) {
	t.Helper()
	_, err := renderAs(t, "keyward", namespace, values...)
	if err == nil {
		t.Fatalf("helm template accepted %q", values)
	}
	if !strings.Contains(err.Error(), field) {
		t.Errorf("the error does not name %s: %v", field, err)
	}
}

// testPod is the helm test hook's Pod, or nil.
func testPod(t testing.TB, objs []*unstructured.Unstructured) *corev1.Pod {
	t.Helper()
	u := find(objs, "Pod", "keyward-test-signer")
	if u == nil {
		return nil
	}
	return convert[corev1.Pod](t, u)
}

// pods are every pod spec the chart renders: the workloads' templates and
// the helm test pod, by name.
func pods(t testing.TB, objs []*unstructured.Unstructured) map[string]*corev1.PodTemplateSpec {
	t.Helper()
	out := podTemplates(t, objs)
	if p := testPod(t, objs); p != nil {
		out[p.Name] = &corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec}
	}
	return out
}

// everyComponent turns every pod-bearing component on.
const everyComponent = `tokenService: {enabled: true, config: {issuer: i.example.com, registries: [{service: r.example.com}], rules: [{namespaces: ["*"], repositories: ["${namespace}/**"]}]}}`

const (
	digestA = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	digestB = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// imagePullSecrets reach every pod, the helm test's too, after
// global.imagePullSecrets (honoured, not ignored), each name once.
func TestImagePullSecretsReachEveryPod(t *testing.T) {
	objs := render(t, everyComponent, `
global: {imagePullSecrets: [{name: from-global}, {name: shared}]}
imagePullSecrets: [{name: shared}, {name: mine}]`)
	ps := pods(t, objs)
	for _, want := range []string{"keyward-signer", "keyward-approver", "keyward-token-service", "keyward-node-agent", "keyward-test-signer"} {
		pod := ps[want]
		if pod == nil {
			t.Errorf("no pod %s", want)
			continue
		}
		var got []string
		for _, s := range pod.Spec.ImagePullSecrets {
			got = append(got, s.Name)
		}
		if !slices.Equal(got, []string{"from-global", "shared", "mine"}) {
			t.Errorf("%s pulls with %v, want [from-global shared mine]", want, got)
		}
	}
	for name, pod := range pods(t, render(t, everyComponent)) {
		if len(pod.Spec.ImagePullSecrets) != 0 {
			t.Errorf("%s has imagePullSecrets %v by default", name, pod.Spec.ImagePullSecrets)
		}
	}
}

// images maps "pod/container" to its image, init containers included.
func images(t testing.TB, objs []*unstructured.Unstructured) map[string]string {
	t.Helper()
	out := map[string]string{}
	for name, pod := range pods(t, objs) {
		for _, c := range slicesConcat(pod.Spec.InitContainers, pod.Spec.Containers) {
			out[name+"/"+c.Name] = c.Image
		}
	}
	return out
}

// image.digest pins the plain image (repository@digest) and
// image.softhsmDigest the -softhsm variant; a digest that cannot name the
// image a component runs is refused with the field named, never turned
// into a broken reference.
func TestImageDigestPinsEachVariant(t *testing.T) {
	const repo = "ghcr.io/keyward/keyward"
	softhsm := "signer: {replicas: 1, backend: {type: softhsm}}"
	t.Run("a digest pins every component on the plain image", func(t *testing.T) {
		for name, img := range images(t, render(t, everyComponent, "image: {digest: "+digestA+", tag: ignored}")) {
			if img != repo+"@"+digestA {
				t.Errorf("%s runs %s, want %s@%s", name, img, repo, digestA)
			}
		}
	})
	t.Run("with softhsm the signer and its init container run the variant's digest, the others the plain one", func(t *testing.T) {
		got := images(t, render(t, softhsm, "image: {digest: "+digestA+", softhsmDigest: "+digestB+"}"))
		for name, img := range got {
			want := repo + "@" + digestA
			if strings.HasPrefix(name, "keyward-signer/") {
				want = repo + "@" + digestB
			}
			if img != want {
				t.Errorf("%s runs %s, want %s", name, img, want)
			}
		}
		if got["keyward-signer/softhsm-init"] == "" {
			t.Error("no softhsm-init container")
		}
	})
	t.Run("image.softhsm pins every component to the variant's digest", func(t *testing.T) {
		for name, img := range images(t, render(t, "image: {softhsm: true, digest: "+digestA+", softhsmDigest: "+digestB+"}")) {
			if img != repo+"@"+digestB {
				t.Errorf("%s runs %s, want the variant %s@%s", name, img, repo, digestB)
			}
		}
	})
	t.Run("a tag still gets the -softhsm suffix without digests", func(t *testing.T) {
		got := images(t, render(t, softhsm, "image: {tag: 1.2.3}"))
		if got["keyward-signer/signer"] != repo+":1.2.3-softhsm" || got["keyward-approver/approver"] != repo+":1.2.3" {
			t.Errorf("images %v, want the signer on 1.2.3-softhsm and the approver on 1.2.3", got)
		}
	})
	t.Run("a variant's digest alone pins only the variant", func(t *testing.T) {
		got := images(t, render(t, softhsm, "image: {softhsmDigest: "+digestB+"}"))
		if got["keyward-signer/signer"] != repo+"@"+digestB || got["keyward-approver/approver"] != repo+":0.1.0" {
			t.Errorf("images %v", got)
		}
	})
	refused := []struct{ name, values, field string }{
		{"a digest with the softhsm backend but no variant digest is refused", softhsm + "\nimage: {digest: " + digestA + "}", "image.softhsmDigest"},
		{"a digest with image.softhsm but no variant digest is refused", "image: {softhsm: true, digest: " + digestA + "}", "image.softhsmDigest"},
		{"the same digest for both variants is refused", softhsm + "\nimage: {digest: " + digestA + ", softhsmDigest: " + digestA + "}", "image.softhsmDigest"},
		{"a digest through the tag is refused", "image: {tag: 0.1.0@" + digestA + "}", "/image/tag"},
		{"a digest that is no sha256 digest is refused", "image: {digest: latest}", "/image/digest"},
		{"a short variant digest is refused", "image: {softhsmDigest: sha256:abc}", "/image/softhsmDigest"},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) { refusedNaming(t, tc.field, tc.values) })
	}
}

// priorityClassName: the component's, else priorityClassName, else
// global.priorityClassName (honoured); the node agent keeps its own
// default until it is emptied.
func TestPriorityClassNameFallsBackComponentTopGlobal(t *testing.T) {
	cases := []struct {
		name   string
		values string
		want   map[string]string
	}{
		{"none by default but the node agent's", "{}", map[string]string{"keyward-signer": "", "keyward-approver": "", "keyward-token-service": "", "keyward-node-agent": "system-node-critical", "keyward-test-signer": ""}},
		{"global.priorityClassName is every pod's default", "global: {priorityClassName: g}\nnodeAgent: {priorityClassName: ''}",
			map[string]string{"keyward-signer": "g", "keyward-approver": "g", "keyward-token-service": "g", "keyward-node-agent": "g", "keyward-test-signer": "g"}},
		{"priorityClassName wins over the global one", "global: {priorityClassName: g}\npriorityClassName: top",
			map[string]string{"keyward-signer": "top", "keyward-approver": "top", "keyward-token-service": "top", "keyward-node-agent": "system-node-critical", "keyward-test-signer": "top"}},
		{"a component's own wins over both", "global: {priorityClassName: g}\npriorityClassName: top\nsigner: {priorityClassName: s}\napprover: {priorityClassName: a}\ntokenService: {priorityClassName: t}\nnodeAgent: {priorityClassName: node}",
			map[string]string{"keyward-signer": "s", "keyward-approver": "a", "keyward-token-service": "t", "keyward-node-agent": "node", "keyward-test-signer": "top"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ps := pods(t, render(t, everyComponent, tc.values))
			for name, want := range tc.want {
				if ps[name] == nil {
					t.Fatalf("no pod %s", name)
				}
				if got := ps[name].Spec.PriorityClassName; got != want {
					t.Errorf("%s: priorityClassName %q, want %q", name, got, want)
				}
			}
		})
	}
	refusedNaming(t, "/signer/priorityClassName", "signer: {priorityClassName: Not_A_Name}")

	// The quota GKE needs for a system-*-critical class outside
	// kube-system follows the class the node agent's pod gets, also when
	// it comes from a fallback.
	for _, values := range []string{"{}", "nodeAgent: {priorityClassName: ''}\npriorityClassName: system-node-critical",
		"nodeAgent: {priorityClassName: ''}\nglobal: {priorityClassName: system-cluster-critical}"} {
		objs := render(t, everyComponent, values)
		class := pods(t, objs)["keyward-node-agent"].Spec.PriorityClassName
		q := find(objs, "ResourceQuota", "keyward-node-critical-pods")
		if q == nil {
			t.Errorf("values %q: the node agent runs as %s and no ResourceQuota covers it", values, class)
			continue
		}
		got, _, _ := unstructured.NestedSlice(q.Object, "spec", "scopeSelector", "matchExpressions")
		if len(got) != 1 || fmt.Sprint(got[0].(map[string]any)["values"]) != "["+class+"]" {
			t.Errorf("values %q: the quota covers %v, the pod runs as %s", values, got, class)
		}
	}
	if q := find(render(t, everyComponent, "nodeAgent: {priorityClassName: ''}"), "ResourceQuota", "keyward-node-critical-pods"); q != nil {
		t.Error("a quota for a node agent without a critical class")
	}
}

// topologySpreadConstraints are the component's; one without a
// labelSelector gets the component's pod selector (else it would spread
// nothing), one with a selector keeps it.
func TestTopologySpreadConstraintsSelectTheComponent(t *testing.T) {
	ps := pods(t, render(t, everyComponent, `
signer:
  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: ScheduleAnyway}
  - {maxSkew: 2, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {team: pki}}}
tokenService:
  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, matchLabelKeys: [pod-template-hash]}`))
	s := ps["keyward-signer"].Spec.TopologySpreadConstraints
	if len(s) != 2 {
		t.Fatalf("signer: %d constraints, want 2", len(s))
	}
	if sel := s[0].LabelSelector; sel == nil || !labelsMatch(sel.MatchLabels, ps["keyward-signer"].Labels) || sel.MatchLabels["app.kubernetes.io/name"] != "keyward-signer" {
		t.Errorf("signer's first constraint selects %v, want the signer's pods", sel)
	}
	if sel := s[1].LabelSelector; sel == nil || sel.MatchLabels["team"] != "pki" || len(sel.MatchLabels) != 1 {
		t.Errorf("signer's second constraint selects %v, want its own selector kept", sel)
	}
	ts := ps["keyward-token-service"].Spec.TopologySpreadConstraints
	if len(ts) != 1 || ts[0].LabelSelector.MatchLabels["app.kubernetes.io/name"] != "keyward-token-service" || !slices.Equal(ts[0].MatchLabelKeys, []string{"pod-template-hash"}) {
		t.Errorf("token service constraints %+v", ts)
	}
	if c := ps["keyward-approver"].Spec.TopologySpreadConstraints; len(c) != 0 {
		t.Errorf("the approver got constraints %v it was not given", c)
	}
	refusedNaming(t, "/signer/topologySpreadConstraints/0", "signer: {topologySpreadConstraints: [{maxSkew: 1}]}")
}

// podLabels and podAnnotations reach every pod, a component's own over the
// shared ones; neither moves the chart's selector labels or its
// config checksum.
func TestPodLabelsAndAnnotations(t *testing.T) {
	ps := pods(t, render(t, everyComponent, `
podLabels: {tier: shared, team: shared}
podAnnotations: {note: shared, other: shared}
signer:
  podLabels: {team: signer, app.kubernetes.io/name: hijack}
  podAnnotations: {note: signer, checksum/config: hijack}
nodeAgent:
  podLabels: {team: node}`))
	want := map[string]string{"keyward-signer": "signer", "keyward-approver": "shared", "keyward-token-service": "shared", "keyward-node-agent": "node", "keyward-test-signer": "shared"}
	for name, team := range want {
		p := ps[name]
		if p == nil {
			t.Fatalf("no pod %s", name)
		}
		if p.Labels["tier"] != "shared" || p.Labels["team"] != team {
			t.Errorf("%s: labels %v, want tier=shared team=%s", name, p.Labels, team)
		}
		if p.Annotations["other"] != "shared" {
			t.Errorf("%s: annotations %v lack other=shared", name, p.Annotations)
		}
		if name != "keyward-test-signer" && p.Labels["app.kubernetes.io/name"] != name {
			t.Errorf("%s: app.kubernetes.io/name %q, want %q (its workload's selector)", name, p.Labels["app.kubernetes.io/name"], name)
		}
	}
	s := ps["keyward-signer"]
	if s.Annotations["note"] != "signer" {
		t.Errorf("signer's podAnnotations did not win: %v", s.Annotations)
	}
	if c := s.Annotations["checksum/config"]; c == "hijack" || len(c) != 64 {
		t.Errorf("signer's checksum/config is %q, want the configuration's sha256", c)
	}
	refusedNaming(t, "/podLabels/team", "podLabels: {team: 7}")
}

// commonLabels (over global.commonLabels, honoured) label every object
// the chart renders, whatever is turned on, and the pods; the chart's own
// labels win over them.
func TestCommonLabelsOnEveryObject(t *testing.T) {
	objs := render(t, everyComponent, `
global: {commonLabels: {cost-center: from-global, team: from-global}}
commonLabels: {team: pki, app.kubernetes.io/part-of: hijack}
approver: {nodeAddressLock: true}
metrics: {serviceMonitor: {enabled: true}, prometheusRule: {enabled: true}, dashboard: {enabled: true}}
nodeAgent: {exposeMetrics: true}`)
	kinds := map[string]bool{}
	for _, o := range objs {
		kinds[o.GetKind()] = true
		l := o.GetLabels()
		if l["team"] != "pki" || l["cost-center"] != "from-global" || l["app.kubernetes.io/part-of"] != "keyward" {
			t.Errorf("%s %s: labels %v, want team=pki cost-center=from-global part-of=keyward", o.GetKind(), o.GetName(), l)
		}
	}
	for _, k := range []string{"CustomResourceDefinition", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ServiceMonitor", "PodMonitor", "PrometheusRule", "ClusterRole", "Pod", "ServiceAccount", "NetworkPolicy", "PodDisruptionBudget"} {
		if !kinds[k] {
			t.Errorf("the render has no %s: the test covers less than it says", k)
		}
	}
	for name, p := range pods(t, objs) {
		if p.Labels["team"] != "pki" {
			t.Errorf("pod %s: labels %v lack team=pki", name, p.Labels)
		}
	}
}

// global.* is honoured (imagePullSecrets, commonLabels, priorityClassName:
// the tests above) or refused; never ignored.
func TestUnknownGlobalValuesAreRefused(t *testing.T) {
	refusedNaming(t, "imageRegistry", "global: {imageRegistry: registry.example.com}")
	refusedNaming(t, "/global/imagePullSecrets/0", "global: {imagePullSecrets: [regcred]}")
}

// crds.enabled renders the CRD or not; crds.keep (default true) keeps it
// on uninstall.
func TestCRDsEnabledAndKeep(t *testing.T) {
	cases := []struct {
		name, values string
		crd, keep    bool
	}{
		{"by default the CRD is installed and kept", "{}", true, true},
		{"keep false lets uninstall delete it", "crds: {keep: false}", true, false},
		{"enabled false leaves it out", "crds: {enabled: false}", false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			crd := find(render(t, tc.values), "CustomResourceDefinition", "authorities.keyward.dev")
			if (crd != nil) != tc.crd {
				t.Fatalf("CRD rendered: %v, want %v", crd != nil, tc.crd)
			}
			if crd != nil && (crd.GetAnnotations()["helm.sh/resource-policy"] == "keep") != tc.keep {
				t.Errorf("annotations %v, want keep=%v", crd.GetAnnotations(), tc.keep)
			}
		})
	}
	refusedNaming(t, "install", "crds: {install: true}")
}

// clusterScoped are the kinds without a namespace that the chart renders.
var clusterScoped = map[string]bool{"ClusterRole": true, "ClusterRoleBinding": true, "CustomResourceDefinition": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true, "Namespace": true}

// Two releases in two namespaces share no cluster-scoped name, each
// binding names its own ClusterRole and its own namespace's accounts, and
// the Authority CRD (one per cluster) comes from the first alone: the
// second sets crds.enabled=false. The release named keyward keeps the
// names deploy/rbac and the kustomize base use. The real apiserver accepts
// each release's objects (dry run), the renamed admission policy too.
func TestTwoReleasesShareNoClusterScopedName(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	all := []string{everyComponent, "approver: {nodeAddressLock: true}"}
	releases := []struct{ release, ns, values string }{
		{"keyward", "keyward", ""},
		{"keyward-b", "keyward-b", "crds: {enabled: false}\nsigner: {signers: [{name: example.com/b, profile: podIdentity}]}"},
		{"certs", "certs", "crds: {enabled: false}\nsigner: {signers: [{name: example.com/c, profile: podIdentity}]}\ntokenService: {config: {signerName: example.com/c-registry}}"},
	}
	owner := map[string]string{} // kind/name -> release
	for _, r := range releases {
		out, err := renderAs(t, r.release, r.ns, append(all, r.values)...)
		if err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{r.ns, r.ns + "-node"} {
			if err := controlplane.EnsureNamespace(ctx, cp.AdminClient(), ns); err != nil {
				t.Fatal(err)
			}
		}
		if err := ensureServiceAccount(ctx, cp.AdminClient(), r.ns, testServiceAccount); err != nil {
			t.Fatal(err)
		}
		if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), out); err != nil {
			t.Errorf("release %s on the real apiserver: %v", r.release, err)
		}
		objs := objects(t, out)
		roles := map[string]bool{}
		for _, o := range objs {
			if o.GetKind() == "ClusterRole" {
				roles[o.GetName()] = true
			}
		}
		for _, o := range objs {
			if !clusterScoped[o.GetKind()] {
				if ns := o.GetNamespace(); ns != r.ns && ns != r.ns+"-node" {
					t.Errorf("%s: %s %s in namespace %q, want %s (or the node agent's %s-node)", r.release, o.GetKind(), o.GetName(), ns, r.ns, r.ns)
				}
				continue
			}
			id := o.GetKind() + "/" + o.GetName()
			if prev, ok := owner[id]; ok {
				t.Errorf("%s renders %s, as %s does", r.release, id, prev)
			}
			owner[id] = r.release
			switch o.GetKind() {
			case "CustomResourceDefinition":
				if r.release != "keyward" {
					t.Errorf("%s renders the CRD with crds.enabled=false", r.release)
				}
			case "ClusterRoleBinding":
				ref, _, _ := unstructured.NestedString(o.Object, "roleRef", "name")
				if !roles[ref] {
					t.Errorf("%s: ClusterRoleBinding %s binds ClusterRole %s, not one of its own %v", r.release, o.GetName(), ref, roles)
				}
				subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
				for _, s := range subjects {
					if ns := s.(map[string]any)["namespace"]; ns != r.ns {
						t.Errorf("%s: ClusterRoleBinding %s binds a subject in %v", r.release, o.GetName(), ns)
					}
				}
			case "ValidatingAdmissionPolicyBinding":
				if p, _, _ := unstructured.NestedString(o.Object, "spec", "policyName"); owner["ValidatingAdmissionPolicy/"+p] != r.release {
					t.Errorf("%s: the policy binding names %s, not its own policy", r.release, p)
				}
			}
		}
	}
	for _, want := range []string{"ClusterRole/keyward-signer", "ClusterRole/keyward-approver", "ClusterRole/keyward-token-service",
		"ClusterRoleBinding/keyward-signer", "ValidatingAdmissionPolicy/keyward-node-address-lock",
		"ClusterRole/keyward-b-signer", "ClusterRole/certs-keyward-signer", "ValidatingAdmissionPolicy/certs-keyward-node-address-lock"} {
		if owner[want] == "" {
			t.Errorf("no release renders %s", want)
		}
	}
	if owner["CustomResourceDefinition/authorities.keyward.dev"] != "keyward" {
		t.Error("the first release does not render the CRD")
	}
}

// The helm test: a pod that asks for a pod certificate of the first
// podIdentity (or spiffe) name and verifies it against the live bundle;
// no API access (no token, no bindings); restricted-ready; a hook only.
func TestHelmTestPodAsksForACertificateAndVerifiesIt(t *testing.T) {
	objs := render(t)
	pod := testPod(t, objs)
	sa := find(objs, "ServiceAccount", testServiceAccount)
	if pod == nil || sa == nil {
		t.Fatal("no helm test Pod keyward-test-signer and ServiceAccount keyward-test")
	}
	if pod.Annotations["helm.sh/hook"] != "test" || sa.GetAnnotations()["helm.sh/hook"] != "test" {
		t.Errorf("hook annotations: pod %v, ServiceAccount %v, want helm.sh/hook: test", pod.Annotations, sa.GetAnnotations())
	}
	if w := sa.GetAnnotations()["helm.sh/hook-weight"]; w != "-1" {
		t.Errorf("the ServiceAccount's hook weight is %q, want -1 (before the pod)", w)
	}
	spec := pod.Spec
	if spec.ServiceAccountName != testServiceAccount || spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("the test pod runs as %q with automount %v, want %s without a token", spec.ServiceAccountName, spec.AutomountServiceAccountToken, testServiceAccount)
	}
	if spec.RestartPolicy != corev1.RestartPolicyNever || spec.ActiveDeadlineSeconds == nil || *spec.ActiveDeadlineSeconds != 180 {
		t.Errorf("restartPolicy %s, activeDeadlineSeconds %v: want Never and 180 (a pod that never gets its certificate fails)", spec.RestartPolicy, spec.ActiveDeadlineSeconds)
	}
	if len(spec.Containers) != 1 || !slices.Equal(spec.Containers[0].Args, []string{"node", "verify", "--credential-bundle=/var/run/keyward/credential-bundle.pem", "--trust-bundle=/var/run/keyward/ca.pem"}) {
		t.Errorf("containers %+v, want one running keyward node verify on the bundle and the trust file", spec.Containers)
	}
	if len(spec.Volumes) != 1 || spec.Volumes[0].Projected == nil || len(spec.Volumes[0].Projected.Sources) != 2 {
		t.Fatalf("volumes %+v, want one projected volume with a pod certificate and a trust bundle", spec.Volumes)
	}
	pc, ctb := spec.Volumes[0].Projected.Sources[0].PodCertificate, spec.Volumes[0].Projected.Sources[1].ClusterTrustBundle
	if pc == nil || pc.SignerName != "keyward.dev/pod-identity" || pc.KeyType != "ECDSAP256" || pc.CredentialBundlePath != "credential-bundle.pem" {
		t.Errorf("pod certificate source %+v, want keyward.dev/pod-identity ECDSAP256 into credential-bundle.pem", pc)
	}
	if ctb == nil || ctb.SignerName == nil || *ctb.SignerName != "keyward.dev/pod-identity" || ctb.LabelSelector == nil ||
		ctb.LabelSelector.MatchLabels["keyward.dev/cluster-trust-bundle-version"] != "live" || ctb.Path != "ca.pem" {
		t.Errorf("trust bundle source %+v, want keyward.dev/pod-identity's live bundle into ca.pem", ctb)
	}
	if p := spec.SecurityContext; p == nil || p.RunAsNonRoot == nil || !*p.RunAsNonRoot || p.SeccompProfile == nil || p.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("the test pod's security context %+v: want non-root with the runtime's seccomp profile", p)
	}
	if c := spec.Containers[0].SecurityContext; c == nil || c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation ||
		c.Capabilities == nil || !equalCaps(c.Capabilities.Drop, "ALL") || c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
		t.Errorf("the test container's security context %+v: want no escalation, drop ALL, read-only root", c)
	}
	for _, o := range objs {
		subjects, _, _ := unstructured.NestedSlice(o.Object, "subjects")
		for _, s := range subjects {
			if s.(map[string]any)["name"] == testServiceAccount {
				t.Errorf("%s %s binds the test's ServiceAccount", o.GetKind(), o.GetName())
			}
		}
	}
	t.Run("tests.signerName picks the name, its first allowed key type, and no bundle without a trust publisher", func(t *testing.T) {
		p := testPod(t, render(t, "tests: {signerName: example.com/spiffe}\nsigner: {trustPublisher: false, signers: [{name: example.com/csr, profile: csr, csr: {trustDistribution: x, keyUsages: [client auth]}}, {name: example.com/spiffe, profile: spiffe, allowedKeyTypes: [ED25519, RSA3072], spiffe: {trustDomain: cluster.local}}]}"))
		if p == nil {
			t.Fatal("no test pod")
		}
		src := p.Spec.Volumes[0].Projected.Sources
		if len(src) != 1 || src[0].PodCertificate == nil || src[0].PodCertificate.SignerName != "example.com/spiffe" || src[0].PodCertificate.KeyType != "ED25519" {
			t.Errorf("sources %+v, want only a pod certificate of example.com/spiffe, key type ED25519", src)
		}
		if slices.Contains(p.Spec.Containers[0].Args, "--trust-bundle=/var/run/keyward/ca.pem") {
			t.Error("the test checks a trust bundle the trust publisher (off) never publishes")
		}
	})
	t.Run("without a pod certificate signer name no test is rendered", func(t *testing.T) {
		objs := render(t, "approver: {enabled: false}\nsigner: {signers: [{name: example.com/csr, profile: csr, csr: {trustDistribution: x, keyUsages: [client auth]}}]}")
		if testPod(t, objs) != nil || find(objs, "ServiceAccount", testServiceAccount) != nil {
			t.Error("a test pod with no pod certificate signer name to ask")
		}
	})
	refusedNaming(t, "tests.signerName", "tests: {signerName: keyward.dev/node-daemons}")
	refusedNaming(t, "tests.signerName", "tests: {signerName: example.com/unknown}")
}

// The test pod passes Pod Security "restricted": the real apiserver admits
// it (dry run) into a namespace that enforces restricted, with its
// ServiceAccount created as helm test creates it.
func TestHelmTestPodPassesRestrictedPodSecurity(t *testing.T) {
	const ns = "keyward-restricted"
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	client := cp.AdminClient()
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := ensureServiceAccount(ctx, client, ns, testServiceAccount); err != nil {
		t.Fatal(err)
	}
	out, err := runHelm(t, "template", "keyward", chartDir(t), "--namespace", ns, "--kube-version", kubeVersion, "--show-only", "templates/tests/signer-test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), out); err != nil {
		t.Fatalf("the helm test's objects under restricted: %v", err)
	}
	// The check is real: the node agent's pod spec is refused there.
	agent := podTemplates(t, render(t))["keyward-node-agent"]
	bad := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"}, ObjectMeta: metav1.ObjectMeta{Name: "not-restricted", Namespace: ns}, Spec: agent.Spec}
	bad.Spec.ServiceAccountName = testServiceAccount
	if b, err := yaml.Marshal(bad); err != nil {
		t.Fatal(err)
	} else if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), b); err == nil || !strings.Contains(err.Error(), "restricted") {
		t.Errorf("a hostNetwork root pod in the restricted namespace: %v, want a Pod Security refusal", err)
	}
}

func ensureServiceAccount(ctx context.Context, client kubernetes.Interface, ns, name string) error {
	_, err := client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating ServiceAccount %s/%s: %w", ns, name, err)
	}
	return nil
}

// renderNotes renders NOTES.txt with values: helm template does not print
// it, so a copy of the chart gets a template that includes it.
func renderNotes(t *testing.T, values ...string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "keyward")
	src := chartDir(t)
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	notes := "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\ndata:\n  NOTES.txt: {{ include \"keyward/templates/NOTES.txt\" . | toJson }}\n"
	if err := os.WriteFile(filepath.Join(dir, "templates", "zz-notes.yaml"), []byte(notes), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"template", "keyward", dir, "--namespace", namespace, "--kube-version", kubeVersion, "--show-only", "templates/zz-notes.yaml"}
	for i, v := range values {
		f := filepath.Join(t.TempDir(), fmt.Sprintf("values-%d.yaml", i))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--values", f)
	}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	cm := convert[corev1.ConfigMap](t, objects(t, out)[0])
	return cm.Data["NOTES.txt"]
}

// NOTES.txt says what comes next: the Secrets to create, `keyward ca init`
// for every signer name with the configured backend's key URI (softhsm:
// nothing to run), how to check readiness, helm test.
func TestNotesTellTheNextStep(t *testing.T) {
	cases := []struct {
		name, values string
		want, not    []string
	}{
		{"pkcs11 (the default) gives ca init for each name with a pkcs11 URI and the PIN Secret", "signer: {backend: {pkcs11Library: {path: /opt/hsm/libvendor.so}}}",
			[]string{"create secret generic keyward-hsm-pin", "keyward ca init --signer keyward.dev/pod-identity --generation g1 --create-key", "keyward ca init --signer keyward.dev/node-daemons",
				"object=ca-keyward-dev-pod-identity-g1?module-path=/opt/hsm/libvendor.so&pin-source=file:/etc/keyward/hsm/pin", "docs/production/pkcs11-hsm.md", "docs/production/ca-admin.md",
				"rollout status deployment/keyward-signer", "kubectl get authorities.keyward.dev keyward.dev.node-daemons keyward.dev.pod-identity", "keyward trust status keyward.dev/pod-identity", "helm test keyward -n keyward"},
			[]string{"Nothing to run", "crds.enabled=false"}},
		{"gcpkms gives a gcpkms URI and no Secret", "signer: {backend: {type: gcpkms}}",
			[]string{"--key-uri gcpkms:projects/", "none for gcpkms", "docs/production/gcp-kms.md"}, []string{"pkcs11:", "create secret"}},
		{"awskms gives a key to create", "signer: {backend: {type: awskms}}",
			[]string{"--create-key \\\n     --key-uri 'awskms:region=<REGION>;description=keyward keyward.dev/node-daemons g1'", "docs/production/aws-kms.md"}, []string{"pkcs11:"}},
		{"softhsm with bootstrap has nothing to run", "signer: {replicas: 1, backend: {type: softhsm}}",
			[]string{"create secret generic keyward-softhsm --from-file=pin=./pin --from-file=so-pin=./so-pin", "init container does it", "Nothing to run"}, []string{"keyward ca init"}},
		{"a second release without the CRD says where it comes from", "crds: {enabled: false}\ntokenService: {enabled: true, config: {issuer: i, registries: [{service: r}], rules: [{namespaces: [a], repositories: [b]}]}}",
			[]string{"does not install the Authority CRD", "create secret tls keyward-token-service-tls"}, nil},
		{"without a pod certificate name there is no helm test to run", "approver: {enabled: false}\nsigner: {signers: [{name: example.com/csr, profile: csr, csr: {trustDistribution: x, keyUsages: [client auth]}}]}",
			[]string{"helm test needs a podIdentity or spiffe signer name"}, []string{"helm test keyward"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			notes := renderNotes(t, tc.values)
			for _, w := range tc.want {
				if !strings.Contains(notes, w) {
					t.Errorf("NOTES.txt lacks %q:\n%s", w, notes)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(notes, n) {
					t.Errorf("NOTES.txt says %q:\n%s", n, notes)
				}
			}
		})
	}
}
