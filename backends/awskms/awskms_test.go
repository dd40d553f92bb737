package awskms_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/awskms"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
)

const region = "eu-west-1"

// awsAlgorithms is the test's own statement of the AWS KMS key spec and
// signing algorithm of each keyward algorithm.
func awsAlgorithms() map[backends.Algorithm][2]string {
	m := map[backends.Algorithm][2]string{
		backends.ECDSAP256SHA256: {"ECC_NIST_P256", "ECDSA_SHA_256"},
		backends.ECDSAP384SHA384: {"ECC_NIST_P384", "ECDSA_SHA_384"},
		backends.Ed25519:         {"ECC_NIST_EDWARDS25519", "ED25519_SHA_512"},
	}
	for _, bits := range []int{2048, 3072, 4096} {
		for _, h := range []int{256, 384, 512} {
			spec := fmt.Sprintf("RSA_%d", bits)
			m[backends.Algorithm(fmt.Sprintf("rsa-%d-pkcs1-sha%d", bits, h))] = [2]string{spec, fmt.Sprintf("RSASSA_PKCS1_V1_5_SHA_%d", h)}
			m[backends.Algorithm(fmt.Sprintf("rsa-%d-pss-sha%d", bits, h))] = [2]string{spec, fmt.Sprintf("RSASSA_PSS_SHA_%d", h)}
		}
	}
	return m
}

// defaultSigning is what the provider must pick when a URI names no
// signing algorithm.
var defaultSigning = map[string]string{
	"ECC_NIST_P256":         "ECDSA_SHA_256",
	"ECC_NIST_P384":         "ECDSA_SHA_384",
	"ECC_NIST_EDWARDS25519": "ED25519_SHA_512",
	"RSA_2048":              "RSASSA_PKCS1_V1_5_SHA_256",
	"RSA_3072":              "RSASSA_PKCS1_V1_5_SHA_256",
	"RSA_4096":              "RSASSA_PKCS1_V1_5_SHA_256",
}

func TestConformance(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{ReuseKeyMaterial: true})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	unsupported := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P521"})
	backendtest.Run(t, backendtest.Harness{
		Provider: p,
		KeyURI: func(t *testing.T, alg backends.Algorithm) string {
			spec, signing := awsAlgorithm(t, alg)
			k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: spec})
			if defaultSigning[spec] == signing {
				return keyURI(srv, k.ID, "") // the provider's default
			}
			return keyURI(srv, k.ID, ";signing-algorithm="+signing)
		},
		MissingKeyURI:     keyURI(srv, "0b0e5a4c-6e38-4a55-9d7e-5c1e3e8d2f00", ""),
		UnsupportedKeyURI: keyURI(srv, unsupported.ID, ""),
		CreateURI: func(t *testing.T, alg backends.Algorithm) string {
			return "awskms:region=" + region + ";description=keyward%20conformance?endpoint=" + srv.URL()
		},
		Algorithms: testAlgorithms(),
		Stall: func(*testing.T) func() {
			srv.SetLatency(time.Hour)
			return func() { srv.SetLatency(0) }
		},
	})
}

// testAlgorithms is every algorithm, but in -short runs only RSA-2048 among
// the RSA sizes (RSA-4096 key generation takes seconds).
func testAlgorithms() []backends.Algorithm {
	if !testing.Short() {
		return nil
	}
	return []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.Ed25519,
		backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA512}
}

func TestProviderClaimsEveryAlgorithmAWSKMSSignsWith(t *testing.T) {
	p := newProvider(t, awskms.Options{})
	var want []backends.Algorithm
	for a := range awsAlgorithms() {
		want = append(want, a)
	}
	slices.Sort(want)
	if got := p.Algorithms(); !slices.Equal(got, want) {
		t.Fatalf("Algorithms() = %v, want %v", got, want)
	}
	if p.Scheme() != "awskms" {
		t.Fatalf("Scheme() = %q", p.Scheme())
	}
}

