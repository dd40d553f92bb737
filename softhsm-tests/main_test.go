// Package softhsmtests runs keyward end to end against a real kube-apiserver
// and etcd (Node,RBAC authorization, NodeRestriction admission) and a
// SoftHSM2 token made for this run. One control plane serves the whole
// package; tests isolate themselves by namespace and node names.
package softhsmtests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/deploy"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/softhsm"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The identity the shipped RBAC (deploy/kustomize/base/rbac.yaml) binds.
const (
	signerNamespace      = "keyward"
	signerServiceAccount = "keyward-signer"
)

var (
	cp     *controlplane.ControlPlane
	hsmEnv *softhsm.Env
	token  *softhsm.Token
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(envSignerConfig); cfg != "" {
		// Re-executed by startSignerProcess: be a signer replica.
		os.Exit(runSignerProcess(cfg))
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	return controlplane.RunMain(m, controlplane.Options{
		// Real bootstrap tokens (Secrets in kube-system) for the node
		// agent's KEP-266 bootstrap test.
		ExtraAPIServerFlags: []string{"--enable-bootstrap-token-auth"},
	}, func(c *controlplane.ControlPlane) error {
		cp = c
		if err := installRBAC(c); err != nil {
			return fmt.Errorf("installing deploy/kustomize/base RBAC: %w", err)
		}
		// The token lives in the control plane's work dir, so it goes when
		// the control plane does, also on interrupt.
		var err error
		if hsmEnv, err = softhsm.NewEnv(filepath.Join(c.Dir, "softhsm")); err != nil {
			return err
		}
		token, err = hsmEnv.NewToken("keyward-test")
		return err
	})
}

func installRBAC(c *controlplane.ControlPlane) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// rbac.yaml no longer carries the Namespaces (namespace.yaml does):
	// keyward, and keyward-node for the node agent's ServiceAccount.
	for _, ns := range []string{signerNamespace, "keyward-node"} {
		if err := controlplane.EnsureNamespace(ctx, c.AdminClient(), ns); err != nil {
			return err
		}
	}
	// The base's RBAC, and the opt-in token service component's.
	manifest, err := deploy.Base.ReadFile("kustomize/base/rbac.yaml")
	if err != nil {
		return err
	}
	if err := controlplane.ApplyManifest(ctx, c.AdminConfig(), manifest); err != nil {
		return err
	}
	if manifest, err = deploy.TokenService.ReadFile("kustomize/components/token-service/rbac.yaml"); err != nil {
		return err
	}
	if err := controlplane.ApplyManifest(ctx, c.AdminConfig(), manifest); err != nil {
		return err
	}
	return controlplane.ApplyManifest(ctx, c.AdminConfig(), []byte(testOnlyGrants))
}

// clientFor builds a clientset for cfg or fails the test.
func clientFor(t testing.TB, cfg *rest.Config, err error) kubernetes.Interface {
	t.Helper()
	if err != nil {
		t.Fatalf("client config: %v", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return cs
}

// signerClient authenticates as the signer's service account, so only the
// RBAC we ship grants it anything.
func signerClient(t testing.TB) kubernetes.Interface {
	cfg, err := cp.ServiceAccountConfig(signerNamespace, signerServiceAccount)
	return clientFor(t, cfg, err)
}

// nodeClient authenticates as system:node:<node>.
func nodeClient(t testing.TB, node string) kubernetes.Interface {
	cfg, err := cp.NodeConfig(node)
	return clientFor(t, cfg, err)
}
