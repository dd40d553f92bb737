// Package awskms is the AWS KMS key backend: the CA key is an asymmetric
// SIGN_VERIFY KMS key and never leaves KMS (or the CloudHSM or external key
// store behind it); signing is a KMS Sign call.
//
//	awskms:key-id=1234abcd-12ab-34cd-56ef-1234567890ab;region=eu-west-1
//	awskms:key-id=arn:aws:kms:eu-west-1:111122223333:key/1234abcd-…
//	awskms:key-id=alias/keyward-ca;region=eu-west-1;signing-algorithm=RSASSA_PSS_SHA_256
//	awskms:key-id=…;region=eu-west-1?endpoint=https://vpce-…kms.eu-west-1.vpce.amazonaws.com
//
// key-id is a key id, key ARN, alias/NAME or alias ARN; region may be left
// out when key-id is an ARN. signing-algorithm is an AWS KMS
// SigningAlgorithmSpec; without it the key signs with ECDSA_SHA_256 (P-256),
// ECDSA_SHA_384 (P-384), RSASSA_PKCS1_V1_5_SHA_256 (RSA) or ED25519_SHA_512
// (Ed25519) — chosen from the key spec, never from the order of the key's
// list — and a Signer's URI always names the one it uses. A signer opened
// through an alias signs with the key the alias named at open (by its ARN,
// which is its KeyVersion). CreateKey takes awskms:region=R, optionally
// with description=D and the endpoint query, and returns a Signer whose URI
// names the new key's id. Ed25519 keys sign the message itself (KMS
// MessageType RAW), which KMS takes up to 4096 bytes long: longer
// certificates cannot be signed with them.
//
// Authentication is the AWS SDK's default credential chain unless
// Options.Config says otherwise: on EKS, IRSA (AWS_ROLE_ARN and
// AWS_WEB_IDENTITY_TOKEN_FILE) or EKS Pod Identity need nothing else, and
// on EC2 the instance role is used; no long-lived keys are needed. Opening
// needs kms:DescribeKey and kms:GetPublicKey, signing kms:Sign, creating
// kms:CreateKey.
//
// Each attempt of a KMS call gets Options.CallTimeout within the caller's
// context. The SDK's standard retryer, configured by Options.Retry, retries
// ThrottlingException, KMSInternalException, KeyUnavailableException,
// DependencyTimeoutException, HTTP 500/502/503/504, lost connections and
// attempts that ran out of CallTimeout, with jittered exponential backoff,
// while the SDK's retry budget of the region's client lasts (500 tokens, 5
// a retry, 1 back a success); CreateKey is retried only on
// ThrottlingException, so that a key is never created twice. What persists
// is backends.ErrTransient. NotFoundException is backends.ErrNotFound;
// DisabledException, KMSInvalidStateException, AccessDeniedException and
// other client errors are backends.ErrPermanent. The HTTP transport keeps
// up to 256 idle connections per KMS endpoint (the SDK keeps 10), so that
// concurrent signers do not open a connection a call. Every signature is
// verified against the public key loaded at open before it is returned; one
// that does not verify is never returned (ErrPermanent wrapping
// backends.ErrBadSignature).
package awskms

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/kms"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"
	"github.com/aws/smithy-go/middleware"
	"github.com/keyward/keyward/backends"
)

// Scheme is the URI scheme of this backend.
const Scheme = "awskms"

// idleConnsPerHost is how many idle connections to one KMS endpoint the
// Provider's HTTP transport keeps. The SDK's default, 10, would make every
// signer beyond the tenth open and close a TLS connection per call.
const idleConnsPerHost = 256

// Options configure a Provider. The zero value is usable.
type Options struct {
	// Config is the AWS configuration to use: credentials, HTTP client,
	// logging, endpoint overrides. Its Region is ignored (each URI names
	// its region) and its Retryer replaced by the Provider's. Credentials
	// not in an aws.CredentialsCache are wrapped in one. An HTTP client
	// that is the SDK's buildable client keeps its settings but gets room
	// for idleConnsPerHost idle connections per host; any other client is
	// used as it is. Default: config.LoadDefaultConfig(ctx, LoadOptions...),
	// called by the first Open or CreateKey.
	Config *aws.Config
	// LoadOptions are passed to config.LoadDefaultConfig when Config is nil.
	LoadOptions []func(*config.LoadOptions) error
	// CallTimeout bounds each attempt of each KMS call, within the
	// caller's context (default 10s).
	CallTimeout time.Duration
	// Retry is the policy for calls that fail transiently.
	Retry backends.RetryPolicy
}

