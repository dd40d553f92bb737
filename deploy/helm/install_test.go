package helm

import (
	"bytes"
	"context"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// The release path of the chart, as a user meets it: the chart packaged
// as make release packages it (version and appVersion from VERSION),
// pushed to an OCI registry (CNCF Distribution on loopback), installed from
// oci:// into a real kube-apiserver, upgraded, and uninstalled — which
// leaves the CRD and the Authorities (helm.sh/resource-policy: keep).
func TestChartInstallsFromAnOCIRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimSpace(string(b))

	// helm keeps its registry login, cache and repositories here, not in
	// the user's home.
	home := t.TempDir()
	env := []string{"HELM_CONFIG_HOME=" + filepath.Join(home, "config"), "HELM_CACHE_HOME=" + filepath.Join(home, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data"), "HELM_REGISTRY_CONFIG=" + filepath.Join(home, "registry.json")}
	helm := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, helmBin(t), args...)
		cmd.Env = append(os.Environ(), env...)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("helm %s: %v\n%s%s", strings.Join(args, " "), err, stdout.String(), stderr.String())
		}
		return stdout.String() + stderr.String()
	}

	pkgDir := t.TempDir()
	helm("package", chartDir(t), "--version", version, "--app-version", version, "--destination", pkgDir)
	reg := testregistry.StartOpen(t)
	out := helm("push", filepath.Join(pkgDir, "keyward-"+version+".tgz"), "oci://"+reg.Host+"/charts", "--plain-http")
	if !strings.Contains(out, "Digest: sha256:") {
		t.Fatalf("helm push printed no digest:\n%s", out)
	}

	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", kubeconfig); err != nil {
		t.Fatal(err)
	}
	chart := "oci://" + reg.Host + "/charts/keyward"
	values := samples(t)["gcpkms"]
	helm("install", "keyward", chart, "--version", version, "--plain-http", "--kubeconfig", kubeconfig,
		"--namespace", namespace, "--create-namespace", "--values", values, "--wait=false")

	admin := cp.AdminClient()
	dep, err := admin.AppsV1().Deployments(namespace).Get(ctx, "keyward-signer", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the installed release has no signer Deployment: %v", err)
	}
	if got, want := dep.Spec.Template.Spec.Containers[0].Image, "ghcr.io/keyward/keyward:"+version; got != want {
		t.Errorf("the signer runs %s, want %s (the chart's appVersion)", got, want)
	}
	if got := dep.Labels["app.kubernetes.io/version"]; got != "" && got != version {
		t.Errorf("label app.kubernetes.io/version %q, want %q", got, version)
	}

	// An Authority, as keyward ca init would make it.
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	auths := dyn.Resource(schema.GroupVersionResource{Group: "keyward.dev", Version: "v1alpha1", Resource: "authorities"})
	if _, err := auths.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "keyward.dev/v1alpha1", "kind": "Authority",
		"metadata": map[string]any{"name": "keyward.dev.pod-identity"},
		"spec":     map[string]any{"signerName": "keyward.dev/pod-identity"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating an Authority under the installed CRD: %v", err)
	}

	// An upgrade with changed values rolls the signer's pods (a new pod
	// template) and keeps the release's objects.
	before := dep.Spec.Template.Annotations
	helm("upgrade", "keyward", chart, "--version", version, "--plain-http", "--kubeconfig", kubeconfig,
		"--namespace", namespace, "--values", values, "--set", "signer.config.workers=3", "--wait=false")
	dep, err = admin.AppsV1().Deployments(namespace).Get(ctx, "keyward-signer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if maps.Equal(before, dep.Spec.Template.Annotations) {
		t.Errorf("a configuration change left the signer's pod template as it was (annotations %v): its pods would not roll", before)
	}

	helm("uninstall", "keyward", "--kubeconfig", kubeconfig, "--namespace", namespace)
	if _, err := admin.AppsV1().Deployments(namespace).Get(ctx, "keyward-signer", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("after uninstall the signer Deployment: %v, want NotFound", err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	if _, err := crds.Get(ctx, "authorities.keyward.dev", metav1.GetOptions{}); err != nil {
		t.Errorf("helm uninstall removed the CRD (it must keep it, and with it every CA): %v", err)
	}
	if _, err := auths.Get(ctx, "keyward.dev.pod-identity", metav1.GetOptions{}); err != nil {
		t.Errorf("helm uninstall lost the Authority: %v", err)
	}
}