func TestOpenChoosesTheSigningAlgorithmExplicitly(t *testing.T) {
	tests := []struct {
		name        string
		keySpec     string
		keyLists    []string // the key's SigningAlgorithms, if not AWS's
		attr        string   // signing-algorithm attribute, if any
		want        backends.Algorithm
		wantSigning string
		wantType    string
	}{
		{name: "a P-256 key signs with ECDSA_SHA_256 by default", keySpec: "ECC_NIST_P256", want: backends.ECDSAP256SHA256, wantSigning: "ECDSA_SHA_256", wantType: "DIGEST"},
		{name: "a P-384 key signs with ECDSA_SHA_384 by default", keySpec: "ECC_NIST_P384", want: backends.ECDSAP384SHA384, wantSigning: "ECDSA_SHA_384", wantType: "DIGEST"},
		{name: "an RSA key whose list starts with PSS signs with PKCS#1 v1.5 SHA-256 by default", keySpec: "RSA_2048", want: backends.RSA2048PKCS1SHA256, wantSigning: "RSASSA_PKCS1_V1_5_SHA_256", wantType: "DIGEST"},
		{name: "an RSA key whose list has PKCS#1 SHA-512 first still defaults to SHA-256", keySpec: "RSA_2048", keyLists: []string{"RSASSA_PKCS1_V1_5_SHA_512", "RSASSA_PKCS1_V1_5_SHA_256"}, want: backends.RSA2048PKCS1SHA256, wantSigning: "RSASSA_PKCS1_V1_5_SHA_256", wantType: "DIGEST"},
		{name: "a URI asking for PSS gets PSS", keySpec: "RSA_2048", attr: "RSASSA_PSS_SHA_256", want: backends.RSA2048PSSSHA256, wantSigning: "RSASSA_PSS_SHA_256", wantType: "DIGEST"},
		{name: "a URI asking for PKCS#1 v1.5 SHA-384 gets it", keySpec: "RSA_2048", attr: "RSASSA_PKCS1_V1_5_SHA_384", want: backends.RSA2048PKCS1SHA384, wantSigning: "RSASSA_PKCS1_V1_5_SHA_384", wantType: "DIGEST"},
		{name: "an Ed25519 key signs with ED25519_SHA_512 over the raw message", keySpec: "ECC_NIST_EDWARDS25519", want: backends.Ed25519, wantSigning: "ED25519_SHA_512", wantType: "RAW"},
	}
	srv := startFake(t, awskmsfake.Options{ReuseKeyMaterial: true})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: tt.keySpec, SigningAlgorithms: tt.keyLists})
			attr := ""
			if tt.attr != "" {
				attr = ";signing-algorithm=" + tt.attr
			}
			s := open(t, p, keyURI(srv, k.ID, attr))
			if s.Algorithm() != tt.want {
				t.Errorf("Algorithm() = %s, want %s", s.Algorithm(), tt.want)
			}
			if want := "signing-algorithm=" + tt.wantSigning; !strings.Contains(s.URI(), want) {
				t.Errorf("URI() = %s, want it to name %s", s.URI(), want)
			}
			if s.KeyVersion() != k.ARN {
				t.Errorf("KeyVersion() = %s, want the key ARN %s", s.KeyVersion(), k.ARN)
			}
			d := kmstest.Digest(s.Algorithm(), tt.name)
			sig, err := s.SignContext(context.Background(), d, s.Algorithm().SignerOpts())
			if err != nil {
				t.Fatalf("SignContext: %v", err)
			}
			if err := backends.VerifySignature(s.Public(), s.Algorithm(), d, sig); err != nil {
				t.Fatal(err)
			}
			req := lastSign(t, srv)
			if req.SigningAlgorithm != tt.wantSigning || req.MessageType != tt.wantType || req.KeyID != k.ARN {
				t.Errorf("KMS received Sign(KeyId=%s, SigningAlgorithm=%s, MessageType=%s), want (%s, %s, %s)",
					req.KeyID, req.SigningAlgorithm, req.MessageType, k.ARN, tt.wantSigning, tt.wantType)
			}
		})
	}
}

