//go:build tools

// Package cni pins the CNI plugins the real node's pods are networked
// with (node-tests: a bridge inside the node's own network namespace,
// host-local addresses, loopback, portmap): `make node` builds them into
// the cache, keyed by version. A module of its own, so that neither
// keyward's go.mod nor hack/node's runtime pins move for them.
package cni

import (
	_ "github.com/containernetworking/plugins/plugins/ipam/host-local"
	_ "github.com/containernetworking/plugins/plugins/main/bridge"
	_ "github.com/containernetworking/plugins/plugins/main/loopback"
	_ "github.com/containernetworking/plugins/plugins/meta/portmap"
)
