package awskms_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/awskms"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
)

func TestCreateKeyMakesASignVerifyKeyOfTheAlgorithmsKeySpec(t *testing.T) {
	algs := []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.Ed25519,
		backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA384}
	srv := startFake(t, awskmsfake.Options{ReuseKeyMaterial: true})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
				URI:       "awskms:region=" + region + ";description=keyward%20CA%202026?endpoint=" + srv.URL(),
				Algorithm: alg,
			})
			if err != nil {
				t.Fatal(err)
			}
			spec, signing := awsAlgorithm(t, alg)
			reqs := srv.CreateKeyRequests()
			got := reqs[len(reqs)-1]
			if want := (awskmsfake.CreateKeyRequest{Region: region, KeySpec: spec, KeyUsage: "SIGN_VERIFY", Description: "keyward CA 2026"}); got != want {
				t.Errorf("KMS received CreateKey %+v, want %+v", got, want)
			}
			if s.Algorithm() != alg {
				t.Errorf("Algorithm() = %s, want %s", s.Algorithm(), alg)
			}
			id := s.KeyVersion()[strings.LastIndex(s.KeyVersion(), "/")+1:]
			if !strings.HasPrefix(s.URI(), "awskms:key-id="+id+";region="+region+";signing-algorithm="+signing+"?endpoint=") {
				t.Errorf("URI() = %s, want it to name the new key %s, the region and %s", s.URI(), id, signing)
			}
			if strings.Contains(s.URI(), "description") {
				t.Errorf("URI() = %s names the description", s.URI())
			}
			d := kmstest.Digest(alg, "created")
			sig, err := s.SignContext(context.Background(), d, alg.SignerOpts())
			if err != nil {
				t.Fatal(err)
			}
			if err := backends.VerifySignature(s.Public(), alg, d, sig); err != nil {
				t.Fatal(err)
			}
			if req := lastSign(t, srv); req.SigningAlgorithm != signing {
				t.Errorf("Sign used %s, want %s", req.SigningAlgorithm, signing)
			}
		})
	}
}

func TestCreateKeyRefusesAlgorithmsAWSKMSDoesNotMake(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	for _, alg := range []backends.Algorithm{"ecdsa-p521-sha512", "rsa-1024-pkcs1-sha256", ""} {
		_, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "awskms:region=" + region + "?endpoint=" + srv.URL(), Algorithm: alg})
		kmstest.CheckError(t, err, backends.ErrUnsupportedAlgorithm, "")
	}
	if n := srv.Calls(awskmsfake.CreateKey); n != 0 {
		t.Errorf("CreateKey called %d times, want 0", n)
	}
}

func TestCreateKeyRetriesOnlyWhatMadeNoKey(t *testing.T) {
	tests := []struct {
		name      string
		fault     awskmsfake.Fault
		times     int
		latency   time.Duration
		want      error
		wantCalls int
	}{
		{name: "ThrottlingException twice, then a key", fault: awskmsfake.Fault{Code: "ThrottlingException"}, times: 2, wantCalls: 3},
		{name: "KMSInternalException is transient and not retried", fault: awskmsfake.Fault{Code: "KMSInternalException"}, times: 1, want: backends.ErrTransient, wantCalls: 1},
		{name: "a non-JSON 503 is transient and not retried", fault: awskmsfake.Fault{Status: 503}, times: 1, want: backends.ErrTransient, wantCalls: 1},
		{name: "a call that times out is transient and not retried", latency: time.Minute, want: backends.ErrTransient, wantCalls: 1},
		{name: "LimitExceededException (too many keys) is permanent", fault: awskmsfake.Fault{Code: "LimitExceededException"}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := startFake(t, awskmsfake.Options{})
			p := newProvider(t, awskms.Options{CallTimeout: 500 * time.Millisecond, Retry: fastRetry(3)})
			srv.Inject(awskmsfake.CreateKey, tt.fault, tt.times)
			srv.SetLatency(tt.latency)
			s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "awskms:region=" + region + "?endpoint=" + srv.URL(), Algorithm: backends.ECDSAP256SHA256})
			if n := srv.Calls(awskmsfake.CreateKey); n != tt.wantCalls {
				t.Errorf("CreateKey called %d times, want %d", n, tt.wantCalls)
			}
			if tt.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
				return
			}
			kmstest.CheckError(t, err, tt.want, "")
		})
	}
}

func TestCreateKeyWaitsForTheNewKeyToBeVisible(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	srv.Inject(awskmsfake.GetPublicKey, awskmsfake.Fault{Code: "NotFoundException"}, 2)
	s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "awskms:region=" + region + "?endpoint=" + srv.URL(), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if n := srv.Calls(awskmsfake.GetPublicKey); n != 3 {
		t.Errorf("GetPublicKey called %d times, want 3", n)
	}
}

func TestCreateKeyWhoseKeyStaysInvisibleIsTransientAndNamesTheKey(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	srv.Inject(awskmsfake.GetPublicKey, awskmsfake.Fault{Code: "NotFoundException"}, awskmsfake.Always)
	_, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: "awskms:region=" + region + "?endpoint=" + srv.URL(), Algorithm: backends.ECDSAP256SHA256})
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if errors.Is(err, backends.ErrNotFound) {
		t.Errorf("got %v, which is also ErrNotFound (permanent)", err)
	}
	var be *backends.Error
	if errors.As(err, &be); !strings.HasPrefix(be.URI, "awskms:key-id=") {
		t.Errorf("error URI %q does not name the new key", be.URI)
	}
}

func TestCreateKeyURIErrorsNameThePartAtFault(t *testing.T) {
	tests := []struct {
		name     string
		uri      string
		wantPart string
	}{
		{name: "a key-id", uri: "awskms:key-id=k;region=eu-west-1", wantPart: "key-id"},
		{name: "no region", uri: "awskms:description=ca", wantPart: "region"},
		{name: "a signing algorithm", uri: "awskms:region=eu-west-1;signing-algorithm=RSASSA_PSS_SHA_256", wantPart: "signing-algorithm"},
		{name: "an unknown attribute", uri: "awskms:region=eu-west-1;alias=alias/ca", wantPart: "alias"},
		{name: "a bad endpoint", uri: "awskms:region=eu-west-1?endpoint=127.0.0.1:80", wantPart: "endpoint"},
	}
	p := newProvider(t, awskms.Options{})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: tt.uri, Algorithm: backends.ECDSAP256SHA256})
			kmstest.CheckError(t, err, backends.ErrInvalidURI, tt.wantPart)
		})
	}
}
