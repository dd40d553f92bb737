// Package credprovider is keyward's kubelet image credential provider
// plugin (KEP-4412, exec API credentialprovider.kubelet.k8s.io/v1). Kubelet
// runs it with a CredentialProviderRequest carrying a pod-bound
// service-account token on stdin; the plugin asks keyward's token service
// (POST /v1/credential) whether that service account may pull the image and,
// if so, answers with the token itself as the registry password for the
// image's host. The registry's token realm (the token service) validates the
// token again on every pull (docs/registry-credentials.md).
//
// What kubelet does around the plugin (read in k8s.io/kubernetes v1.37.1,
// pkg/credentialprovider/plugin/plugin.go):
//   - it encodes the request with apimachinery's JSON serializer for the
//     configured apiVersion, so apiVersion and kind are always set; the token
//     is present only when tokenAttributes is configured, annotations only
//     those the config names;
//   - it runs <pluginBinDir>/<name> with the config's args, its own
//     environment plus the config's env, and a one-minute deadline;
//   - a non-zero exit makes it log an error that quotes our stderr, ignore
//     stdout and pull without credentials from this plugin; nothing is
//     cached;
//   - on exit 0 it requires stdout's apiVersion to equal the configured one
//     and decodes it strictly (an unknown field fails the whole response);
//     cacheKeyType must be Image, Registry or Global; cacheDuration 0 means
//     "do not cache", absent means the config's defaultCacheDuration;
//   - when the password it receives equals the service-account token it
//     sent, it refuses the response unless tokenAttributes.cacheType is
//     Token, because with cacheType ServiceAccount the cache entry would
//     outlive one token and be handed to other pods of the account. This
//     plugin answers with the token itself, so it needs cacheType Token.
package credprovider

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

// APIVersion and the kinds of the exec API this plugin speaks.
const (
	APIVersion   = "credentialprovider.kubelet.k8s.io/v1"
	RequestKind  = "CredentialProviderRequest"
	ResponseKind = "CredentialProviderResponse"
)

// Defaults of Options.
const (
	DefaultTimeout          = 10 * time.Second
	DefaultMaxCacheDuration = 5 * time.Minute
	// ExpirySafetyMargin is taken off the token's remaining lifetime: kubelet
	// must stop using a cached credential before the registry's realm would
	// refuse the token it carries.
	ExpirySafetyMargin = 30 * time.Second
	// MaxRequestBytes bounds what is read from stdin.
	MaxRequestBytes = 1 << 20
)

// Errors callers and tests branch on.
var (
	// ErrBadRequest: stdin did not hold a usable CredentialProviderRequest.
	ErrBadRequest = errors.New("bad credential provider request")
	// ErrTokenExpiring: the service-account token expires too soon for any
	// positive cache duration.
	ErrTokenExpiring = errors.New("service account token expires too soon")
	// ErrBadAnswer: the token service's answer could not be used.
	ErrBadAnswer = errors.New("unusable answer from the token service")
)

