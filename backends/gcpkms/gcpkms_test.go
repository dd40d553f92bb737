package gcpkms_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/gcpkms"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const ring = "projects/keyward-test/locations/europe-west1/keyRings/ca"

// kmsAlgorithms is the test's own statement of which Cloud KMS algorithm
// each keyward algorithm is.
func kmsAlgorithms() map[backends.Algorithm]gcpkmsfake.Algorithm {
	return map[backends.Algorithm]gcpkmsfake.Algorithm{
		backends.ECDSAP256SHA256:    kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256,
		backends.ECDSAP384SHA384:    kmspb.CryptoKeyVersion_EC_SIGN_P384_SHA384,
		backends.Ed25519:            kmspb.CryptoKeyVersion_EC_SIGN_ED25519,
		backends.RSA2048PKCS1SHA256: kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_2048_SHA256,
		backends.RSA3072PKCS1SHA256: kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_3072_SHA256,
		backends.RSA4096PKCS1SHA256: kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_4096_SHA256,
		backends.RSA4096PKCS1SHA512: kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_4096_SHA512,
		backends.RSA2048PSSSHA256:   kmspb.CryptoKeyVersion_RSA_SIGN_PSS_2048_SHA256,
		backends.RSA3072PSSSHA256:   kmspb.CryptoKeyVersion_RSA_SIGN_PSS_3072_SHA256,
		backends.RSA4096PSSSHA256:   kmspb.CryptoKeyVersion_RSA_SIGN_PSS_4096_SHA256,
		backends.RSA4096PSSSHA512:   kmspb.CryptoKeyVersion_RSA_SIGN_PSS_4096_SHA512,
	}
}

func TestConformance(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{ReuseKeys: true})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3), PollInterval: time.Millisecond})
	unsupported := addKey(t, srv, "raw-pkcs1", kmspb.CryptoKeyVersion_RSA_SIGN_RAW_PKCS1_2048)
	var (
		mu      sync.Mutex
		created int
	)
	backendtest.Run(t, backendtest.Harness{
		Provider: p,
		KeyURI: func(t *testing.T, alg backends.Algorithm) string {
			return addKey(t, srv, "key-"+string(alg), kmsAlgorithm(t, alg))
		},
		MissingKeyURI:     "gcpkms:" + ring + "/cryptoKeys/missing/cryptoKeyVersions/1",
		UnsupportedKeyURI: unsupported,
		CreateURI: func(t *testing.T, alg backends.Algorithm) string {
			mu.Lock()
			created++
			name := fmt.Sprintf("%s/cryptoKeys/created-%d", ring, created)
			mu.Unlock()
			if err := srv.AddCryptoKey(name, kmsAlgorithm(t, alg)); err != nil {
				t.Fatal(err)
			}
			return "gcpkms:" + name
		},
		Algorithms: testAlgorithms(),
		Stall: func(*testing.T) func() {
			srv.SetLatency(time.Hour)
			return func() { srv.SetLatency(0) }
		},
	})
}

// testAlgorithms is every algorithm, but in -short runs only RSA-2048
// (RSA-4096 key generation takes seconds).
func testAlgorithms() []backends.Algorithm {
	if !testing.Short() {
		return nil
	}
	return []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.Ed25519,
		backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA256}
}

