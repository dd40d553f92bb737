// Package nodetests runs keyward with a real node: kubelet v1.37.1,
// containerd and runc built by `make node` (testsupport/node), against the
// real kube-apiserver + etcd of testsupport/controlplane, with SoftHSM2 CA
// keys. keyward runs as in production: its own binary, RBAC rendered by
// `keyward deploy rbac`, CAs made by `keyward ca init`, the signer (with its
// trust publisher) and the approver as processes under their service
// accounts.
//
// The node is one for the whole package. It joins as a real node does: its
// kubelet starts with a bootstrap token only, and keyward's approver and
// signer issue its client certificate (kubernetes.io/kube-apiserver-client-
// kubelet) and its serving certificate (kubernetes.io/kubelet-serving),
// which kube-apiserver verifies with keyward's CA when it reaches the
// kubelet for logs.
//
// The test binary runs itself again inside private mount, network and PID
// namespaces (it needs root) and checks, after, that the node left nothing
// on the host.
package nodetests

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/node"
)

func TestMain(m *testing.M) {
	if !node.Inside() {
		os.Exit(node.RunInPrivateNamespaces())
	}
	os.Exit(runInside(m))
}

func runInside(m *testing.M) int {
	if err := node.SetUpNamespaces(); err != nil {
		fmt.Fprintf(os.Stderr, "node-tests: %v\n", err)
		return 1
	}
	defer os.RemoveAll(node.WorkDir())
	if _, err := node.FindBinaries(); err != nil {
		fmt.Fprintf(os.Stderr, "node-tests: %v\n", err)
		return 1
	}
	// The file must hold a CA at the apiserver's first start; the set-up
	// writes keyward's over this placeholder and restarts the apiserver.
	kubeletCA := filepath.Join(node.WorkDir(), "kubelet-serving-ca.crt")
	if err := writePlaceholderCA(kubeletCA); err != nil {
		fmt.Fprintf(os.Stderr, "node-tests: %v\n", err)
		return 1
	}
	return controlplane.RunMain(runner{m}, controlplane.Options{
		ParentDir:     node.WorkDir(),
		KubeletClient: true,
		OnSignal:      tearDownOnSignal,
		ExtraAPIServerFlags: []string{
			"--enable-bootstrap-token-auth",
			// keyward's kubelet-serving CA, written by the set-up before
			// the apiserver restarts into it.
			"--kubelet-certificate-authority=" + kubeletCA,
		},
	}, func(c *controlplane.ControlPlane) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		var err error
		env, err = setUp(ctx, c, kubeletCA)
		return err
	})
}

// runner runs the tests, then stops the node and keyward before RunMain
// stops the control plane, and fails the run if the node's stop left
// anything in this PID namespace or the node's cgroups.
type runner struct{ m *testing.M }

func (r runner) Run() int {
	code := r.m.Run()
	if node.Hold() && env != nil {
		// RunMain's interrupt handler tears the node down (OnSignal) and
		// stops the control plane.
		fmt.Fprintf(os.Stderr, "node-tests: tests done (exit code %d); %s=1 keeps the cluster and node up: Ctrl-C stops and cleans up\n", code, node.EnvHold)
		select {}
	}
	if env != nil {
		if err := env.tearDown(); err != nil {
			fmt.Fprintf(os.Stderr, "node-tests: tearing the node down: %v\n", err)
			code = 1
		}
	}
	return code
}

// tearDownOnSignal stops the node and keyward when the run is interrupted
// (also the way out of KEYWARD_NODE_HOLD=1).
func tearDownOnSignal() {
	if env != nil {
		if err := env.tearDown(); err != nil {
			fmt.Fprintf(os.Stderr, "node-tests: tearing the node down: %v\n", err)
		}
		_ = os.RemoveAll(node.WorkDir())
	}
}

// writePlaceholderCA writes a throwaway self-signed CA to path.
func writePlaceholderCA(path string) error {
	_, c, err := selfSignedCA("placeholder until keyward's kubelet-serving CA")
	if err != nil {
		return err
	}
	return os.WriteFile(path, certPEM(c), 0o644)
}