func TestOpenRefusesKeysKeywardDoesNotSignWith(t *testing.T) {
	tests := []struct {
		name     string
		key      awskmsfake.NewKey
		attr     string
		want     error
		wantPart string
	}{
		{name: "a P-521 key", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P521"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "a secp256k1 key", key: awskmsfake.NewKey{KeySpec: "ECC_SECG_P256K1"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "an SM2 key", key: awskmsfake.NewKey{KeySpec: "SM2"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "an ML-DSA key", key: awskmsfake.NewKey{KeySpec: "ML_DSA_65"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "an HMAC key", key: awskmsfake.NewKey{KeySpec: "HMAC_256"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "a symmetric encryption key", key: awskmsfake.NewKey{KeySpec: "SYMMETRIC_DEFAULT"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "an RSA encryption key", key: awskmsfake.NewKey{KeySpec: "RSA_2048", KeyUsage: "ENCRYPT_DECRYPT"}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "a P-256 key asked for ECDSA_SHA_384", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P256"}, attr: "ECDSA_SHA_384", want: backends.ErrUnsupportedAlgorithm, wantPart: "signing-algorithm"},
		{name: "an Ed25519 key asked for Ed25519ph", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_EDWARDS25519"}, attr: "ED25519_PH_SHA_512", want: backends.ErrUnsupportedAlgorithm, wantPart: "signing-algorithm"},
		{name: "an unknown signing algorithm", key: awskmsfake.NewKey{KeySpec: "RSA_2048"}, attr: "RSASSA_PSS_SHA_1", want: backends.ErrUnsupportedAlgorithm, wantPart: "signing-algorithm"},
		{name: "an RSA key that does not list the PSS algorithm asked for", key: awskmsfake.NewKey{KeySpec: "RSA_2048", SigningAlgorithms: []string{"RSASSA_PKCS1_V1_5_SHA_256"}}, attr: "RSASSA_PSS_SHA_256", want: backends.ErrUnsupportedAlgorithm, wantPart: "signing-algorithm"},
		{name: "an RSA key that does not list the default algorithm", key: awskmsfake.NewKey{KeySpec: "RSA_2048", SigningAlgorithms: []string{"RSASSA_PSS_SHA_256"}}, want: backends.ErrUnsupportedAlgorithm, wantPart: "key-id"},
		{name: "a disabled key", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P256", KeyState: "Disabled"}, want: backends.ErrPermanent, wantPart: "key-id"},
		{name: "a key pending deletion", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P256", KeyState: "PendingDeletion"}, want: backends.ErrPermanent, wantPart: "key-id"},
		{name: "a key pending import", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P256", KeyState: "PendingImport"}, want: backends.ErrPermanent, wantPart: "key-id"},
		{name: "a multi-region key still being created (transient)", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P256", KeyState: "Creating"}, want: backends.ErrTransient, wantPart: "key-id"},
		{name: "a key in a disconnected key store (transient)", key: awskmsfake.NewKey{KeySpec: "ECC_NIST_P256", KeyState: "Unavailable"}, want: backends.ErrTransient, wantPart: "key-id"},
	}
	srv := startFake(t, awskmsfake.Options{ReuseKeyMaterial: true})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.key.Region = region
			k := addKey(t, srv, tt.key)
			attr := ""
			if tt.attr != "" {
				attr = ";signing-algorithm=" + tt.attr
			}
			before := srv.Calls(awskmsfake.GetPublicKey)
			s, err := p.Open(context.Background(), backends.OpenRequest{URI: keyURI(srv, k.ID, attr)})
			if err == nil {
				s.Close()
			}
			kmstest.CheckError(t, err, tt.want, tt.wantPart)
			if n := srv.Calls(awskmsfake.GetPublicKey) - before; n != 0 {
				t.Errorf("GetPublicKey called %d times for a key DescribeKey already ruled out", n)
			}
		})
	}
}

func TestOpenCallsDescribeKeyAndGetPublicKeyOnceAndSignsWithNoMore(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
	s := open(t, p, keyURI(srv, k.ID, ""))
	for i := range 3 {
		if _, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), fmt.Sprint(i)), s.Algorithm().SignerOpts()); err != nil {
			t.Fatal(err)
		}
	}
	if d, g, n := srv.Calls(awskmsfake.DescribeKey), srv.Calls(awskmsfake.GetPublicKey), srv.Calls(awskmsfake.Sign); d != 1 || g != 1 || n != 3 {
		t.Fatalf("DescribeKey, GetPublicKey, Sign called %d, %d, %d times; want 1, 1, 3", d, g, n)
	}
}

func TestOpenByAliasSignsWithTheKeyTheAliasNamedAtOpen(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256", Alias: "alias/keyward-ca"})
	s := open(t, p, "awskms:key-id=alias/keyward-ca;region="+region+"?endpoint="+srv.URL())
	if s.KeyVersion() != k.ARN {
		t.Errorf("KeyVersion() = %s, want %s", s.KeyVersion(), k.ARN)
	}
	if !strings.Contains(s.URI(), "key-id=alias/keyward-ca;") {
		t.Errorf("URI() = %s, want it to keep the alias", s.URI())
	}
	if _, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts()); err != nil {
		t.Fatal(err)
	}
	if got := lastSign(t, srv).KeyID; got != k.ARN {
		t.Errorf("Sign named %q, want the key ARN %q", got, k.ARN)
	}
}

