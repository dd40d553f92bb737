// Package config is the token service's configuration file: a versioned,
// strictly decoded YAML document (apiVersion keyward.dev/v1alpha1, kind
// TokenServiceConfiguration). It says which Authority's key signs registry
// tokens, which service-account tokens are accepted, which registries the
// tokens are for, and the policy that maps namespaces, service accounts and
// their annotations to repositories and actions (docs/registry-credentials.md).
package config

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	signerconfig "github.com/keyward/keyward/signer/config"
)

const (
	APIVersion = "keyward.dev/v1alpha1"
	Kind       = "TokenServiceConfiguration"
)

// Key identifiers a token can carry.
const (
	// KeyIdentifierX5C puts the signing generation's certificate chain in
	// the JWS x5c header (the registry's rootcertbundle holds the roots).
	KeyIdentifierX5C = "x5c"
	// KeyIdentifierKID names the key by its JWK thumbprint in the kid
	// header (rootcertbundle or jwks).
	KeyIdentifierKID = "kid"
)

// Actions a rule may grant on a repository.
const (
	ActionPull   = "pull"
	ActionPush   = "push"
	ActionDelete = "delete"
)

// TokenServiceConfiguration is the file `keyward token-service --config`
// reads.
type TokenServiceConfiguration struct {
	// APIVersion is keyward.dev/v1alpha1.
	APIVersion string `json:"apiVersion"`
	// Kind is TokenServiceConfiguration.
	Kind string `json:"kind"`

	// KubeClient says how to reach the apiserver (default qps 300, burst
	// 600).
	KubeClient signerconfig.KubeClient `json:"kubeClient,omitempty"`
	// LeaderElection makes one replica run the trust publisher (default
	// Lease keyward/keyward-token-service); every replica serves tokens.
	LeaderElection signerconfig.LeaderElection `json:"leaderElection,omitempty"`
	// Backends tunes the key backends, as the signer's.
	Backends signerconfig.Backends `json:"backends,omitempty"`

	// Listen is the HTTPS endpoint registries name as their token realm
	// and the credential provider plugin calls.
	Listen Listen `json:"listen"`
	// MetricsAddress serves /metrics (default :9092; plain HTTP, as the
	// signer's).
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// HealthAddress serves /healthz and /readyz (default :9093).
	HealthAddress string `json:"healthAddress,omitempty"`

	// SignerName names the Authority (keyward.dev/v1alpha1) whose Active
	// generation's key signs tokens; its generations rotate as a CA's do.
	SignerName string `json:"signerName"`
	// TrustPublisher runs the trust publisher for SignerName while this
	// replica leads (default on): it moves the generations through their
	// phases and publishes the canary/live ClusterTrustBundles registries
	// are configured from.
	TrustPublisher signerconfig.TrustPublisher `json:"trustPublisher,omitempty"`

	// Issuer is every token's iss: the registries' auth.token.issuer.
	Issuer string `json:"issuer"`
	// Audience is the service-account token audience accepted (the
	// kubelet's tokenAttributes.serviceAccountTokenAudience), e.g.
	// keyward.dev/registry.
	Audience string `json:"audience"`
	// TokenLifetime is a registry token's lifetime (default 5m; 1m–1h).
	// A token never outlives the service-account token it was minted for.
	TokenLifetime metav1.Duration `json:"tokenLifetime,omitempty"`
	// KeyIdentifier is x5c (default) or kid.
	KeyIdentifier string `json:"keyIdentifier,omitempty"`
	// ReviewCacheTTL is how long an accepted service-account token's
	// review (TokenReview, ServiceAccount, Pod) is reused (default 10s,
	// 0s–1m; never past the token's expiry). Refusals are never cached.
	ReviewCacheTTL *metav1.Duration `json:"reviewCacheTTL,omitempty"`

	// Registries are the registries tokens are minted for.
	Registries []Registry `json:"registries"`
	// Rules grant repositories; a scope no rule grants is dropped from the
	// token.
	Rules []Rule `json:"rules"`
}

// Listen is the token endpoint's TLS listener. The certificate and key
// files are read again when they change.
type Listen struct {
	// Address is the host:port the endpoint listens on (default :8443).
	Address string `json:"address,omitempty"`
	// TLSCertFile is the serving certificate (PEM), e.g.
	// /etc/keyward/tls/tls.crt.
	TLSCertFile string `json:"tlsCertFile"`
	// TLSKeyFile is the serving key (PEM), e.g. /etc/keyward/tls/tls.key.
	TLSKeyFile string `json:"tlsKeyFile"`
}

// Registry is one registry that trusts the token service.
type Registry struct {
	// Service is the registry's auth.token.service: the `service` a
	// client names in its token request, and the token's aud.
	Service string `json:"service"`
	// Audience, if set, is the only service-account token audience
	// accepted for this registry (default: the top-level audience), so
	// that a token handed to one registry's hosts cannot buy tokens for
	// another. It takes a kubelet credential provider entry of its own
	// (one serviceAccountTokenAudience per entry) and the node RBAC for
	// it (docs/registry-credentials.md, "Several registries").
	Audience string `json:"audience,omitempty"`
	// Hosts are the image hosts (host or host:port, as written in image
	// references) that are this registry; the credential provider plugin
	// is answered for these, compared without regard to case. Default:
	// [Service]. No two registries share a host.
	Hosts []string `json:"hosts,omitempty"`
}

// Rule grants actions on repositories to the service accounts it matches.
// Every non-empty selector must match.
type Rule struct {
	// Namespaces the rule applies to: names, or "*" for all. Required.
	Namespaces []string `json:"namespaces"`
	// ServiceAccounts: names, or "*" (default ["*"]).
	ServiceAccounts []string `json:"serviceAccounts,omitempty"`
	// ServiceAccountAnnotations must all be on the ServiceAccount with
	// these values ("*": present with any value). Read from the
	// ServiceAccount object, never from the request.
	ServiceAccountAnnotations map[string]string `json:"serviceAccountAnnotations,omitempty"`
	// Registries are Registry.Service values (default: all).
	Registries []string `json:"registries,omitempty"`
	// Repositories are patterns over repository names: "*" matches within
	// one path segment, a trailing "/**" matches any depth below, and
	// ${namespace} / ${serviceAccount} are replaced by the caller's.
	// Required.
	//
	// "team/**" matches team/a and team/a/b but not team itself; "**"
	// alone matches every repository. A placeholder is replaced before
	// matching, and only by a valid path component (a value holding '/',
	// '*' or uppercase matches nothing). Names follow Distribution's
	// grammar: lowercase [a-z0-9] runs separated by '.', '_', '__' or '-',
	// joined by '/', at most 255 characters (CheckRepositoryPattern).
	Repositories []string `json:"repositories"`
	// Actions granted (default [pull]): pull, push, delete.
	Actions []string `json:"actions,omitempty"`
}
