//go:build tools

// Package tools pins the control-plane binaries that keyward's tests start.
// Build them with `make controlplane`; they land in a cache folder keyed by
// version and are rebuilt only when the version changes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
