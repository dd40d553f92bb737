// Package promcrds gives tests the real CustomResourceDefinitions of
// prometheus-operator (ServiceMonitor, PodMonitor, PrometheusRule), read
// from its released Go module as the Go module proxy serves it (the
// module cache keeps it after the first download), and installs them on a
// test control plane. No CRD is written by hand.
package promcrds

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/keyward/keyward/testsupport/controlplane"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

// Module and Version pin the prometheus-operator release whose CRDs the
// tests apply.
const (
	Module  = "github.com/prometheus-operator/prometheus-operator"
	Version = "v0.85.0"
)

// Group is the API group of the CRDs.
const Group = "monitoring.coreos.com"

// resources are the CRDs keyward's monitoring manifests use, by plural.
func resources() []string { return []string{"servicemonitors", "podmonitors", "prometheusrules"} }

// ModuleDir downloads the module (if the module cache lacks it) and
// returns its directory. It runs `go mod download` outside any module, so
// keyward's go.mod and go.sum stay as they are.
func ModuleDir(ctx context.Context) (string, error) {
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", Module+"@"+Version)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &info); jerr == nil && info.Error != "" {
		return "", fmt.Errorf("downloading %s@%s: %s", Module, Version, info.Error)
	}
	if err != nil {
		return "", fmt.Errorf("downloading %s@%s: %w: %s", Module, Version, err, stderr.String())
	}
	if info.Dir == "" {
		return "", fmt.Errorf("downloading %s@%s: go mod download named no directory", Module, Version)
	}
	return info.Dir, nil
}

// Manifest is the multi-document YAML of the CRDs for ServiceMonitor,
// PodMonitor and PrometheusRule, as the release ships them.
func Manifest(ctx context.Context) ([]byte, error) {
	dir, err := ModuleDir(ctx)
	if err != nil {
		return nil, err
	}
	var all []byte
	for _, r := range resources() {
		path := filepath.Join(dir, "example", "prometheus-operator-crd", Group+"_"+r+".yaml")
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("reading the %s CRD: %w", r, err)
		}
		all = append(all, "\n---\n"...)
		all = append(all, data...)
	}
	return all, nil
}

// Install applies the CRDs and waits until the apiserver serves each
// resource.
func Install(ctx context.Context, cfg *rest.Config) error {
	manifest, err := Manifest(ctx)
	if err != nil {
		return err
	}
	if err := controlplane.ApplyManifest(ctx, cfg, manifest); err != nil {
		return fmt.Errorf("applying the prometheus-operator CRDs: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("making a dynamic client: %w", err)
	}
	for _, r := range resources() {
		gvr := schema.GroupVersionResource{Group: Group, Version: "v1", Resource: r}
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			_, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{Limit: 1})
			return err == nil, nil
		})
		if err != nil {
			return fmt.Errorf("waiting for the apiserver to serve %s: %w", gvr, err)
		}
	}
	// Discovery follows the CRDs later than the resources themselves do:
	// a REST mapper built before it does answers "no matches for kind".
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return fmt.Errorf("making a discovery client: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		list, err := disco.ServerResourcesForGroupVersion(Group + "/v1")
		if err != nil {
			return false, nil
		}
		served := map[string]bool{}
		for _, r := range list.APIResources {
			served[r.Name] = true
		}
		for _, r := range resources() {
			if !served[r] {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for discovery to list %s/v1 %v: %w", Group, resources(), err)
	}
	return nil
}