func TestProviderClaimsExactlyTheAlgorithmsCloudKMSOffers(t *testing.T) {
	p, err := gcpkms.New(gcpkms.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var want []backends.Algorithm
	for a := range kmsAlgorithms() {
		want = append(want, a)
	}
	slices.Sort(want)
	if got := p.Algorithms(); !slices.Equal(got, want) {
		t.Fatalf("Algorithms() = %v, want %v", got, want)
	}
	if p.Scheme() != "gcpkms" {
		t.Fatalf("Scheme() = %q", p.Scheme())
	}
}

func TestSignFailures(t *testing.T) {
	const attempts = 3
	tests := []struct {
		name      string
		fault     gcpkmsfake.Fault
		times     int   // gcpkmsfake.Always: every call
		want      error // nil: a good signature
		wantCalls int
		wantPart  string
	}{
		{name: "RESOURCE_EXHAUSTED twice, then a signature", fault: gcpkmsfake.Fault{Code: codes.ResourceExhausted}, times: 2, wantCalls: 3},
		{name: "UNAVAILABLE once, then a signature", fault: gcpkmsfake.Fault{Code: codes.Unavailable}, times: 1, wantCalls: 2},
		{name: "DEADLINE_EXCEEDED from the service once, then a signature", fault: gcpkmsfake.Fault{Code: codes.DeadlineExceeded}, times: 1, wantCalls: 2},
		{name: "INTERNAL once, then a signature", fault: gcpkmsfake.Fault{Code: codes.Internal}, times: 1, wantCalls: 2},
		{name: "ABORTED once, then a signature", fault: gcpkmsfake.Fault{Code: codes.Aborted}, times: 1, wantCalls: 2},
		{name: "a corrupted signature CRC32C once, then a good signature", fault: gcpkmsfake.Fault{CorruptChecksum: true}, times: 1, wantCalls: 2},
		{name: "a wrong signature once, then a good one", fault: gcpkmsfake.Fault{WrongSignature: true}, times: 1, wantCalls: 2},
		{name: "an unconfirmed digest CRC32C once, then a good signature", fault: gcpkmsfake.Fault{UnverifiedChecksum: true}, times: 1, wantCalls: 2},
		{name: "an answer naming another key version once, then a good one", fault: gcpkmsfake.Fault{WrongName: true}, times: 1, wantCalls: 2},
		{name: "a request refused twice for its CRC32C, then a signature", fault: gcpkmsfake.Fault{RefuseChecksum: true}, times: 2, wantCalls: 3},

		{name: "persistent RESOURCE_EXHAUSTED is transient after MaxAttempts", fault: gcpkmsfake.Fault{Code: codes.ResourceExhausted}, times: gcpkmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "persistent UNAVAILABLE is transient after MaxAttempts", fault: gcpkmsfake.Fault{Code: codes.Unavailable}, times: gcpkmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "persistent INTERNAL is transient after MaxAttempts", fault: gcpkmsfake.Fault{Code: codes.Internal}, times: gcpkmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "a persistently corrupted signature CRC32C is transient and no signature", fault: gcpkmsfake.Fault{CorruptChecksum: true}, times: gcpkmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "a persistently wrong signature with a correct CRC32C is caught by local verification", fault: gcpkmsfake.Fault{WrongSignature: true}, times: gcpkmsfake.Always, want: backends.ErrBadSignature, wantCalls: attempts},
		{name: "persistent answers naming another key version are transient", fault: gcpkmsfake.Fault{WrongName: true}, times: gcpkmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},

		{name: "PERMISSION_DENIED is permanent and not retried", fault: gcpkmsfake.Fault{Code: codes.PermissionDenied}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
		{name: "FAILED_PRECONDITION is permanent, not retried, and blames the version", fault: gcpkmsfake.Fault{Code: codes.FailedPrecondition}, times: 1, want: backends.ErrPermanent, wantCalls: 1, wantPart: "cryptoKeyVersions"},
		{name: "INVALID_ARGUMENT is permanent and not retried", fault: gcpkmsfake.Fault{Code: codes.InvalidArgument}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
		{name: "NOT_FOUND is ErrNotFound and not retried", fault: gcpkmsfake.Fault{Code: codes.NotFound}, times: 1, want: backends.ErrNotFound, wantCalls: 1, wantPart: "cryptoKeyVersions"},
	}
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(attempts)})
	for _, alg := range []backends.Algorithm{backends.ECDSAP256SHA256, backends.Ed25519} {
		s := openKey(t, srv, p, alg)
		for _, tt := range tests {
			t.Run(string(alg)+"/"+tt.name, func(t *testing.T) {
				srv.ClearFaults()
				defer srv.ClearFaults()
				srv.Inject(gcpkmsfake.AsymmetricSign, tt.fault, tt.times)
				before := srv.Calls(gcpkmsfake.AsymmetricSign)
				d := kmstest.Digest(alg, tt.name)
				sig, err := s.SignContext(context.Background(), d, alg.SignerOpts())
				if calls := srv.Calls(gcpkmsfake.AsymmetricSign) - before; calls != tt.wantCalls {
					t.Errorf("AsymmetricSign called %d times, want %d", calls, tt.wantCalls)
				}
				if tt.want == nil {
					if err != nil {
						t.Fatalf("SignContext: %v", err)
					}
					if err := backends.VerifySignature(s.Public(), alg, d, sig); err != nil {
						t.Fatalf("returned signature: %v", err)
					}
					return
				}
				if sig != nil {
					t.Errorf("SignContext returned a signature with error %v", err)
				}
				kmstest.CheckError(t, err, tt.want, tt.wantPart)
			})
		}
	}
}

// Cloud KMS refuses a request whose digest or data does not match its
// CRC32C with INVALID_ARGUMENT, and asks for a limited number of retries:
// three calls at most, however many attempts the policy allows, then the
// refusal is permanent. Any other INVALID_ARGUMENT is not retried.
func TestSignRetriesARefusedChecksumABoundedNumberOfTimes(t *testing.T) {
	const attempts = 6 // more than the checksum bound, which must win
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(attempts)})
	for _, alg := range []backends.Algorithm{backends.ECDSAP256SHA256, backends.Ed25519} {
		s := openKey(t, srv, p, alg)
		for _, tt := range []struct {
			name      string
			fault     gcpkmsfake.Fault
			wantCalls int
		}{
			{name: "a persistently refused checksum is permanent after three calls", fault: gcpkmsfake.Fault{RefuseChecksum: true}, wantCalls: 3},
			{name: "another INVALID_ARGUMENT is permanent after one call", fault: gcpkmsfake.Fault{Code: codes.InvalidArgument}, wantCalls: 1},
		} {
			t.Run(string(alg)+"/"+tt.name, func(t *testing.T) {
				srv.ClearFaults()
				defer srv.ClearFaults()
				srv.Inject(gcpkmsfake.AsymmetricSign, tt.fault, gcpkmsfake.Always)
				before := srv.Calls(gcpkmsfake.AsymmetricSign)
				sig, err := s.SignContext(context.Background(), kmstest.Digest(alg, tt.name), alg.SignerOpts())
				if calls := srv.Calls(gcpkmsfake.AsymmetricSign) - before; calls != tt.wantCalls {
					t.Errorf("AsymmetricSign called %d times, want %d", calls, tt.wantCalls)
				}
				if sig != nil {
					t.Errorf("SignContext returned a signature with error %v", err)
				}
				kmstest.CheckError(t, err, backends.ErrPermanent, "")
				if code := status.Code(err); code != codes.InvalidArgument {
					t.Errorf("status code %v, want %v: %v", code, codes.InvalidArgument, err)
				}
			})
		}
	}
}

