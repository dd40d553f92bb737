package backends

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Registry routes key URIs to the Provider registered for their scheme.
// Build one with NewRegistry; there is no package-level registry.
type Registry struct {
	providers map[string]Provider
}

// NewRegistry registers each provider under its scheme. Two providers for
// one scheme are an error.
func NewRegistry(providers ...Provider) (*Registry, error) {
	r := &Registry{providers: map[string]Provider{}}
	for _, p := range providers {
		s := p.Scheme()
		if _, dup := r.providers[s]; dup {
			return nil, fmt.Errorf("two backends for scheme %q", s)
		}
		r.providers[s] = p
	}
	return r, nil
}

// Schemes lists the registered schemes, sorted.
func (r *Registry) Schemes() []string {
	out := make([]string, 0, len(r.providers))
	for s := range r.providers {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// Provider returns the provider for uri's scheme.
func (r *Registry) Provider(uri string) (Provider, error) { return r.provider("open", uri) }

// provider returns the provider for uri's scheme; errors name op.
func (r *Registry) provider(op, uri string) (Provider, error) {
	scheme, _, ok := strings.Cut(uri, ":")
	if !ok || !validScheme(scheme) {
		return nil, Errorf(ErrInvalidURI, op, uri, "scheme", "no scheme (want one of %v, e.g. file:/path/key.pem)", r.Schemes())
	}
	p, ok := r.providers[scheme]
	if !ok {
		if _, lower := r.providers[strings.ToLower(scheme)]; lower {
			return nil, Errorf(ErrInvalidURI, op, uri, "scheme", "no backend for scheme %q: schemes are lower case, %q", scheme, strings.ToLower(scheme))
		}
		return nil, Errorf(ErrInvalidURI, op, uri, "scheme", "no backend for scheme %q (have %v)", scheme, r.Schemes())
	}
	return p, nil
}

// validScheme reports whether s is an RFC 3986 scheme: a letter, then
// letters, digits, '+', '-' or '.'. Anything else before the first ':' is
// not shown as a scheme, since it may be part of a secret.
func validScheme(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return s != ""
}

// Open opens the key at req.URI.
func (r *Registry) Open(ctx context.Context, req OpenRequest) (Signer, error) {
	p, err := r.Provider(req.URI)
	if err != nil {
		return nil, err
	}
	return p.Open(ctx, req)
}

// CreateKey creates a key with the provider for req.URI's scheme, if it can.
func (r *Registry) CreateKey(ctx context.Context, req CreateKeyRequest) (Signer, error) {
	p, err := r.provider("create-key", req.URI)
	if err != nil {
		return nil, err
	}
	kc, ok := p.(KeyCreator)
	if !ok {
		return nil, Errorf(ErrUnsupportedAlgorithm, "create-key", req.URI, "scheme", "backend %q cannot create keys", p.Scheme())
	}
	return kc.CreateKey(ctx, req)
}

// Close closes every provider.
func (r *Registry) Close() error {
	var errs []error
	for _, p := range r.providers {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}
