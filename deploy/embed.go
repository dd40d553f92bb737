// Package deploy carries keyward's manifests so that tests and `keyward demo`
// apply the very files users deploy.
package deploy

import "embed"

// Base holds the kustomize base (RBAC and namespace).
//
//go:embed base/*.yaml
var Base embed.FS