// Provider opens AWS KMS keys. It is safe for concurrent use. It loads the
// AWS configuration on first use and keeps one KMS client per region and
// endpoint, shared by all Signers of that region; Signers stop working when
// the Provider is closed.
type Provider struct {
	opts Options

	mu      sync.Mutex
	cfg     *aws.Config // loaded by the first call that needs a client
	clients map[clientKey]*kms.Client
	closed  atomic.Bool
}

type clientKey struct{ region, endpoint string }

var (
	_ backends.Provider   = (*Provider)(nil)
	_ backends.KeyCreator = (*Provider)(nil)
)

// New validates and defaults opts. It does no I/O: the AWS configuration is
// loaded, and clients are made, by the first Open or CreateKey.
func New(opts Options) (*Provider, error) {
	if opts.CallTimeout < 0 {
		return nil, fmt.Errorf("awskms: %w", &backends.OptionError{Option: "CallTimeout", Reason: fmt.Sprintf("%v is negative", opts.CallTimeout)})
	}
	if opts.CallTimeout == 0 {
		opts.CallTimeout = 10 * time.Second
	}
	retry, err := opts.Retry.WithDefaults()
	if err != nil {
		return nil, fmt.Errorf("awskms: %w", err)
	}
	opts.Retry = retry
	if opts.Config != nil {
		cfg := opts.Config.Copy()
		opts.Config = &cfg
	}
	opts.LoadOptions = slices.Clone(opts.LoadOptions)
	return &Provider{opts: opts, clients: map[clientKey]*kms.Client{}}, nil
}

func (*Provider) Scheme() string { return Scheme }

// Algorithms: what AWS KMS signs with — ECDSA P-256 and P-384 with their
// curve's hash, Ed25519, and RSA 2048, 3072 and 4096 with PKCS#1 v1.5 or PSS
// and SHA-256, -384 or -512.
func (*Provider) Algorithms() []backends.Algorithm { return supportedAlgorithms() }

// Close forgets the clients. Later calls, and Signers' calls, fail with
// ErrPermanent.
func (p *Provider) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed.Store(true)
	clear(p.clients)
	return nil
}

// client returns the shared client for loc's region and endpoint, loading
// the configuration and making the client on first use.
func (p *Provider) client(ctx context.Context, op string, loc location) (*kms.Client, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, backends.Errorf(backends.ErrPermanent, op, loc.String(), "", "the awskms provider is closed")
	}
	k := clientKey{region: loc.region, endpoint: loc.endpoint}
	if c, ok := p.clients[k]; ok {
		return c, nil
	}
	if p.cfg == nil {
		cfg, err := p.loadConfig(ctx)
		if err != nil {
			return nil, backends.Wrap(backends.ErrPermanent, op, loc.String(), "", err)
		}
		p.cfg = cfg
	}
	c := kms.NewFromConfig(*p.cfg, func(o *kms.Options) {
		o.Region = loc.region
		if loc.endpoint != "" {
			o.BaseEndpoint = aws.String(loc.endpoint)
		}
		o.Retryer = p.newRetryer()
		o.RetryMaxAttempts = 0 // AWS_MAX_ATTEMPTS must not wrap the retryer
		o.APIOptions = append(slices.Clone(o.APIOptions), addAttemptTimeout(p.opts.CallTimeout))
	})
	p.clients[k] = c
	return c, nil
}

// loadConfig returns a copy of Options.Config, or the default configuration,
// with its credentials cached and its HTTP client's idle pool widened.
func (p *Provider) loadConfig(ctx context.Context) (*aws.Config, error) {
	var cfg aws.Config
	if p.opts.Config != nil {
		cfg = p.opts.Config.Copy()
	} else {
		var err error
		if cfg, err = config.LoadDefaultConfig(ctx, p.opts.LoadOptions...); err != nil {
			return nil, fmt.Errorf("loading the AWS configuration: %w", err)
		}
	}
	if cfg.Credentials != nil {
		if _, cached := cfg.Credentials.(*aws.CredentialsCache); !cached {
			cfg.Credentials = aws.NewCredentialsCache(cfg.Credentials)
		}
	}
	switch c := cfg.HTTPClient.(type) {
	case nil:
		cfg.HTTPClient = awshttp.NewBuildableClient().WithTransportOptions(widenIdlePool)
	case *awshttp.BuildableClient:
		cfg.HTTPClient = c.WithTransportOptions(widenIdlePool)
	}
	return &cfg, nil
}

