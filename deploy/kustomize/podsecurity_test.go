package kustomize_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/podsecurity"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The namespaces are labelled for Pod Security as shipped: keyward
// enforces, warns and audits "restricted", keyward-node (the node agent
// alone) is "privileged" (hostPath and hostNetwork break even baseline).
func TestNamespacesCarryPodSecurityLabels(t *testing.T) {
	want := map[string]map[string]string{
		"keyward": {
			"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "v1.35",
			"pod-security.kubernetes.io/warn": "restricted", "pod-security.kubernetes.io/warn-version": "latest",
			"pod-security.kubernetes.io/audit": "restricted", "pod-security.kubernetes.io/audit-version": "latest",
		},
		"keyward-node": {
			"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/enforce-version": "latest",
			"pod-security.kubernetes.io/warn": "privileged", "pod-security.kubernetes.io/warn-version": "latest",
			"pod-security.kubernetes.io/audit": "privileged", "pod-security.kubernetes.io/audit-version": "latest",
		},
	}
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			seen := map[string]bool{}
			for _, u := range render(t, b.dir).objs {
				if u.GetKind() != "Namespace" {
					continue
				}
				seen[u.GetName()] = true
				for k, v := range want[u.GetName()] {
					if got := u.GetLabels()[k]; got != v {
						t.Errorf("Namespace %s: label %s=%q, want %q", u.GetName(), k, got, v)
					}
				}
			}
			for ns := range want {
				if !seen[ns] {
					t.Errorf("no Namespace %s", ns)
				}
			}
		})
	}
}

// Every workload of every build is admitted under the Pod Security labels
// it ships with, by a kube-apiserver as strict as a managed cluster: Pod
// Security "restricted" wherever a namespace has no label, and
// system-node-critical pods only under a ResourceQuota for them (GKE's
// rule). Each Deployment and DaemonSet is created (dry run) without a
// warning, and a Pod from its template is created (dry run): Pod Security
// enforces on Pods only. Negative controls show that the judge is live: a
// control-plane pod with hostNetwork, or running as root, is refused in
// keyward, and the node agent's pod is refused in a privileged namespace
// without the quota.
func TestWorkloadsPassPodSecurityAsLabelled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	flags, err := podsecurity.APIServerFlags(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cp, err := controlplane.Start(ctx, controlplane.Options{ExtraAPIServerFlags: flags})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	defer cp.Stop()
	admin := cp.AdminClient()

	var signer, agent *podsecurity.Workload
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			objs := render(t, b.dir).objs
			if err := podsecurity.Prepare(ctx, admin, objs); err != nil {
				t.Fatal(err)
			}
			ws, err := podsecurity.Workloads(objs)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"DaemonSet keyward-node/keyward-node-agent", "Deployment keyward/keyward-approver", "Deployment keyward/keyward-signer"}
			if b.tokenService {
				want = append(want, "Deployment keyward/keyward-token-service")
			}
			if got := podsecurity.Names(ws); !slices.Equal(got, want) {
				t.Fatalf("workloads %v, want %v", got, want)
			}
			problems, err := podsecurity.Admit(ctx, cp.AdminConfig(), ws)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range problems {
				t.Error(p)
			}
			for i := range ws {
				switch ws[i].Name {
				case "keyward-signer":
					signer = &ws[i]
				case "keyward-node-agent":
					agent = &ws[i]
				}
			}
		})
	}
	if signer == nil || agent == nil {
		t.Fatal("no signer or node agent to build the negative controls from")
	}

	refused := func(t *testing.T, w podsecurity.Workload, want string) {
		t.Helper()
		err := podsecurity.AdmitPod(ctx, admin, w)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s's pod in %s: %v, want a refusal naming %q", w.Name, w.Namespace, err, want)
		}
	}
	t.Run("a control-plane pod on the host network is refused in keyward", func(t *testing.T) {
		w := *signer
		w.Template = *signer.Template.DeepCopy()
		w.Template.Spec.HostNetwork = true
		refused(t, w, `violates PodSecurity "restricted:v1.35"`)
	})
	t.Run("a control-plane Deployment on the host network draws a warning and its pod is refused", func(t *testing.T) {
		w := *signer
		w.Template = *signer.Template.DeepCopy()
		w.Template.Spec.HostNetwork = true
		problems, err := podsecurity.Admit(ctx, cp.AdminConfig(), []podsecurity.Workload{w})
		if err != nil {
			t.Fatal(err)
		}
		if len(problems) != 2 || !strings.Contains(problems[0], "warnings: would violate PodSecurity") || !strings.Contains(problems[1], "violates PodSecurity") {
			t.Errorf("problems %q, want a warning on the Deployment and its pod refused", problems)
		}
	})
	t.Run("a control-plane pod running as root is refused in keyward", func(t *testing.T) {
		w := *signer
		w.Template = *signer.Template.DeepCopy()
		no, root := false, int64(0)
		w.Template.Spec.SecurityContext.RunAsNonRoot = &no
		w.Template.Spec.SecurityContext.RunAsUser = &root
		refused(t, w, `violates PodSecurity "restricted:v1.35"`)
	})
	t.Run("the node agent's pod is refused in keyward", func(t *testing.T) {
		w := *agent
		w.Namespace = "keyward"
		w.Template = *agent.Template.DeepCopy()
		w.Template.Spec.ServiceAccountName = "keyward-signer" // one that exists there
		w.Template.Spec.PriorityClassName = ""                // no quota in keyward
		refused(t, w, `violates PodSecurity "restricted:v1.35"`)
	})
	t.Run("the node agent's pod is refused where no quota covers system-node-critical", func(t *testing.T) {
		ns := &unstructured.Unstructured{}
		ns.SetKind("Namespace")
		ns.SetName("keyward-node-no-quota")
		ns.SetLabels(map[string]string{"pod-security.kubernetes.io/enforce": "privileged"})
		sa := &unstructured.Unstructured{}
		sa.SetKind("ServiceAccount")
		sa.SetNamespace(ns.GetName())
		sa.SetName(agent.Template.Spec.ServiceAccountName)
		if err := podsecurity.Prepare(ctx, admin, []*unstructured.Unstructured{ns, sa}); err != nil {
			t.Fatal(err)
		}
		w := *agent
		w.Namespace = ns.GetName()
		if w.Template.Spec.PriorityClassName != "system-node-critical" {
			t.Fatalf("the node agent's priority class is %q", w.Template.Spec.PriorityClassName)
		}
		refused(t, w, "insufficient quota to match these scopes")
	})
}
