package rbac

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// startControlPlane starts a control plane for t, stopped when t ends;
// ctx ends after 3 minutes.
func startControlPlane(t *testing.T) (context.Context, *controlplane.ControlPlane) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	return ctx, cp
}

// The input of every shipped component, built from the shipped
// configuration files: the base's (signer, approver, node agent) and the
// token service component's.
func baseFilesInput(t *testing.T) Input {
	t.Helper()
	sc, err := config.Load(filepath.Join("..", "kustomize", "base", "signer-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	tc, err := tsconfig.Load(filepath.Join("..", "kustomize", "components", "token-service", "token-service-config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	s, a, ts := FromSignerConfig(sc), ApproverFromSignerConfig(sc), FromTokenServiceConfig(tc)
	return Input{Namespace: DefaultNamespace, Signer: &s, Approver: &a, TokenService: &ts, NodeAgent: true,
		NodeAgentNamespace: DefaultNodeAgentNamespace, CAAdmin: true}
}

// The generated files are what `make generate` builds: the base's RBAC
// without the token service, the component's with it alone.
func TestBaseRBACFileIsCurrent(t *testing.T) {
	all := baseFilesInput(t)
	base, ts := all, Input{Namespace: all.Namespace, TokenService: all.TokenService}
	base.TokenService = nil
	for file, in := range map[string]Input{
		filepath.Join("..", "kustomize", "base", "rbac.yaml"):                        base,
		filepath.Join("..", "kustomize", "components", "token-service", "rbac.yaml"): ts,
	} {
		want, err := RenderYAML(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("%s is stale: run make generate", file)
		}
	}
}

// TestRenderedRBACHoldsExactlyTheExpectedPermissions applies Render's
// output for several inputs to a real kube-apiserver and runs a
// SubjectAccessReview for every Expectations check. Each case has its own
// namespace and ServiceAccount names (ClusterRoles are cluster-wide).
func TestRenderedRBACHoldsExactlyTheExpectedPermissions(t *testing.T) {
	ctx, cp := startControlPlane(t)
	admin := cp.AdminClient()

	base := baseFilesInput(t)
	cases := []struct {
		name string
		in   func(ns string) Input
	}{
		{"the base's configuration holds exactly its permissions", func(ns string) Input {
			in := base
			in.Namespace, in.NodeAgentNamespace = ns, ns
			return in
		}},
		{"a signer without CSR names holds no CSR verbs", func(ns string) Input {
			return Input{Namespace: ns, Signer: &SignerInput{ServiceAccount: "s-pcr", LeaseName: "s-pcr",
				PCRSigners: []string{"keyward.dev/demo"}, TrustPublisher: true}}
		}},
		{"a signer without its trust publisher holds no attest", func(ns string) Input {
			return Input{Namespace: ns, Signer: &SignerInput{ServiceAccount: "s-notp", LeaseName: "s-notp",
				PCRSigners: []string{"keyward.dev/demo"}, CSRSigners: []string{"example.com/daemons"}}}
		}},
		{"a bootstrapping signer may create Authorities", func(ns string) Input {
			return Input{Namespace: ns, Signer: &SignerInput{ServiceAccount: "s-boot", LeaseName: "s-boot",
				PCRSigners: []string{"keyward.dev/demo"}, TrustPublisher: true, BootstrapAuthorities: true}}
		}},
		{"an approver approves for its names only", func(ns string) Input {
			return Input{Namespace: ns, Approver: &ApproverInput{ServiceAccount: "a-only", LeaseName: "a-only",
				Signers: []string{"kubernetes.io/kubelet-serving", "example.com/daemons"}}}
		}},
		{"Authorities named otherwise are written by their given names only", func(ns string) Input {
			return Input{Namespace: ns, Signer: &SignerInput{ServiceAccount: "s-named", LeaseName: "s-named",
				PCRSigners: []string{"keyward.dev/named"}, TrustPublisher: true},
				TokenService: &TokenServiceInput{ServiceAccount: "t-named", LeaseName: "t-named",
					SignerName: "keyward.dev/named-token", TrustPublisher: true},
				AuthorityNames: map[string]string{"keyward.dev/named": "demo", "keyward.dev/named-token": "registry-token"}}
		}},
		{"a token service without a trust publisher holds no attest", func(ns string) Input {
			return Input{Namespace: ns, TokenService: &TokenServiceInput{ServiceAccount: "t-notp", LeaseName: "t-notp",
				SignerName: "keyward.dev/registry-token"}}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := fmt.Sprintf("rbac-%d", i)
			if err := controlplane.EnsureNamespace(ctx, admin, ns); err != nil {
				t.Fatal(err)
			}
			in := tc.in(ns)
			y, err := RenderYAML(in)
			if err != nil {
				t.Fatal(err)
			}
			if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), y); err != nil {
				t.Fatalf("applying the rendered RBAC: %v", err)
			}
			checks := Expectations(in)
			if len(checks) < 20 {
				t.Fatalf("only %d checks", len(checks))
			}
			for _, c := range checks {
				t.Log(c)
			}
			if err := Prove(ctx, admin, checks); err != nil {
				t.Fatalf("RBAC differs from its expectations:\n%v", err)
			}
		})
	}

	t.Run("Prove names every check the apiserver answers otherwise", func(t *testing.T) {
		in := cases[1].in("rbac-1")
		checks := Expectations(in)
		for i := range checks {
			checks[i].Allowed = !checks[i].Allowed
		}
		err := Prove(ctx, admin, checks[:2])
		if !errors.Is(err, ErrMismatch) {
			t.Fatalf("Prove: %v, want ErrMismatch", err)
		}
		if n := strings.Count(err.Error(), "\n") + 1; n != 2 {
			t.Errorf("Prove reported %d mismatches, want 2:\n%v", n, err)
		}
	})
}