func TestSignWithWrongDigestLengthIsPermanentAndSendsNothing(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP384SHA384)
	_, err := s.SignContext(context.Background(), make([]byte, 32), backends.ECDSAP384SHA384.SignerOpts())
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	if n := srv.Calls(gcpkmsfake.AsymmetricSign); n != 0 {
		t.Errorf("AsymmetricSign called %d times, want 0", n)
	}
}

func TestSignOnAVersionDisabledAfterOpenIsPermanent(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	if err := srv.SetState(s.KeyVersion(), kmspb.CryptoKeyVersion_DISABLED); err != nil {
		t.Fatal(err)
	}
	_, err := s.SignContext(context.Background(), kmstest.Digest(backends.ECDSAP256SHA256, "x"), backends.ECDSAP256SHA256.SignerOpts())
	kmstest.CheckError(t, err, backends.ErrPermanent, "cryptoKeyVersions")
	if n := srv.Calls(gcpkmsfake.AsymmetricSign); n != 1 {
		t.Errorf("AsymmetricSign called %d times, want 1", n)
	}
}

func TestSignSlowerThanCallTimeoutIsTransientDeadlineExceeded(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{CallTimeout: 100 * time.Millisecond, Retry: fastRetry(2)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.SetLatency(time.Minute)
	start := time.Now()
	_, err := s.SignContext(context.Background(), kmstest.Digest(backends.ECDSAP256SHA256, "slow"), backends.ECDSAP256SHA256.SignerOpts())
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if n := srv.Calls(gcpkmsfake.AsymmetricSign); n != 2 {
		t.Errorf("AsymmetricSign called %d times, want 2 (a timed-out call is retried)", n)
	}
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Errorf("SignContext took %v against a fake that answers after a minute: CallTimeout was not applied", elapsed)
	}
}

