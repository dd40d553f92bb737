package observability_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// monitorSelector reads spec.selector.matchLabels of the component's
// ServiceMonitor or PodMonitor.
func monitorSelector(t *testing.T, objs []*unstructured.Unstructured, kind string) labels.Selector {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() != kind {
			continue
		}
		m, _, err := unstructured.NestedStringMap(o.Object, "spec", "selector", "matchLabels")
		if err != nil || len(m) == 0 {
			t.Fatalf("%s %s has no spec.selector.matchLabels (%v)", kind, o.GetName(), err)
		}
		return labels.SelectorFromSet(m)
	}
	t.Fatalf("no %s in the build", kind)
	return nil
}

// hasPort reports whether ports (a Service's or a container's) has one
// named name.
func hasPort(ports []any, name string) bool {
	for _, p := range ports {
		if m, ok := p.(map[string]any); ok && m["name"] == name {
			return true
		}
	}
	return false
}

// The base with the monitoring component builds, and what it scrapes is
// there to scrape: each metrics Service of SHIP.md (all in the base)
// matches the ServiceMonitor and has a port named metrics, and, with the
// opt-in node-agent-metrics component, the node agent's pods match the
// PodMonitor and name their metrics port (which the agent then serves on
// :9465; without the component it serves loopback only and nothing
// scrapes it).
func TestMonitoringComponentFitsTheBase(t *testing.T) {
	objs := objects(t, kustomizeBuild(t, []string{"deploy/kustomize/base"}, []string{"deploy/kustomize/components/token-service", "deploy/kustomize/components/monitoring", "deploy/kustomize/components/node-agent-metrics"}))
	services := monitorSelector(t, objs, "ServiceMonitor")
	pods := monitorSelector(t, objs, "PodMonitor")
	metricsServices := map[string]bool{"keyward-signer-metrics": true, "keyward-approver-metrics": true, "keyward-token-service": true}
	seen := map[string]bool{}
	for _, o := range objs {
		switch {
		case o.GetKind() == "Service" && metricsServices[o.GetName()]:
			seen[o.GetName()] = true
			if !services.Matches(labels.Set(o.GetLabels())) {
				t.Errorf("Service %s (labels %v) is not selected by the ServiceMonitor (%s)", o.GetName(), o.GetLabels(), services)
			}
			ports, _, _ := unstructured.NestedSlice(o.Object, "spec", "ports")
			if !hasPort(ports, "metrics") {
				t.Errorf("Service %s has no port named metrics", o.GetName())
			}
		case o.GetKind() == "DaemonSet" && o.GetName() == "keyward-node-agent":
			seen[o.GetName()] = true
			podLabels, _, _ := unstructured.NestedStringMap(o.Object, "spec", "template", "metadata", "labels")
			if !pods.Matches(labels.Set(podLabels)) {
				t.Errorf("the node agent's pods (labels %v) are not selected by the PodMonitor (%s)", podLabels, pods)
			}
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			named := false
			for _, c := range containers {
				if m, ok := c.(map[string]any); ok {
					ports, _ := m["ports"].([]any)
					named = named || hasPort(ports, "metrics")
				}
			}
			if !named {
				t.Error("the node agent's container has no port named metrics (the PodMonitor scrapes that port)")
			}
		case o.GetKind() == "ServiceMonitor" || o.GetKind() == "PrometheusRule":
			if o.GetNamespace() != "keyward" {
				t.Errorf("%s %s is in namespace %q, want keyward", o.GetKind(), o.GetName(), o.GetNamespace())
			}
		case o.GetKind() == "PodMonitor":
			// A PodMonitor selects pods of its own namespace: the node
			// agent's, keyward-node.
			if o.GetNamespace() != "keyward-node" {
				t.Errorf("PodMonitor %s is in namespace %q, want keyward-node (the node agent's)", o.GetName(), o.GetNamespace())
			}
		}
	}
	// The base and the token service component carry every scrape target: a renamed one must fail here,
	// not leave the checks above with nothing to check.
	for _, name := range []string{"keyward-signer-metrics", "keyward-approver-metrics", "keyward-token-service", "keyward-node-agent"} {
		if !seen[name] {
			t.Errorf("the base has no %s to scrape", name)
		}
	}
}