func TestOpenByARNTakesTheRegionFromTheARN(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	k := addKey(t, srv, awskmsfake.NewKey{Region: "ap-southeast-2", KeySpec: "ECC_NIST_P256"})
	s := open(t, p, "awskms:key-id="+k.ARN+"?endpoint="+srv.URL())
	if !strings.Contains(s.URI(), ";region=ap-southeast-2") {
		t.Errorf("URI() = %s, want the ARN's region", s.URI())
	}
	if _, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts()); err != nil {
		t.Fatal(err)
	}
	if got := lastSign(t, srv).Region; got != "ap-southeast-2" {
		t.Errorf("Sign was signed for region %q, want ap-southeast-2", got)
	}
	again := open(t, p, s.URI())
	if again.Fingerprint() != s.Fingerprint() {
		t.Errorf("reopening %s gave another key", s.URI())
	}
}

func TestKeysInAnotherRegionAreNotFound(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	k := addKey(t, srv, awskmsfake.NewKey{Region: "us-east-1", KeySpec: "ECC_NIST_P256"})
	_, err := p.Open(context.Background(), backends.OpenRequest{URI: keyURI(srv, k.ID, "")})
	kmstest.CheckError(t, err, backends.ErrNotFound, "key-id")
}

func TestURIErrorsNameThePartAtFault(t *testing.T) {
	const arn = "arn:aws:kms:us-east-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	tests := []struct {
		name     string
		uri      string
		want     error
		wantPart string
	}{
		{name: "another scheme", uri: "gcpkms:projects/p", want: backends.ErrInvalidURI, wantPart: "scheme"},
		{name: "no attributes", uri: "awskms:", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "no key-id", uri: "awskms:region=eu-west-1", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "an empty key-id", uri: "awskms:key-id=;region=eu-west-1", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "a bare key id without attributes", uri: "awskms:1234abcd-12ab-34cd-56ef-1234567890ab", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "an alias without a name", uri: "awskms:key-id=alias/;region=eu-west-1", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "a key-id with a space", uri: "awskms:key-id=my%20key;region=eu-west-1", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "an ARN of another service", uri: "awskms:key-id=arn:aws:s3:::bucket;region=eu-west-1", want: backends.ErrInvalidURI, wantPart: "key-id"},
		{name: "an unknown attribute", uri: "awskms:key-id=k;region=eu-west-1;colour=blue", want: backends.ErrInvalidURI, wantPart: "colour"},
		{name: "an unknown query attribute", uri: "awskms:key-id=k;region=eu-west-1?profile=dev", want: backends.ErrInvalidURI, wantPart: "profile"},
		{name: "no region for a key id", uri: "awskms:key-id=1234abcd-12ab-34cd-56ef-1234567890ab", want: backends.ErrInvalidURI, wantPart: "region"},
		{name: "a malformed region", uri: "awskms:key-id=k;region=EU_WEST_1", want: backends.ErrInvalidURI, wantPart: "region"},
		{name: "a region that disagrees with the ARN", uri: "awskms:key-id=" + arn + ";region=eu-west-1", want: backends.ErrInvalidURI, wantPart: "region"},
		{name: "an endpoint that is not http(s)", uri: "awskms:key-id=k;region=eu-west-1?endpoint=ftp://127.0.0.1:1", want: backends.ErrInvalidURI, wantPart: "endpoint"},
		{name: "an endpoint with credentials", uri: "awskms:key-id=k;region=eu-west-1?endpoint=https://user:pw@kms.example", want: backends.ErrInvalidURI, wantPart: "endpoint"},
		{name: "a signing algorithm keyward does not use", uri: "awskms:key-id=k;region=eu-west-1;signing-algorithm=SM2DSA", want: backends.ErrUnsupportedAlgorithm, wantPart: "signing-algorithm"},
		{name: "an attribute given twice", uri: "awskms:key-id=k;key-id=j;region=eu-west-1", want: backends.ErrInvalidURI},
	}
	var loaded atomic.Bool
	p := newProvider(t, awskms.Options{LoadOptions: []func(*config.LoadOptions) error{func(*config.LoadOptions) error {
		loaded.Store(true)
		return nil
	}}})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.Open(context.Background(), backends.OpenRequest{URI: tt.uri})
			kmstest.CheckError(t, err, tt.want, tt.wantPart)
		})
	}
	if loaded.Load() {
		t.Error("a malformed URI made the provider load the AWS configuration")
	}
}

