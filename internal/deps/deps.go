//go:build tools

// Package deps pins modules that issue 13's work is about to import, so
// that helpers working in parallel do not each edit go.mod. Removed once
// the real imports exist.
package deps

import (
	_ "github.com/containerd/containerd/v2/core/remotes/docker"
	_ "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)
