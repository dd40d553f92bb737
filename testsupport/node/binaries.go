package node

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"github.com/keyward/keyward/testsupport/controlplane"
)

// The versions `make node` builds; they must match the pins in
// hack/node/go.mod and the Makefile (TestPinsMatchTheMakefile).
const (
	ContainerdVersion = "v2.4.2"
	RuncVersion       = "v1.5.2"
	// CNIPluginsVersion is hack/cni's containernetworking/plugins pin.
	CNIPluginsVersion = "v1.10.0"
)

// Binaries are the node's programs in the cache `make node` fills.
type Binaries struct {
	Kubelet, Containerd, Shim, Ctr, Runc string
}

// FindBinaries finds kubelet, containerd, its runc shim, ctr and runc under
// $KEYWARD_CACHE_DIR/node, or says to run `make node`.
func FindBinaries() (Binaries, error) {
	cp, err := controlplane.CacheDir() // <cache>/controlplane/<version>
	if err != nil {
		return Binaries{}, err
	}
	root := filepath.Join(filepath.Dir(filepath.Dir(cp)), "node")
	kubelet := filepath.Join(root, "kubelet-"+controlplane.KubeVersion)
	rt := filepath.Join(root, "containerd-"+ContainerdVersion+"-runc-"+RuncVersion)
	b := Binaries{
		Kubelet:    filepath.Join(kubelet, "kubelet"),
		Containerd: filepath.Join(rt, "containerd"),
		Shim:       filepath.Join(rt, "containerd-shim-runc-v2"),
		Ctr:        filepath.Join(rt, "ctr"),
		Runc:       filepath.Join(rt, "runc"),
	}
	for _, p := range []string{b.Kubelet, b.Containerd, b.Shim, b.Ctr, b.Runc} {
		fi, err := os.Stat(p)
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return b, fmt.Errorf("%w: %s not found: run `make node` to build kubelet %s, containerd %s and runc %s into %s",
				controlplane.ErrBinaryMissing, p, controlplane.KubeVersion, ContainerdVersion, RuncVersion, root)
		}
	}
	return b, nil
}

func goarch() string { return runtime.GOARCH }

// FindCNIPlugins returns the folder of the CNI plugins `make node` builds
// (bridge, host-local, loopback, portmap).
func FindCNIPlugins() (string, error) {
	cp, err := controlplane.CacheDir()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(filepath.Dir(filepath.Dir(cp)), "node", "cni-plugins-"+CNIPluginsVersion)
	for _, p := range []string{"bridge", "host-local", "loopback", "portmap"} {
		if fi, err := os.Stat(filepath.Join(dir, p)); err != nil || fi.Mode()&0o111 == 0 {
			return "", fmt.Errorf("%w: the CNI plugin %s is not in %s: run `make node` to build the CNI plugins %s", controlplane.ErrBinaryMissing, p, dir, CNIPluginsVersion)
		}
	}
	return dir, nil
}
