// Package uripattern matches URI SANs against the "<prefix>*" patterns of
// keyward's CSR policies and kubelet CSR approval rules.
//
// A star covers one or more path segments, and only in the one plain form
// every relying party reads the same way: no userinfo, query, fragment or
// %-escape, and no empty, "." or ".." segment. Without that rule
// "spiffe://td/ns/a/*" would admit "spiffe://td/ns/a/../b", which a party
// that normalizes paths reads as namespace b.
package uripattern

import (
	"net/url"
	"slices"
	"strings"
)

// Under returns the path segments u has after prefix when u is plain,
// starts with prefix, and every segment after it is a real one (not
// empty, "." or ".."). ok is false otherwise, including when nothing
// follows prefix.
func Under(u *url.URL, prefix string) (segments []string, ok bool) {
	s := u.String()
	if u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(s, "%?#@") {
		return nil, false
	}
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || rest == "" {
		return nil, false
	}
	segments = strings.Split(rest, "/")
	if slices.ContainsFunc(segments, func(seg string) bool { return seg == "" || seg == "." || seg == ".." }) {
		return nil, false
	}
	return segments, true
}

// Match reports whether u is pattern itself or, for a pattern ending in
// "*", lies Under the part before the star.
func Match(pattern string, u *url.URL) bool {
	prefix, star := strings.CutSuffix(pattern, "*")
	if !star {
		return pattern == u.String()
	}
	_, ok := Under(u, prefix)
	return ok
}
