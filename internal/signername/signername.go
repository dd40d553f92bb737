// Package signername knows the form of a Kubernetes signer name,
// <domain>/<path>: the one check the signer's configuration and the node
// helper's both make, in a leaf that neither has to import the other for.
package signername

import "regexp"

var signerNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[a-zA-Z0-9][-a-zA-Z0-9_.]*(/[-a-zA-Z0-9_.]+)*$`)

// Valid reports whether s has a signer name's form, <domain>/<path>
// (e.g. keyward.dev/pod-identity).
func Valid(s string) bool { return signerNameRE.MatchString(s) }