// widenIdlePool lets the transport keep idleConnsPerHost idle connections
// per host, so that concurrent signers reuse their connections. It does not
// limit connections per host (the SDK's MaxConnsPerHost is 2048).
func widenIdlePool(t *http.Transport) {
	t.MaxIdleConnsPerHost = max(t.MaxIdleConnsPerHost, idleConnsPerHost)
	if t.MaxIdleConns != 0 {
		t.MaxIdleConns = max(t.MaxIdleConns, idleConnsPerHost)
	}
}

// Open describes the key and loads its public key (DescribeKey and
// GetPublicKey, once each) and returns a Signer for it.
func (p *Provider) Open(ctx context.Context, req backends.OpenRequest) (backends.Signer, error) {
	const op = "open"
	loc, err := parseKeyURI(op, req.URI)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, op, loc.String(), "", err)
	}
	client, err := p.client(ctx, op, loc)
	if err != nil {
		return nil, err
	}
	out, err := client.DescribeKey(ctx, &kms.DescribeKeyInput{KeyId: aws.String(loc.keyID)})
	if err != nil {
		return nil, p.failed(ctx, call{op: op, uri: loc.String(), action: "DescribeKey"}, err)
	}
	md := out.KeyMetadata
	if md == nil || aws.ToString(md.Arn) == "" || aws.ToString(md.KeyId) == "" {
		return nil, backends.Errorf(backends.ErrPermanent, op, loc.String(), "", "DescribeKey answered without the key's ARN and id")
	}
	m, err := choose(op, loc, md)
	if err != nil {
		return nil, err
	}
	return p.open(ctx, op, client, loc, aws.ToString(md.Arn), m, nil)
}

// choose checks that the key described by md can sign for keyward — a
// SIGN_VERIFY key of a supported spec, Enabled — and picks its signing
// algorithm: the URI's, which the key must list, or the key spec's default.
func choose(op string, loc location, md *types.KeyMetadata) (mapping, error) {
	uri := loc.String()
	if md.KeyUsage != types.KeyUsageTypeSignVerify {
		return mapping{}, backends.Errorf(backends.ErrUnsupportedAlgorithm, op, uri, attrKeyID, "the key's usage is %s, not SIGN_VERIFY", md.KeyUsage)
	}
	if !supportedKeySpec(md.KeySpec) {
		return mapping{}, backends.Errorf(backends.ErrUnsupportedAlgorithm, op, uri, attrKeyID, "keyward does not sign with %s keys (it does with %v)", md.KeySpec, supportedKeySpecs())
	}
	switch st := md.KeyState; st {
	case types.KeyStateEnabled:
	case types.KeyStateCreating, types.KeyStateUpdating, types.KeyStateUnavailable:
		// A multi-region key being replicated or updated, or a custom key
		// store that is disconnected: retrying later may find it usable.
		return mapping{}, backends.Errorf(backends.ErrTransient, op, uri, attrKeyID, "the key is %s, not Enabled", st)
	default: // Disabled, PendingDeletion, PendingReplicaDeletion, PendingImport
		return mapping{}, backends.Errorf(backends.ErrPermanent, op, uri, attrKeyID, "the key is %s, not Enabled", st)
	}
	signing, part := loc.signing, attrSigning
	if signing == "" {
		signing, _ = defaultSigning(md.KeySpec)
		part = attrKeyID
	}
	m, ok := lookup(md.KeySpec, signing)
	if !ok {
		return mapping{}, backends.Errorf(backends.ErrUnsupportedAlgorithm, op, uri, part, "keyward does not sign with %s on %s keys", signing, md.KeySpec)
	}
	if !slices.Contains(md.SigningAlgorithms, signing) {
		return mapping{}, backends.Errorf(backends.ErrUnsupportedAlgorithm, op, uri, part, "the key does not sign with %s (it does with %v)", signing, md.SigningAlgorithms)
	}
	return m, nil
}

