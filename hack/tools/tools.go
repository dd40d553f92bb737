//go:build tools

// Package tools pins the control-plane binaries that keyward's tests start.
// Build them with `make controlplane` (kube-apiserver) and `make
// controller-manager` (kube-controller-manager, the peer the CSR signing
// benchmark measures keyward against); they land in a cache folder keyed by
// version and are rebuilt only when the version changes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