func TestSignCanceledWhileWaitingToRetryReturnsContextCanceled(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: backends.RetryPolicy{MaxAttempts: 5, BaseBackoff: time.Hour}})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.Inject(gcpkmsfake.AsymmetricSign, gcpkmsfake.Fault{Code: codes.Unavailable}, gcpkmsfake.Always)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for srv.Calls(gcpkmsfake.AsymmetricSign) < 1 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := s.SignContext(ctx, kmstest.Digest(backends.ECDSAP256SHA256, "x"), backends.ECDSAP256SHA256.SignerOpts())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if n := srv.Calls(gcpkmsfake.AsymmetricSign); n != 1 {
		t.Errorf("AsymmetricSign called %d times, want 1", n)
	}
}

func TestSignCanceledDuringACallReturnsContextCanceled(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.SetLatency(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for srv.Calls(gcpkmsfake.AsymmetricSign) < 1 {
			time.Sleep(time.Millisecond)
		}
		cancel()
	}()
	_, err := s.SignContext(ctx, kmstest.Digest(backends.ECDSAP256SHA256, "x"), backends.ECDSAP256SHA256.SignerOpts())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if n := srv.Calls(gcpkmsfake.AsymmetricSign); n != 1 {
		t.Errorf("AsymmetricSign called %d times, want 1 (no retry after cancellation)", n)
	}
}

func TestSignReturnsTheLastErrorWhenTheNextRetryWouldOutlastTheDeadline(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: backends.RetryPolicy{MaxAttempts: 5, BaseBackoff: time.Hour}})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.Inject(gcpkmsfake.AsymmetricSign, gcpkmsfake.Fault{Code: codes.Unavailable}, gcpkmsfake.Always)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := s.SignContext(ctx, kmstest.Digest(backends.ECDSAP256SHA256, "x"), backends.ECDSAP256SHA256.SignerOpts())
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v: it waited for the deadline instead of returning the UNAVAILABLE error", err)
	}
	if n := srv.Calls(gcpkmsfake.AsymmetricSign); n != 1 {
		t.Errorf("AsymmetricSign called %d times, want 1", n)
	}
}

