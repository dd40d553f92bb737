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
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
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
	// The token service's RBAC comes with its component (and only then).
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
			// The ClusterRoles are cluster-wide: ProveApplied removes them
			// before the next build, and waits until the authorizer no
			// longer grants.
			if err := rbac.ProveApplied(ctx, cp.AdminClient(), checks, applied); err != nil {
				t.Errorf("%s: %v", b.dir, err)
			}
		})
	}
}

// No build ships RBAC for a component it does not run: every ServiceAccount
// is some pod's, every binding binds only those, and every role is bound.
// (The softhsm overlay once dropped the token service's Deployment but kept
// its ServiceAccount and ClusterRole: tokenreviews create, attest, bundle
// deletes for nobody.)
func TestBuildsShipNoRBACForAbsentComponents(t *testing.T) {
	for _, b := range builds {
		t.Run(b.dir, func(t *testing.T) {
			problems := rbac.Orphans(render(t, b.dir).objs)
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
}
