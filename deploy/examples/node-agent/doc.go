// Package nodeagent carries the node agent DaemonSet example
// (deploy/examples/node-agent) so that tests apply the very files users
// deploy.
package nodeagent

import "embed"

// Manifests holds kustomization.yaml and the manifests it lists.
//
//go:embed *.yaml
var Manifests embed.FS