func TestOpenFailures(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(t *testing.T, srv *gcpkmsfake.Server) string // returns the URI to open
		want     error
		wantPart string
		calls    int // GetPublicKey calls, if not 0
	}{
		{
			name: "a corrupted public key CRC32C once is retried",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				srv.Inject(gcpkmsfake.GetPublicKey, gcpkmsfake.Fault{CorruptChecksum: true}, 1)
				return uri
			},
			calls: 2,
		},
		{
			name: "UNAVAILABLE once is retried",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				srv.Inject(gcpkmsfake.GetPublicKey, gcpkmsfake.Fault{Code: codes.Unavailable}, 1)
				return uri
			},
			calls: 2,
		},
		{
			name: "a persistently corrupted public key CRC32C is transient",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				srv.Inject(gcpkmsfake.GetPublicKey, gcpkmsfake.Fault{CorruptChecksum: true}, gcpkmsfake.Always)
				return uri
			},
			want:  backends.ErrTransient,
			calls: 3,
		},
		{
			name: "public keys persistently naming another version are transient",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				srv.Inject(gcpkmsfake.GetPublicKey, gcpkmsfake.Fault{WrongName: true}, gcpkmsfake.Always)
				return uri
			},
			want:  backends.ErrTransient,
			calls: 3,
		},
		{
			name: "PERMISSION_DENIED is permanent",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				srv.Inject(gcpkmsfake.GetPublicKey, gcpkmsfake.Fault{Code: codes.PermissionDenied}, gcpkmsfake.Always)
				return uri
			},
			want:  backends.ErrPermanent,
			calls: 1,
		},
		{
			name: "a disabled version is permanent and blames the version",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				if err := srv.SetState(uri[len("gcpkms:"):], kmspb.CryptoKeyVersion_DISABLED); err != nil {
					t.Fatal(err)
				}
				return uri
			},
			want:     backends.ErrPermanent,
			wantPart: "cryptoKeyVersions",
		},
		{
			name: "a destroyed version is permanent and blames the version",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				if err := srv.SetState(uri[len("gcpkms:"):], kmspb.CryptoKeyVersion_DESTROYED); err != nil {
					t.Fatal(err)
				}
				return uri
			},
			want:     backends.ErrPermanent,
			wantPart: "cryptoKeyVersions",
		},
		{
			name: "a version still being generated is transient",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				srv.SetGeneration(1000, kmspb.CryptoKeyVersion_ENABLED) // polls keep it pending
				uri := addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
				if err := srv.SetState(uri[len("gcpkms:"):], kmspb.CryptoKeyVersion_PENDING_GENERATION); err != nil {
					t.Fatal(err)
				}
				return uri
			},
			want:     backends.ErrTransient,
			wantPart: "cryptoKeyVersions",
		},
		{
			name: "an HMAC key is ErrUnsupportedAlgorithm",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				return addKey(t, srv, "k", kmspb.CryptoKeyVersion_HMAC_SHA256)
			},
			want:     backends.ErrUnsupportedAlgorithm,
			wantPart: "cryptoKeyVersions",
		},
		{
			name: "a symmetric encryption key is ErrUnsupportedAlgorithm",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				return addKey(t, srv, "k", kmspb.CryptoKeyVersion_GOOGLE_SYMMETRIC_ENCRYPTION)
			},
			want:     backends.ErrUnsupportedAlgorithm,
			wantPart: "cryptoKeyVersions",
		},
		{
			name: "an RSA decryption key is ErrUnsupportedAlgorithm",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				return addKey(t, srv, "k", kmspb.CryptoKeyVersion_RSA_DECRYPT_OAEP_2048_SHA256)
			},
			want:     backends.ErrUnsupportedAlgorithm,
			wantPart: "cryptoKeyVersions",
		},
		{
			name: "a missing key version is ErrNotFound and blames the version",
			setup: func(t *testing.T, srv *gcpkmsfake.Server) string {
				return addKey(t, srv, "k", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256) + "0"
			},
			want:     backends.ErrNotFound,
			wantPart: "cryptoKeyVersions",
			calls:    1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startFake(t, gcpkmsfake.Options{})
			p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3)})
			uri := tt.setup(t, srv)
			s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
			if tt.calls != 0 {
				if n := srv.Calls(gcpkmsfake.GetPublicKey); n != tt.calls {
					t.Errorf("GetPublicKey called %d times, want %d", n, tt.calls)
				}
			}
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				if s.URI() != uri || s.KeyVersion() != uri[len("gcpkms:"):] {
					t.Errorf("URI() = %q, KeyVersion() = %q, want %q and its resource name", s.URI(), s.KeyVersion(), uri)
				}
				return
			}
			kmstest.CheckError(t, err, tt.want, tt.wantPart)
		})
	}
}

func TestCreateKeyWaitsWhileTheNewVersionIsPendingGeneration(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3), PollInterval: time.Millisecond})
	key := ring + "/cryptoKeys/rotating"
	if err := srv.AddCryptoKey(key, kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256); err != nil {
		t.Fatal(err)
	}
	srv.SetGeneration(3, kmspb.CryptoKeyVersion_ENABLED)
	s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "gcpkms:" + key, Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatalf("CreateKey: %v", err)
	}
	if n := srv.Calls(gcpkmsfake.GetCryptoKeyVersion); n != 4 {
		t.Errorf("GetCryptoKeyVersion called %d times, want 4 (3 answers PENDING_GENERATION, then ENABLED)", n)
	}
	if want := "gcpkms:" + key + "/cryptoKeyVersions/1"; s.URI() != want {
		t.Errorf("URI() = %q, want %q", s.URI(), want)
	}
	d := kmstest.Digest(backends.ECDSAP256SHA256, "new key")
	sig, err := s.SignContext(context.Background(), d, backends.ECDSAP256SHA256.SignerOpts())
	if err != nil {
		t.Fatal(err)
	}
	if err := backends.VerifySignature(s.Public(), s.Algorithm(), d, sig); err != nil {
		t.Fatal(err)
	}

	next, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "gcpkms:" + key, Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatalf("second CreateKey: %v", err)
	}
	if want := "gcpkms:" + key + "/cryptoKeyVersions/2"; next.URI() != want || next.Fingerprint() == s.Fingerprint() {
		t.Errorf("second key: URI %q fingerprint %s, want %q and a fingerprint other than %s", next.URI(), next.Fingerprint(), want, s.Fingerprint())
	}
}

