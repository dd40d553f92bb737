package tokenservice

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// The apiserver's OIDC discovery paths (KEP-1393, ServiceAccountIssuerDiscovery,
// GA since 1.21). The ClusterRole system:service-account-issuer-discovery
// grants get on both; the shipped RBAC grants them to the token service too.
const (
	openIDConfigPath = "/.well-known/openid-configuration"
	jwksPath         = "/openid/v1/jwks"
)

const (
	// MinKeyRefresh bounds how often an unknown kid makes the token
	// service fetch the issuer's keys again: a flood of tokens with random
	// kids costs at most one fetch per interval.
	MinKeyRefresh = 10 * time.Second
	// keyRetry is how soon keys that could not be fetched are asked for
	// again (meanwhile tokens are reviewed without the local check).
	keyRetry = time.Minute
	// keyFetchTimeout bounds one fetch of the discovery document and the
	// key set.
	keyFetchTimeout = 10 * time.Second
)

// The algorithms kube-apiserver signs service-account tokens with
// (pkg/serviceaccount/jwt.go: RS256 for RSA keys, ES256/384/512 for ECDSA).
var serviceAccountAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.ES384, jose.ES512}

// errBadSignature: the token's signature does not verify with any key the
// cluster's service-account issuer publishes. The token is refused
// without asking the apiserver.
var errBadSignature = errors.New("bad signature")

// errNoIssuerKeys: the issuer's keys are not known (not served, not
// readable); the token is reviewed without the local check.
var errNoIssuerKeys = errors.New("the service-account issuer's keys are not known")

// IssuerKeys verifies service-account tokens locally against the public
// keys the apiserver publishes for its service-account issuer (OIDC
// discovery: /.well-known/openid-configuration, /openid/v1/jwks). It is
// only a filter in front of TokenReview: a token whose signature verifies
// is still reviewed (the pod may be gone), one whose does not is refused
// at once. It is safe for concurrent use.
type IssuerKeys struct {
	get   func(ctx context.Context, path string) ([]byte, error)
	clock clock.PassiveClock

	// keys is the last key set fetched (nil: none yet).
	mu   sync.Mutex
	keys *jose.JSONWebKeySet
	// issuer is the discovery document's issuer (logged).
	issuer string
	// fetched is when the last fetch was attempted; failing says whether
	// it failed (logged once per run of failures).
	fetched time.Time
	failing bool
	// fetchMu serializes fetches: callers that need one wait for the one
	// under way instead of starting their own.
	fetchMu sync.Mutex
}