// open loads the public key of the key arn, which signs as m, and returns
// its Signer. getOpts are per-call options of GetPublicKey.
func (p *Provider) open(ctx context.Context, op string, client *kms.Client, loc location, arn string, m mapping, getOpts []func(*kms.Options)) (*Signer, error) {
	loc.signing = m.signing
	uri := loc.String()
	out, err := client.GetPublicKey(ctx, &kms.GetPublicKeyInput{KeyId: aws.String(arn)}, getOpts...)
	if err != nil {
		return nil, p.failed(ctx, call{op: op, uri: uri, action: "GetPublicKey"}, err)
	}
	if got := aws.ToString(out.KeyId); got != arn {
		return nil, backends.Errorf(backends.ErrPermanent, op, uri, "", "GetPublicKey answered with the public key of %q, not %q", got, arn)
	}
	if out.KeySpec != m.keySpec {
		return nil, backends.Errorf(backends.ErrPermanent, op, uri, "", "GetPublicKey answered with a %s key, not %s", out.KeySpec, m.keySpec)
	}
	pub, err := x509.ParsePKIXPublicKey(out.PublicKey)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, op, uri, "", fmt.Errorf("parsing the public key KMS returned: %w", err))
	}
	info, err := backends.NewKeyInfo(pub, m.alg, arn, uri)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, op, uri, "", fmt.Errorf("checking the public key KMS returned: %w", err))
	}
	return &Signer{KeyInfo: info, p: p, client: client, arn: arn, m: m}, nil
}

// CreateKey makes a SIGN_VERIFY key of the key spec of req.Algorithm in the
// URI's region and opens it. Errors after the key was made carry its URI.
func (p *Provider) CreateKey(ctx context.Context, req backends.CreateKeyRequest) (backends.Signer, error) {
	const op = "create-key"
	loc, err := parseCreateURI(op, req.URI)
	if err != nil {
		return nil, err
	}
	m, ok := forAlgorithm(req.Algorithm)
	if !ok {
		return nil, backends.Errorf(backends.ErrUnsupportedAlgorithm, op, loc.String(), "", "AWS KMS makes no %q keys keyward signs with (it does %v)", req.Algorithm, supportedAlgorithms())
	}
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, op, loc.String(), "", err)
	}
	client, err := p.client(ctx, op, loc)
	if err != nil {
		return nil, err
	}
	in := &kms.CreateKeyInput{KeySpec: m.keySpec, KeyUsage: types.KeyUsageTypeSignVerify}
	if loc.description != "" {
		in.Description = aws.String(loc.description)
	}
	out, err := client.CreateKey(ctx, in, func(o *kms.Options) { o.Retryer = p.newCreateRetryer() })
	if err != nil {
		return nil, p.failed(ctx, call{op: op, uri: loc.String(), action: "CreateKey"}, err)
	}
	md := out.KeyMetadata
	if md == nil || aws.ToString(md.KeyId) == "" || aws.ToString(md.Arn) == "" {
		return nil, backends.Errorf(backends.ErrPermanent, op, loc.String(), "", "CreateKey answered without the new key's id and ARN")
	}
	created := location{keyID: aws.ToString(md.KeyId), region: loc.region, endpoint: loc.endpoint}
	if md.KeySpec != m.keySpec || md.KeyUsage != types.KeyUsageTypeSignVerify || !slices.Contains(md.SigningAlgorithms, m.signing) {
		return nil, backends.Errorf(backends.ErrPermanent, op, created.String(), "", "the new key is a %s %s key signing with %v, not a SIGN_VERIFY %s key signing with %s", md.KeySpec, md.KeyUsage, md.SigningAlgorithms, m.keySpec, m.signing)
	}
	// KMS is eventually consistent: a key just made may not be found at
	// once. Here NotFoundException is retried, and transient if it lasts.
	s, err := p.open(ctx, op, client, created, aws.ToString(md.Arn), m, []func(*kms.Options){func(o *kms.Options) {
		o.Retryer = retry.AddWithErrorCodes(o.Retryer, "NotFoundException")
	}})
	var be *backends.Error
	if errors.As(err, &be) && be.Kind == backends.ErrNotFound {
		return nil, backends.Errorf(backends.ErrTransient, op, be.URI, "", "the new key is not visible yet: %w", be.Err)
	}
	if err != nil {
		return nil, err
	}
	s.created = true
	return s, nil
}

var _ middleware.FinalizeMiddleware = attemptTimeout{}
