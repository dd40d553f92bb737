//go:build tools

// Package codegen pins controller-gen, which `make generate` builds to
// regenerate the Authority CRD and its deepcopy code. It is a module of its
// own so that its dependencies never change how kube-apiserver is built
// (hack/tools).
package codegen

import (
	_ "sigs.k8s.io/controller-tools/cmd/controller-gen"
)