func TestNewValidatesOptionsAndDoesNoIO(t *testing.T) {
	for _, tc := range []struct {
		opts   awskms.Options
		option string
	}{
		{awskms.Options{CallTimeout: -time.Second}, "CallTimeout"},
		{awskms.Options{Retry: backends.RetryPolicy{MaxAttempts: -1}}, "Retry.MaxAttempts"},
		{awskms.Options{Retry: backends.RetryPolicy{BaseBackoff: time.Second, MaxBackoff: time.Millisecond}}, "Retry.MaxBackoff"},
	} {
		_, err := awskms.New(tc.opts)
		var oe *backends.OptionError
		if !errors.As(err, &oe) || oe.Option != tc.option {
			t.Errorf("New(%+v): got %v, want an *OptionError naming %s", tc.opts, err, tc.option)
		}
	}

	srv := startFake(t, awskmsfake.Options{})
	k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
	var loads atomic.Int32
	p, err := awskms.New(awskms.Options{LoadOptions: []func(*config.LoadOptions) error{
		config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider(awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey, "")),
		func(*config.LoadOptions) error { loads.Add(1); return nil },
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if n := loads.Load(); n != 0 || srv.Calls(awskmsfake.DescribeKey) != 0 {
		t.Fatalf("New loaded the configuration %d times or called KMS", n)
	}
	for range 2 {
		s := open(t, p, keyURI(srv, k.ID, ""))
		if _, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts()); err != nil {
			t.Fatal(err)
		}
	}
	if n := loads.Load(); n != 1 {
		t.Errorf("the default configuration was loaded %d times, want once", n)
	}
}

func TestCloseStopsSigners(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
	s := open(t, p, keyURI(srv, k.ID, ""))
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	_, err = p.Open(context.Background(), backends.OpenRequest{URI: keyURI(srv, k.ID, "")})
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	if n := srv.Calls(awskmsfake.Sign); n != 0 {
		t.Errorf("Sign called %d times after Close", n)
	}
}

// Helpers.

func startFake(tb testing.TB, opts awskmsfake.Options) *awskmsfake.Server {
	tb.Helper()
	srv := awskmsfake.Start(opts)
	tb.Cleanup(srv.Close)
	return srv
}

// newProvider makes a provider with the fake's static credentials, unless
// opts has a Config or LoadOptions.
func newProvider(tb testing.TB, opts awskms.Options) *awskms.Provider {
	tb.Helper()
	if opts.Config == nil && opts.LoadOptions == nil {
		opts.Config = &aws.Config{Credentials: credentials.NewStaticCredentialsProvider(awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey, "")}
	}
	p, err := awskms.New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	return p
}

// fastRetry retries n attempts in all with millisecond backoff.
func fastRetry(n int) backends.RetryPolicy {
	return backends.RetryPolicy{MaxAttempts: n, BaseBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}
}

func awsAlgorithm(tb testing.TB, alg backends.Algorithm) (keySpec, signing string) {
	a, ok := awsAlgorithms()[alg]
	if !ok {
		tb.Fatalf("no AWS KMS algorithm for %s", alg)
	}
	return a[0], a[1]
}

func addKey(tb testing.TB, srv *awskmsfake.Server, nk awskmsfake.NewKey) awskmsfake.Key {
	tb.Helper()
	k, err := srv.AddKey(nk)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// keyURI is the URI of key id in region, with attrs (";name=value…") added.
func keyURI(srv *awskmsfake.Server, id, attrs string) string {
	return "awskms:key-id=" + id + ";region=" + region + attrs + "?endpoint=" + srv.URL()
}

func open(tb testing.TB, p *awskms.Provider, uri string) backends.Signer {
	tb.Helper()
	s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
	if err != nil {
		tb.Fatalf("open %s: %v", uri, err)
	}
	tb.Cleanup(func() { s.Close() })
	return s
}

// openKey adds a key of alg to the fake and opens it.
func openKey(tb testing.TB, srv *awskmsfake.Server, p *awskms.Provider, alg backends.Algorithm) backends.Signer {
	tb.Helper()
	spec, signing := awsAlgorithm(tb, alg)
	k := addKey(tb, srv, awskmsfake.NewKey{Region: region, KeySpec: spec})
	return open(tb, p, keyURI(srv, k.ID, ";signing-algorithm="+signing))
}

func lastSign(tb testing.TB, srv *awskmsfake.Server) awskmsfake.SignRequest {
	tb.Helper()
	reqs := srv.SignRequests()
	if len(reqs) == 0 {
		tb.Fatal("the fake received no Sign request")
	}
	return reqs[len(reqs)-1]
}