func TestCreateKeyFailures(t *testing.T) {
	tests := []struct {
		name      string
		keyAlg    gcpkmsfake.Algorithm // 0: no crypto key
		alg       backends.Algorithm
		setup     func(srv *gcpkmsfake.Server)
		timeout   time.Duration
		want      error // nil: success
		wantPart  string
		wantURI   string // the error's URI, if set
		wantCalls int    // CreateCryptoKeyVersion calls
	}{
		{
			name:   "a crypto key of another algorithm is ErrUnsupportedAlgorithm and gets no version",
			keyAlg: kmspb.CryptoKeyVersion_EC_SIGN_P384_SHA384, alg: backends.ECDSAP256SHA256,
			want: backends.ErrUnsupportedAlgorithm, wantPart: "cryptoKeys", wantCalls: 0,
		},
		{
			name:   "a decryption key is ErrUnsupportedAlgorithm and gets no version",
			keyAlg: kmspb.CryptoKeyVersion_RSA_DECRYPT_OAEP_2048_SHA256, alg: backends.RSA2048PKCS1SHA256,
			want: backends.ErrUnsupportedAlgorithm, wantPart: "cryptoKeys", wantCalls: 0,
		},
		{
			name:   "an algorithm Cloud KMS does not offer is ErrUnsupportedAlgorithm",
			keyAlg: kmspb.CryptoKeyVersion_RSA_SIGN_PSS_2048_SHA256, alg: backends.RSA2048PSSSHA512,
			want: backends.ErrUnsupportedAlgorithm, wantCalls: 0,
		},
		{
			name: "a missing crypto key is ErrNotFound and blames the crypto key",
			alg:  backends.ECDSAP256SHA256,
			want: backends.ErrNotFound, wantPart: "cryptoKeys", wantCalls: 0,
		},
		{
			name:   "a version whose generation failed is permanent and names the new version",
			keyAlg: kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256, alg: backends.ECDSAP256SHA256,
			setup: func(srv *gcpkmsfake.Server) { srv.SetGeneration(1, kmspb.CryptoKeyVersion_GENERATION_FAILED) },
			want:  backends.ErrPermanent, wantPart: "cryptoKeyVersions", wantURI: "gcpkms:" + ring + "/cryptoKeys/k/cryptoKeyVersions/1", wantCalls: 1,
		},
		{
			name:   "the context ending while the version is pending is transient and wraps its error",
			keyAlg: kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256, alg: backends.ECDSAP256SHA256,
			setup:   func(srv *gcpkmsfake.Server) { srv.SetGeneration(1<<30, kmspb.CryptoKeyVersion_ENABLED) },
			timeout: 300 * time.Millisecond,
			want:    context.DeadlineExceeded, wantCalls: 1,
		},
		{
			name:   "RESOURCE_EXHAUSTED creating the version is retried",
			keyAlg: kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256, alg: backends.ECDSAP256SHA256,
			setup: func(srv *gcpkmsfake.Server) {
				srv.Inject(gcpkmsfake.CreateCryptoKeyVersion, gcpkmsfake.Fault{Code: codes.ResourceExhausted}, 1)
			},
			wantCalls: 2,
		},
		{
			name:   "UNAVAILABLE creating the version is not retried, lest it create two",
			keyAlg: kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256, alg: backends.ECDSAP256SHA256,
			setup: func(srv *gcpkmsfake.Server) {
				srv.Inject(gcpkmsfake.CreateCryptoKeyVersion, gcpkmsfake.Fault{Code: codes.Unavailable}, 1)
			},
			want: backends.ErrTransient, wantCalls: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startFake(t, gcpkmsfake.Options{})
			p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3), PollInterval: time.Millisecond})
			key := ring + "/cryptoKeys/k"
			if tt.keyAlg != 0 {
				if err := srv.AddCryptoKey(key, tt.keyAlg); err != nil {
					t.Fatal(err)
				}
			}
			if tt.setup != nil {
				tt.setup(srv)
			}
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			s, err := p.CreateKey(ctx, backends.CreateKeyRequest{URI: "gcpkms:" + key, Algorithm: tt.alg})
			if n := srv.Calls(gcpkmsfake.CreateCryptoKeyVersion); n != tt.wantCalls {
				t.Errorf("CreateCryptoKeyVersion called %d times, want %d", n, tt.wantCalls)
			}
			if tt.want == nil {
				if err != nil {
					t.Fatalf("CreateKey: %v", err)
				}
				if s.Algorithm() != tt.alg {
					t.Errorf("Algorithm() = %s, want %s", s.Algorithm(), tt.alg)
				}
				return
			}
			if tt.want == context.DeadlineExceeded {
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("got %v, want an error wrapping context.DeadlineExceeded", err)
				}
				kmstest.CheckError(t, err, backends.ErrTransient, tt.wantPart)
				return
			}
			kmstest.CheckError(t, err, tt.want, tt.wantPart)
			var be *backends.Error
			if tt.wantURI != "" && errors.As(err, &be) && be.URI != tt.wantURI {
				t.Errorf("error's URI is %q, want %q", be.URI, tt.wantURI)
			}
		})
	}
}