// NewIssuerKeys reads the keys through c (the token service's client:
// its RBAC must allow get on the two discovery paths). It fetches nothing
// yet.
func NewIssuerKeys(c rest.Interface, clk clock.PassiveClock) (*IssuerKeys, error) {
	if c == nil {
		return nil, errors.New("the issuer keys need a REST client")
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &IssuerKeys{clock: clk, get: func(ctx context.Context, path string) ([]byte, error) {
		// The key set is application/jwk-set+json: without asking for it
		// the apiserver answers 406.
		return c.Get().AbsPath(path).SetHeader("Accept", "application/json, application/jwk-set+json").Do(ctx).Raw()
	}}, nil
}

// verify checks token's signature. It returns the verified payload;
// errBadSignature (wrapped, with why) when no published key verifies it;
// errNoIssuerKeys when the keys are not known.
func (k *IssuerKeys) verify(ctx context.Context, token string) ([]byte, error) {
	jws, err := jose.ParseSigned(token, serviceAccountAlgorithms)
	if err != nil {
		return nil, fmt.Errorf("%w: not a JWS signed with %v: %w", errBadSignature, serviceAccountAlgorithms, err)
	}
	if len(jws.Signatures) != 1 {
		return nil, fmt.Errorf("%w: %d signatures, want one", errBadSignature, len(jws.Signatures))
	}
	kid := jws.Signatures[0].Header.KeyID
	keys, at := k.current(ctx)
	if keys == nil {
		return nil, errNoIssuerKeys
	}
	candidates := lookup(keys, kid)
	if len(candidates) == 0 {
		// Perhaps a new key of the apiserver's: fetch again, at most once
		// per MinKeyRefresh.
		keys = k.refresh(ctx, at)
		candidates = lookup(keys, kid)
	}
	if len(candidates) == 0 {
		return nil, fmt.Errorf("%w: signed with key id %q, which the service-account issuer does not publish", errBadSignature, quote(kid))
	}
	for _, key := range candidates {
		if payload, err := jws.Verify(key.Key); err == nil {
			return payload, nil
		}
	}
	return nil, fmt.Errorf("%w: the signature does not verify with the service-account issuer's key %q", errBadSignature, quote(kid))
}

// lookup is the keys of kid, or every key when the token names none.
func lookup(keys *jose.JSONWebKeySet, kid string) []jose.JSONWebKey {
	if keys == nil {
		return nil
	}
	if kid == "" {
		return keys.Keys
	}
	return keys.Key(kid)
}

// Prime fetches the key set once, at start, so that a missing grant or
// an unreachable discovery path is said at start (one line at default
// verbosity), not at the first token. It reports whether keys are known.
func (k *IssuerKeys) Prime(ctx context.Context) bool {
	keys, _ := k.current(ctx)
	return keys != nil
}

// current is the key set and when it was last fetched; the first call,
// and a call keyRetry after a failed fetch, fetches.
func (k *IssuerKeys) current(ctx context.Context) (*jose.JSONWebKeySet, time.Time) {
	k.mu.Lock()
	keys, at, failing := k.keys, k.fetched, k.failing
	k.mu.Unlock()
	if at.IsZero() || (keys == nil && failing && k.clock.Since(at) >= keyRetry) {
		keys = k.refreshAfter(ctx, at, 0)
		k.mu.Lock()
		at = k.fetched
		k.mu.Unlock()
	}
	return keys, at
}

// refresh fetches again unless a fetch was attempted after seen, or less
// than MinKeyRefresh ago; it returns the key set then known.
func (k *IssuerKeys) refresh(ctx context.Context, seen time.Time) *jose.JSONWebKeySet {
	return k.refreshAfter(ctx, seen, MinKeyRefresh)
}

func (k *IssuerKeys) refreshAfter(ctx context.Context, seen time.Time, every time.Duration) *jose.JSONWebKeySet {
	k.fetchMu.Lock()
	defer k.fetchMu.Unlock()
	k.mu.Lock()
	if k.fetched.After(seen) || (!k.fetched.IsZero() && k.clock.Since(k.fetched) < every) {
		keys := k.keys
		k.mu.Unlock()
		return keys
	}
	k.fetched = k.clock.Now()
	k.mu.Unlock()

	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), keyFetchTimeout)
	defer cancel()
	issuer, keys, err := k.fetch(fctx)
	logger := klog.FromContext(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	if err != nil {
		if !k.failing {
			how := "tokens are verified with the keys fetched before"
			if k.keys == nil {
				how = "every token is reviewed by the apiserver without a local signature check, so a flood of forged tokens can take the review slots"
			}
			logger.Error(err, "Cannot read the service-account issuer's public keys; "+how+" (logged once; retried every minute, or when a token names an unknown key)")
		}
		k.failing = true
		return k.keys
	}
	if k.failing || k.keys == nil || k.issuer != issuer || !sameKIDs(k.keys, keys) {
		logger.Info("Verifying service-account token signatures locally before any TokenReview", "issuer", issuer, "keys", kids(keys))
	}
	k.failing, k.keys, k.issuer = false, keys, issuer
	return keys
}

// fetch reads the discovery document (for the issuer) and the key set.
// The key set is read from the apiserver's own jwksPath, not from the
// document's jwks_uri: with --service-account-jwks-uri that may name a
// host outside the cluster, while the apiserver always serves the same
// keys at jwksPath.
func (k *IssuerKeys) fetch(ctx context.Context) (string, *jose.JSONWebKeySet, error) {
	raw, err := k.get(ctx, openIDConfigPath)
	if err != nil {
		return "", nil, fmt.Errorf("reading %s (OIDC discovery needs kube-apiserver's --service-account-issuer to be an https URL, and RBAC get on it: ClusterRole system:service-account-issuer-discovery): %w", openIDConfigPath, err)
	}
	var doc struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil || doc.Issuer == "" {
		return "", nil, fmt.Errorf("reading %s: no issuer in %q", openIDConfigPath, quote(string(raw)))
	}
	raw, err = k.get(ctx, jwksPath)
	if err != nil {
		return "", nil, fmt.Errorf("reading %s: %w", jwksPath, err)
	}
	var keys jose.JSONWebKeySet
	if err := json.Unmarshal(raw, &keys); err != nil {
		return "", nil, fmt.Errorf("reading %s: %w", jwksPath, err)
	}
	var public []jose.JSONWebKey
	for _, key := range keys.Keys {
		if key.Valid() && key.IsPublic() {
			public = append(public, key)
		}
	}
	if len(public) == 0 {
		return "", nil, fmt.Errorf("reading %s: no public key in it", jwksPath)
	}
	return doc.Issuer, &jose.JSONWebKeySet{Keys: public}, nil
}

func kids(s *jose.JSONWebKeySet) []string {
	out := make([]string, 0, len(s.Keys))
	for _, k := range s.Keys {
		out = append(out, k.KeyID)
	}
	return out
}

func sameKIDs(a, b *jose.JSONWebKeySet) bool {
	x, y := kids(a), kids(b)
	if len(x) != len(y) {
		return false
	}
	for i := range x {
		if x[i] != y[i] {
			return false
		}
	}
	return true
}
