package kustomize_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/keyward/keyward/deploy/rbac"
	signerconfig "github.com/keyward/keyward/signer/config"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"
)

// rbacInput is deploy/rbac's Input for a build: its own configuration
// files (the ConfigMaps the pods mount), the components it runs and, for
// the softhsm overlay, the signer's Authority bootstrap.
func rbacInput(t *testing.T, b build, r rendered) rbac.Input {
	t.Helper()
	sc, err := signerconfig.Parse([]byte(r.configMaps["keyward-signer-config"].Data["config.yaml"]))
	if err != nil {
		t.Fatalf("signer configuration: %v", err)
	}
	s := rbac.FromSignerConfig(sc)
	s.BootstrapAuthorities = b.dir == "overlays/softhsm"
	in := rbac.Input{Namespace: rbac.DefaultNamespace, Signer: &s}
	if r.deployments["keyward-approver"] != nil {
		a := rbac.ApproverFromSignerConfig(sc)
		in.Approver = &a
	}
	// The token service's RBAC ships in every build (the softhsm overlay
	// drops only its Deployment), so its identity is checked everywhere.
	if cm := r.configMaps["keyward-token-service-config"]; cm != nil {
		tc, err := tsconfig.Parse([]byte(cm.Data["config.yaml"]))
		if err != nil {
			t.Fatalf("token service configuration: %v", err)
		}
		ts := rbac.FromTokenServiceConfig(tc)
		in.TokenService = &ts
	}
	in.NodeAgent = r.daemonSets["keyward-node-agent"] != nil
	return in
}

// The isolation matrix over every kustomize build, judged by the real
// kube-apiserver: each build's RBAC objects are applied as rendered, and a
// SubjectAccessReview per (component, signer name, verb, object) shows that
// no component can write another component's Authority, Authority status or
// ClusterTrustBundle, nor sign, attest or approve for a name not its own —
// and that each still holds what its own work needs (rbac.Expectations).
// Every check is logged (go test -v prints the matrix).
func TestBuildsKeepEachComponentToItsOwnTrust(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	defer cp.Stop()
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			r := render(t, b.dir)
			var manifest bytes.Buffer
			var applied []*unstructured.Unstructured
			for _, u := range r.objs {
				switch u.GetKind() {
				case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
					if err := writeObject(&manifest, u); err != nil {
						t.Fatal(err)
					}
					if u.GetKind() != "Namespace" {
						applied = append(applied, u)
					}
				}
			}
			if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest.Bytes()); err != nil {
				t.Fatalf("applying the build's RBAC: %v", err)
			}
			in := rbacInput(t, b, r)
			checks := rbac.Expectations(in)
			isolation := rbac.IsolationChecks(in)
			if len(isolation) < 100 {
				t.Fatalf("only %d isolation checks", len(isolation))
			}
			for _, c := range isolation {
				t.Log(c)
			}
			t.Logf("%d checks in all (%d in the isolation matrix)", len(checks), len(isolation))
			// The RBAC authorizer reads through a cache: ask until it
			// has caught up with what this build applied.
			if err := eventually(ctx, func(ctx context.Context) error { return rbac.Prove(ctx, cp.AdminClient(), checks) }); err != nil {
				t.Errorf("%s: RBAC differs from its expectations:\n%v", b.dir, err)
			}
			// The ClusterRoles are cluster-wide: remove them before the
			// next build, and wait until the authorizer no longer grants.
			gone := []rbac.Check{}
			for _, c := range checks {
				if c.Allowed {
					c.Allowed = false
					gone = append(gone, c)
				}
			}
			deleteRBAC(t, ctx, cp.AdminClient(), applied)
			if err := eventually(ctx, func(ctx context.Context) error { return rbac.Prove(ctx, cp.AdminClient(), gone) }); err != nil {
				t.Fatalf("the grants outlived their deletion: %v", err)
			}
		})
	}
}

func deleteRBAC(t *testing.T, ctx context.Context, c kubernetes.Interface, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, o := range objs {
		var err error
		n, ns := o.GetName(), o.GetNamespace()
		switch o.GetKind() {
		case "ServiceAccount":
			err = c.CoreV1().ServiceAccounts(ns).Delete(ctx, n, metav1.DeleteOptions{})
		case "ClusterRole":
			err = c.RbacV1().ClusterRoles().Delete(ctx, n, metav1.DeleteOptions{})
		case "ClusterRoleBinding":
			err = c.RbacV1().ClusterRoleBindings().Delete(ctx, n, metav1.DeleteOptions{})
		case "Role":
			err = c.RbacV1().Roles(ns).Delete(ctx, n, metav1.DeleteOptions{})
		case "RoleBinding":
			err = c.RbacV1().RoleBindings(ns).Delete(ctx, n, metav1.DeleteOptions{})
		}
		if err != nil {
			t.Fatalf("deleting %s %s: %v", o.GetKind(), n, err)
		}
	}
}

// eventually retries f every 200ms until it succeeds or 30s pass, and
// returns the last error f gave.
func eventually(ctx context.Context, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var last error
	for {
		if last = f(ctx); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return last
		case <-time.After(200 * time.Millisecond):
		}
	}
}
