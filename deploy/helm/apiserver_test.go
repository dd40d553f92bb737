package helm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/promcrds"
)

// cp is the real kube-apiserver (Node,RBAC, NodeRestriction) of this test
// binary, with the chart's CRDs applied and the namespace made.
var cp *controlplane.ControlPlane

func TestMain(m *testing.M) {
	os.Exit(controlplane.RunMain(m, controlplane.Options{}, func(c *controlplane.ControlPlane) error {
		cp = c
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// The release namespace (Helm's to make, not the chart's) and the
		// node agent's, which the chart renders (dry runs create nothing).
		for _, ns := range []string{namespace, nodeNamespace} {
			if err := controlplane.EnsureNamespace(ctx, c.AdminClient(), ns); err != nil {
				return err
			}
		}
		// helm test creates its ServiceAccount (hook weight -1) before
		// its pod; the dry runs of the pod need it to exist.
		if err := ensureServiceAccount(ctx, c.AdminClient(), namespace, testServiceAccount); err != nil {
			return err
		}
		crds, err := renderedCRDs()
		if err != nil {
			return err
		}
		if err := controlplane.ApplyManifest(ctx, c.AdminConfig(), crds); err != nil {
			return err
		}
		// The monitoring sample's ServiceMonitor, PodMonitor and
		// PrometheusRule, judged by prometheus-operator's real CRDs.
		return promcrds.Install(ctx, c.AdminConfig())
	}))
}

// renderedCRDs are the CustomResourceDefinitions the chart renders with
// its defaults, applied for real before the dry runs.
func renderedCRDs() ([]byte, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	bin := os.Getenv("KEYWARD_HELM")
	if bin == "" {
		bin = filepath.Join(root, "bin", "helm")
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "template", "keyward", filepath.Join(root, "deploy", "helm", "keyward"),
		"--namespace", namespace, "--kube-version", kubeVersion, "--show-only", "templates/crds.yaml")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("rendering the CRDs (run make tools if helm is missing): %w: %s", err, stderr.String())
	}
	var doc map[string]any
	if err := yaml.Unmarshal(stdout.Bytes(), &doc); err != nil || len(stdout.Bytes()) == 0 {
		return nil, fmt.Errorf("the chart renders no CRDs: %v", err)
	}
	return stdout.Bytes(), nil
}

// The real apiserver accepts every object of every sample: server-side
// apply with dryRun=All decodes, defaults, validates and admits each one
// (Deployments, DaemonSet, RBAC, PDBs, NetworkPolicies, the CRD…).
func TestSamplesApplyOnTheRealAPIServer(t *testing.T) {
	for name, file := range samples(t) {
		t.Run(name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), mustTemplate(t, file)); err != nil {
				t.Fatal(err)
			}
		})
	}
}
