// Package registrycredentials carries the registry credentials example
// (deploy/examples/registry-credentials, docs/registry-credentials.md) so
// that tests and the demo use the very files users deploy.
package registrycredentials

import "embed"

// Files holds the example's manifests, the kubelet and registry
// configurations and kustomization.yaml.
//
//go:embed *.yaml *.yml
var Files embed.FS
