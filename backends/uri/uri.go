// Package uri parses keyward's key URIs. They follow RFC 7512 (the pkcs11
// URI) for every scheme that has attributes:
//
//	scheme:name=value;name=value?name=value&name=value
//
// path attributes before '?', query attributes after it, values
// percent-decoded. Schemes whose key is a path (file:/etc/ca.key,
// gcpkms:projects/…) keep it in Opaque, with the same query syntax.
package uri

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
)

// URI is a parsed key URI.
type URI struct {
	Scheme string
	// Opaque is everything between "scheme:" and "?", undecoded.
	Opaque string
	// Path holds the ';'-separated attributes of Opaque when it is made of
	// name=value pairs; nil otherwise.
	Path  map[string]string
	Query map[string]string
}

// Parse splits s into scheme, path attributes and query attributes. A
// repeated attribute is an error (RFC 7512 allows none we use twice).
func Parse(s string) (*URI, error) {
	scheme, rest, ok := strings.Cut(s, ":")
	if !ok || scheme == "" {
		return nil, fmt.Errorf("no scheme in %q", RedactURI(s))
	}
	u := &URI{Scheme: scheme, Query: map[string]string{}}
	opaque, query, _ := strings.Cut(rest, "?")
	u.Opaque = opaque
	if strings.Contains(opaque, "=") {
		attrs, err := parseAttrs(opaque, ";")
		if err != nil {
			return nil, fmt.Errorf("path of %q: %w", RedactURI(s), err)
		}
		u.Path = attrs
	}
	if query != "" {
		attrs, err := parseAttrs(query, "&")
		if err != nil {
			return nil, fmt.Errorf("query of %q: %w", RedactURI(s), err)
		}
		u.Query = attrs
	}
	return u, nil
}

func parseAttrs(s, sep string) (map[string]string, error) {
	out := map[string]string{}
	prev := ""
	for _, part := range strings.Split(s, sep) {
		if part == "" {
			continue
		}
		name, value, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			if IsSecret(prev) {
				// Most likely the rest of the secret: do not quote it.
				return nil, fmt.Errorf("the value of %s has an unescaped %q (write it as %%%02X)", prev, sep, sep[0])
			}
			return nil, fmt.Errorf("attribute %q is not name=value", Redact(part))
		}
		prev = name
		v, err := url.PathUnescape(value)
		if err != nil {
			if IsSecret(name) {
				return nil, fmt.Errorf("attribute %s: invalid percent-encoding", name)
			}
			return nil, fmt.Errorf("attribute %s: %w", name, err)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("attribute %s given twice", name)
		}
		out[name] = v
	}
	return out, nil
}

// Attr returns a path attribute, or else a query attribute, of that name.
func (u *URI) Attr(name string) string {
	if v, ok := u.Path[name]; ok {
		return v
	}
	return u.Query[name]
}

// Secrets returns the names of the attributes (path and query) that hold
// secrets (IsSecret: pin-value, password, …, in any case), sorted.
func (u *URI) Secrets() []string {
	var out []string
	for _, m := range []map[string]string{u.Path, u.Query} {
		for k := range m {
			if IsSecret(k) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Unknown returns the attribute names (path and query) not in allowed, sorted.
func (u *URI) Unknown(allowed ...string) []string {
	var out []string
	for _, m := range []map[string]string{u.Path, u.Query} {
		for k := range m {
			if !slices.Contains(allowed, k) {
				out = append(out, k)
			}
		}
	}
	slices.Sort(out)
	return out
}