func TestURIErrorsNameThePart(t *testing.T) {
	key := "gcpkms:" + ring + "/cryptoKeys/k"
	tests := []struct {
		name     string
		create   bool // CreateKey instead of Open
		uri      string
		want     error
		wantPart string
	}{
		{name: "another scheme", uri: "cloudkms:" + ring + "/cryptoKeys/k/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "scheme"},
		{name: "no pinned version", uri: key, want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "a version ID that is not a number", uri: key + "/cryptoKeyVersions/latest", want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "version zero", uri: key + "/cryptoKeyVersions/0", want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "a version with a leading zero", uri: key + "/cryptoKeyVersions/01", want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "a trailing collection after the version", uri: key + "/cryptoKeyVersions/1/extra", want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "an empty version ID", uri: key + "/cryptoKeyVersions/", want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "keyrings in lower case", uri: "gcpkms:projects/p/locations/global/keyrings/r/cryptoKeys/k/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "keyRings"},
		{name: "an empty project ID", uri: "gcpkms:projects//locations/global/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "projects"},
		{name: "a leading slash", uri: "gcpkms:/" + ring + "/cryptoKeys/k/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "projects"},
		{name: "a name ending at the project", uri: "gcpkms:projects/p", want: backends.ErrInvalidURI, wantPart: "locations"},
		{name: "a name ending at the key ring", uri: "gcpkms:" + ring, want: backends.ErrInvalidURI, wantPart: "cryptoKeys"},
		{name: "a crypto key ID with a dot", uri: "gcpkms:" + ring + "/cryptoKeys/a.b/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "cryptoKeys"},
		{name: "a key ring ID of 64 characters", uri: "gcpkms:projects/p/locations/l/keyRings/" + fmt.Sprintf("%064d", 0) + "/cryptoKeys/k/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "keyRings"},
		{name: "an attribute", uri: key + "/cryptoKeyVersions/1?algorithm=ed25519", want: backends.ErrInvalidURI, wantPart: "algorithm"},
		{name: "name=value attributes instead of a name", uri: "gcpkms:projects=p;locations=l", want: backends.ErrInvalidURI, wantPart: "projects"},
		{name: "a malformed query", uri: key + "/cryptoKeyVersions/1?nonsense", want: backends.ErrInvalidURI, wantPart: "query"},
		{name: "a well-formed URI of a missing key is not a URI error", uri: key + "/cryptoKeyVersions/7", want: backends.ErrNotFound, wantPart: "cryptoKeyVersions"},
		{name: "a domain-scoped project is well-formed", uri: "gcpkms:projects/example.com:ca/locations/global/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", want: backends.ErrNotFound, wantPart: "cryptoKeyVersions"},

		{name: "creating a key from a version URI", create: true, uri: key + "/cryptoKeyVersions/1", want: backends.ErrInvalidURI, wantPart: "cryptoKeyVersions"},
		{name: "creating a key from a key ring URI", create: true, uri: "gcpkms:" + ring, want: backends.ErrInvalidURI, wantPart: "cryptoKeys"},
		{name: "creating a key in another scheme", create: true, uri: "file:/tmp/k.pem", want: backends.ErrInvalidURI, wantPart: "scheme"},
	}
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(1)})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var err error
			if tt.create {
				_, err = p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: tt.uri, Algorithm: backends.ECDSAP256SHA256})
			} else {
				_, err = p.Open(context.Background(), backends.OpenRequest{URI: tt.uri})
			}
			kmstest.CheckError(t, err, tt.want, tt.wantPart)
		})
	}
	if n := srv.Calls(gcpkmsfake.GetPublicKey) + srv.Calls(gcpkmsfake.GetCryptoKey); n != 2 {
		t.Errorf("the fake saw %d calls, want 2 (only the well-formed URIs reach it)", n)
	}
}

