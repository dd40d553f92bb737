//go:build tools

// Package node pins the container runtime of keyward's test node: containerd
// (its daemon, its runc shim and its ctr CLI) and runc. It is a module of its
// own because containerd's api module pin conflicts with the one Kubernetes
// (hack/tools, which builds kubelet) pins. `make node` builds them into the
// cache (hack/build-node.sh); they are rebuilt only when a pin changes.
package node

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
	_ "github.com/opencontainers/runc"
)
