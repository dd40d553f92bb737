// Package install installs keyward on a real node the way a user does, by
// running docs/quickstart.md's commands as written: the chart from an OCI
// registry (helm install oci://ghcr.io/keyward/charts/keyward), keyward's
// pods from the images make release assembles, under the Pod Security the
// quickstart labels, a workload pod with a certificate keyward issued,
// then helm test, helm upgrade and helm uninstall; then, on the cluster
// emptied of it, the quickstart's kustomize way and softhsm.md's backup;
// then docs/production/pkcs11-hsm.md and ca-admin.md with SoftHSM2
// standing in for the HSM.
//
// The cluster is whole, as kind's would be, and never leaves the private
// namespaces testsupport/node makes:
//   - kube-apiserver listens on the kubernetes Service's ClusterIP
//     (10.0.0.1:443, an address on the namespace's loopback), so pods
//     reach it through their in-cluster configuration with no kube-proxy;
//   - kube-controller-manager (Deployments, ReplicaSets, DaemonSets,
//     garbage collection, namespaces, ServiceAccounts, kube-root-ca.crt,
//     volume binding) and kube-scheduler run;
//   - pods get addresses from the CNI bridge plugin;
//   - ghcr.io resolves (/etc/hosts, on an overlay of /etc that only this
//     namespace sees) to a CNCF Distribution registry serving TLS on
//     10.213.0.3:443, holding the chart and images this run built, which
//     helm and containerd trust through a CA of the run's;
//   - the node is laid out as kubeadm does (/etc/kubernetes/kubelet.conf,
//     /var/lib/kubelet/pki), which the chart's node agent mounts by
//     default, and a default StorageClass binds the SoftHSM2 token's
//     claim to a hostPath volume, as kind's provisioner would.
package install

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/node"
)

// Addresses inside the node's network namespace.
const (
	// apiserverIP is the kubernetes Service's ClusterIP (the first of the
	// control plane's 10.0.0.0/24 service range).
	apiserverIP = "10.0.0.1"
	// registryIP is where ghcr.io resolves.
	registryIP = "10.213.0.3"
	podSubnet  = "10.88.0.0/16"
)

var (
	cp *controlplane.ControlPlane
	// running is the node, for the interrupt handler.
	running *node.Node
)

func TestMain(m *testing.M) {
	if !node.Inside() {
		// Inside there is no network and no apt state: the Debian packages
		// of the images are fetched into the cache first (not when the
		// node tests are skipped, or cannot run without root).
		if os.Getenv(node.EnvSkip) != "1" && os.Geteuid() == 0 {
			if err := fetchDebs(); err != nil {
				fmt.Fprintf(os.Stderr, "node-tests/install: %v\n", err)
				os.Exit(1)
			}
		}
		os.Exit(node.RunInPrivateNamespaces())
	}
	os.Exit(runInside(m))
}

func runInside(m *testing.M) int {
	if err := prepareNamespaces(); err != nil {
		fmt.Fprintf(os.Stderr, "node-tests/install: %v\n", err)
		return 1
	}
	defer os.RemoveAll(node.WorkDir())
	return controlplane.RunMain(m, controlplane.Options{
		ParentDir:     node.WorkDir(),
		KubeletClient: true,
		Address:       apiserverIP,
		SecurePort:    443,
		OnSignal: func() {
			if running != nil {
				_ = running.Stop()
			}
		},
	}, func(c *controlplane.ControlPlane) error {
		cp = c
		return nil
	})
}

// prepareNamespaces sets up the node's namespaces, finds every binary
// first (a missing one names its make target), and adds the cluster's
// addresses and ghcr.io's name.
func prepareNamespaces() error {
	if err := node.SetUpNamespaces(); err != nil {
		return err
	}
	// Temporary folders (the registry's storage, tests' TempDir) go on
	// the work directory's tmpfs, never the host's /tmp.
	tmp := filepath.Join(node.WorkDir(), "tmp")
	if err := os.MkdirAll(tmp, 0o1777); err != nil {
		return err
	}
	os.Setenv("TMPDIR", tmp)
	if _, err := node.FindBinaries(); err != nil {
		return err
	}
	for _, find := range []func() (string, error){controlplane.FindKubectl, controlplane.FindKubeScheduler, controlplane.FindKubeControllerManager, node.FindCNIPlugins} {
		if _, err := find(); err != nil {
			return err
		}
	}
	if err := node.OverlayEtc(); err != nil {
		return err
	}
	for _, ip := range []string{apiserverIP, registryIP} {
		if err := node.AddAddress(ip); err != nil {
			return err
		}
	}
	// A new regular file in the overlay, never a write through a link
	// that may lead out of /etc.
	hosts, err := os.ReadFile("/etc/hosts")
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if err := os.Remove("/etc/hosts"); err != nil && !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile("/etc/hosts", fmt.Appendf(hosts, "\n%s ghcr.io\n", registryIP), 0o644)
}