// Options configure a Plugin; they are the plugin's command-line flags.
type Options struct {
	// TokenServiceURL is the token service's base https URL; the plugin
	// calls <TokenServiceURL>/v1/credential. Required.
	TokenServiceURL string
	// RootCAs verify the token service's certificate; nil means the
	// system roots.
	RootCAs *x509.CertPool
	// Timeout bounds the whole call to the token service (default 10s).
	Timeout time.Duration
	// CacheKeyType is Image (default) or Registry.
	CacheKeyType credentialproviderv1.PluginCacheKeyType
	// MaxCacheDuration caps the cacheDuration answered (default 5m).
	MaxCacheDuration time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Plugin answers one CredentialProviderRequest. It is safe for concurrent
// use; kubelet starts a new process per request anyway.
type Plugin struct {
	endpoint         string
	client           *tokenServiceClient
	cacheKeyType     credentialproviderv1.PluginCacheKeyType
	maxCacheDuration time.Duration
	now              func() time.Time
}

// New validates opts, defaults the rest and returns a Plugin. It does no I/O.
func New(opts Options) (*Plugin, error) {
	endpoint, err := credentialEndpoint(opts.TokenServiceURL)
	if err != nil {
		return nil, err
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("timeout %s: must be positive", opts.Timeout)
	}
	switch opts.CacheKeyType {
	case "":
		opts.CacheKeyType = credentialproviderv1.ImagePluginCacheKeyType
	case credentialproviderv1.ImagePluginCacheKeyType, credentialproviderv1.RegistryPluginCacheKeyType:
	default:
		// Global would let one answer stand for every registry the
		// kubelet config matches, but the answer names one registry host.
		return nil, fmt.Errorf("cache key type %q: must be %s or %s", opts.CacheKeyType,
			credentialproviderv1.ImagePluginCacheKeyType, credentialproviderv1.RegistryPluginCacheKeyType)
	}
	if opts.MaxCacheDuration == 0 {
		opts.MaxCacheDuration = DefaultMaxCacheDuration
	}
	if opts.MaxCacheDuration < time.Second {
		return nil, fmt.Errorf("max cache duration %s: must be at least 1s", opts.MaxCacheDuration)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Plugin{
		endpoint:         endpoint,
		client:           newTokenServiceClient(opts.RootCAs, opts.Timeout),
		cacheKeyType:     opts.CacheKeyType,
		maxCacheDuration: opts.MaxCacheDuration,
		now:              opts.Now,
	}, nil
}

// credentialEndpoint checks the token service's base URL and returns the
// URL of its /v1/credential endpoint.
func credentialEndpoint(base string) (string, error) {
	if base == "" {
		return "", errors.New("the token service URL is required")
	}
	u, err := url.Parse(base)
	if err != nil {
		return "", fmt.Errorf("parsing the token service URL: %w", err)
	}
	if u.Scheme != "https" || u.Host == "" {
		// The service-account token travels in this request: never in clear.
		return "", fmt.Errorf("token service URL %q: must be https://HOST[:PORT][/PATH]", base)
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("token service URL %q: must carry no user, query or fragment", base)
	}
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/credential"
	u.RawPath = ""
	return u.String(), nil
}

// LoadCAFile reads a PEM file of CA certificates for Options.RootCAs.
func LoadCAFile(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("reading the CA file %s: no PEM CERTIFICATE in it", path)
	}
	return pool, nil
}

// Run reads one CredentialProviderRequest from in, asks the token service
// and writes one complete CredentialProviderResponse to out with a single
// Write. On error nothing is written to out.
func (p *Plugin) Run(ctx context.Context, in io.Reader, out io.Writer) error {
	req, err := ReadRequest(in)
	if err != nil {
		return err
	}
	resp, err := p.Provide(ctx, req)
	if err != nil {
		return err
	}
	data, err := json.Marshal(resp)
	if err != nil {
		return fmt.Errorf("encoding the response: %w", err)
	}
	if _, err := out.Write(append(data, '\n')); err != nil {
		return fmt.Errorf("writing the response: %w", err)
	}
	return nil
}

// ReadRequest reads and checks a CredentialProviderRequest (at most
// MaxRequestBytes). Unknown fields are ignored: a newer kubelet may add
// optional ones to v1, and kubelet itself only fails on unknown fields in
// what it decodes. Errors wrap ErrBadRequest.
func ReadRequest(in io.Reader) (*credentialproviderv1.CredentialProviderRequest, error) {
	data, err := io.ReadAll(io.LimitReader(in, MaxRequestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: reading stdin: %w", ErrBadRequest, err)
	}
	if len(data) > MaxRequestBytes {
		return nil, fmt.Errorf("%w: stdin holds more than %d bytes", ErrBadRequest, MaxRequestBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("%w: stdin is empty; kubelet writes a %s there", ErrBadRequest, RequestKind)
	}
	var req credentialproviderv1.CredentialProviderRequest
	if err := json.Unmarshal(data, &req); err != nil {
		return nil, fmt.Errorf("%w: stdin is not a JSON %s: %w", ErrBadRequest, RequestKind, err)
	}
	if req.APIVersion != APIVersion {
		return nil, fmt.Errorf("%w: apiVersion %q is not supported, only %s (set apiVersion: %s in the kubelet's CredentialProviderConfig)",
			ErrBadRequest, req.APIVersion, APIVersion, APIVersion)
	}
	if req.Kind != RequestKind {
		return nil, fmt.Errorf("%w: kind %q is not supported, only %s", ErrBadRequest, req.Kind, RequestKind)
	}
	if req.Image == "" {
		return nil, fmt.Errorf("%w: image is empty", ErrBadRequest)
	}
	if req.ServiceAccountToken == "" {
		return nil, fmt.Errorf("%w: serviceAccountToken is empty: set tokenAttributes (serviceAccountTokenAudience, requireServiceAccount: true, cacheType: Token) for this provider in the kubelet's CredentialProviderConfig", ErrBadRequest)
	}
	return &req, nil
}

// Provide answers req: the token service's verdict turned into a
// CredentialProviderResponse whose cacheDuration ends before the token
// expires.
func (p *Plugin) Provide(ctx context.Context, req *credentialproviderv1.CredentialProviderRequest) (*credentialproviderv1.CredentialProviderResponse, error) {
	exp, err := tokenExpiry(req.ServiceAccountToken)
	if err != nil {
		return nil, err
	}
	// Checked before calling the token service too: a token already too
	// close to its end is not worth a round trip.
	if _, err := p.cacheDuration(exp); err != nil {
		return nil, err
	}
	answer, err := p.client.credential(ctx, p.endpoint, req.Image, req.ServiceAccountToken)
	if err != nil {
		return nil, err
	}
	host := imageHost(req.Image)
	if answer.Registry != host {
		// The password is the pod's token: hand it out for the host the
		// image is on and nowhere else.
		return nil, fmt.Errorf("%w: it answered for registry %q, but the image %q is on %q", ErrBadAnswer, answer.Registry, req.Image, host)
	}
	if !answer.ExpiresAt.IsZero() && answer.ExpiresAt.Before(exp) {
		exp = answer.ExpiresAt
	}
	d, err := p.cacheDuration(exp)
	if err != nil {
		return nil, err
	}
	return &credentialproviderv1.CredentialProviderResponse{
		TypeMeta:      metav1.TypeMeta{APIVersion: APIVersion, Kind: ResponseKind},
		CacheKeyType:  p.cacheKeyType,
		CacheDuration: &metav1.Duration{Duration: d},
		Auth: map[string]credentialproviderv1.AuthConfig{
			host: {Username: answer.Username, Password: req.ServiceAccountToken},
		},
	}, nil
}

// cacheDuration is min(max cache duration, time left before exp minus the
// safety margin), in whole seconds. Kubelet reads 0 as "do not cache", but
// a credential that dies within the margin would fail the pull it is for,
// so that is an error instead.
func (p *Plugin) cacheDuration(exp time.Time) (time.Duration, error) {
	left := exp.Sub(p.now()) - ExpirySafetyMargin
	d := min(p.maxCacheDuration, left).Truncate(time.Second)
	if d <= 0 {
		return 0, fmt.Errorf("%w: it expires at %s, in %s; a credential needs more than %s left", ErrTokenExpiring,
			exp.UTC().Format(time.RFC3339), exp.Sub(p.now()).Round(time.Second), ExpirySafetyMargin)
	}
	return d, nil
}

// imageHost is the registry host (with port) of an image reference as
// kubelet passes it: the part before the first '/'. Kubelet keys its own
// Registry cache the same way.
func imageHost(image string) string {
	host, _, _ := strings.Cut(image, "/")
	return host
}