func TestNewRefusesInvalidOptions(t *testing.T) {
	tests := []struct {
		name   string
		opts   gcpkms.Options
		option string
	}{
		{"a negative CallTimeout", gcpkms.Options{CallTimeout: -time.Second}, "CallTimeout"},
		{"a negative PollInterval", gcpkms.Options{PollInterval: -time.Second}, "PollInterval"},
		{"a negative MaxAttempts", gcpkms.Options{Retry: backends.RetryPolicy{MaxAttempts: -1}}, "Retry.MaxAttempts"},
		{"a negative BaseBackoff", gcpkms.Options{Retry: backends.RetryPolicy{BaseBackoff: -time.Second}}, "Retry.BaseBackoff"},
		{"a MaxBackoff shorter than BaseBackoff", gcpkms.Options{Retry: backends.RetryPolicy{BaseBackoff: time.Second, MaxBackoff: time.Millisecond}}, "Retry.MaxBackoff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := gcpkms.New(tt.opts)
			var oe *backends.OptionError
			if !errors.As(err, &oe) || oe.Option != tt.option {
				t.Fatalf("got %v, want an *OptionError naming %s", err, tt.option)
			}
		})
	}
}

func TestAClosedProviderRefusesToOpenAndSign(t *testing.T) {
	srv := startFake(t, gcpkmsfake.Options{})
	p := newProvider(t, srv, gcpkms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := s.SignContext(context.Background(), kmstest.Digest(backends.ECDSAP256SHA256, "x"), backends.ECDSAP256SHA256.SignerOpts())
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	_, err = p.Open(context.Background(), backends.OpenRequest{URI: s.URI()})
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func startFake(t testing.TB, opts gcpkmsfake.Options) *gcpkmsfake.Server {
	t.Helper()
	srv, err := gcpkmsfake.Start(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	return srv
}

func newProvider(t testing.TB, srv *gcpkmsfake.Server, opts gcpkms.Options) *gcpkms.Provider {
	t.Helper()
	opts.ClientOptions = srv.ClientOptions()
	p, err := gcpkms.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// fastRetry allows attempts calls with waits of a few milliseconds.
func fastRetry(attempts int) backends.RetryPolicy {
	return backends.RetryPolicy{MaxAttempts: attempts, BaseBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond}
}

func kmsAlgorithm(t testing.TB, alg backends.Algorithm) gcpkmsfake.Algorithm {
	t.Helper()
	a, ok := kmsAlgorithms()[alg]
	if !ok {
		t.Fatalf("Cloud KMS has no %s", alg)
	}
	return a
}

// addKey adds crypto key id with one ENABLED version and returns the
// version's URI.
func addKey(t testing.TB, srv *gcpkmsfake.Server, id string, alg gcpkmsfake.Algorithm) string {
	t.Helper()
	name := ring + "/cryptoKeys/" + id
	if err := srv.AddCryptoKey(name, alg); err != nil {
		t.Fatal(err)
	}
	v, err := srv.AddVersion(name)
	if err != nil {
		t.Fatal(err)
	}
	return "gcpkms:" + v
}

// openKey adds a key of alg and opens it.
func openKey(t testing.TB, srv *gcpkmsfake.Server, p *gcpkms.Provider, alg backends.Algorithm) backends.Signer {
	t.Helper()
	uri := addKey(t, srv, "key-"+string(alg), kmsAlgorithm(t, alg))
	s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
	if err != nil {
		t.Fatalf("open %s: %v", uri, err)
	}
	return s
}
