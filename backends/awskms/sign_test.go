package awskms_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/awskms"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
)

func TestSignFailures(t *testing.T) {
	const attempts = 3
	tests := []struct {
		name      string
		fault     awskmsfake.Fault
		times     int   // awskmsfake.Always: every call
		want      error // nil: a good signature
		wantCalls int
		wantPart  string
	}{
		{name: "ThrottlingException twice, then a signature", fault: awskmsfake.Fault{Code: "ThrottlingException"}, times: 2, wantCalls: 3},
		{name: "KMSInternalException (500) once, then a signature", fault: awskmsfake.Fault{Code: "KMSInternalException"}, times: 1, wantCalls: 2},
		{name: "KeyUnavailableException (500) once, then a signature", fault: awskmsfake.Fault{Code: "KeyUnavailableException"}, times: 1, wantCalls: 2},
		{name: "DependencyTimeoutException (503) once, then a signature", fault: awskmsfake.Fault{Code: "DependencyTimeoutException"}, times: 1, wantCalls: 2},
		{name: "a non-JSON 502 from a load balancer once, then a signature", fault: awskmsfake.Fault{Status: http.StatusBadGateway}, times: 1, wantCalls: 2},
		{name: "ThrottlingException sent with HTTP 429 once, then a signature", fault: awskmsfake.Fault{Code: "ThrottlingException", Status: http.StatusTooManyRequests}, times: 1, wantCalls: 2},

		{name: "persistent ThrottlingException is transient after MaxAttempts", fault: awskmsfake.Fault{Code: "ThrottlingException"}, times: awskmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "persistent KMSInternalException is transient after MaxAttempts", fault: awskmsfake.Fault{Code: "KMSInternalException"}, times: awskmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "persistent KeyUnavailableException is transient after MaxAttempts", fault: awskmsfake.Fault{Code: "KeyUnavailableException"}, times: awskmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "a persistent non-JSON 503 is transient after MaxAttempts", fault: awskmsfake.Fault{Status: http.StatusServiceUnavailable}, times: awskmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},
		{name: "an unknown 5xx error code is transient", fault: awskmsfake.Fault{Code: "SomethingNewException", Status: http.StatusInternalServerError}, times: awskmsfake.Always, want: backends.ErrTransient, wantCalls: attempts},

		{name: "NotFoundException is ErrNotFound, not retried, and blames the key", fault: awskmsfake.Fault{Code: "NotFoundException"}, times: 1, want: backends.ErrNotFound, wantCalls: 1, wantPart: "key-id"},
		{name: "DisabledException is permanent, not retried, and blames the key", fault: awskmsfake.Fault{Code: "DisabledException"}, times: 1, want: backends.ErrPermanent, wantCalls: 1, wantPart: "key-id"},
		{name: "KMSInvalidStateException is permanent, not retried, and blames the key", fault: awskmsfake.Fault{Code: "KMSInvalidStateException"}, times: 1, want: backends.ErrPermanent, wantCalls: 1, wantPart: "key-id"},
		{name: "AccessDeniedException is permanent and not retried", fault: awskmsfake.Fault{Code: "AccessDeniedException"}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
		{name: "InvalidKeyUsageException is ErrUnsupportedAlgorithm and blames the signing algorithm", fault: awskmsfake.Fault{Code: "InvalidKeyUsageException"}, times: 1, want: backends.ErrUnsupportedAlgorithm, wantCalls: 1, wantPart: "signing-algorithm"},
		{name: "ValidationException is permanent and not retried", fault: awskmsfake.Fault{Code: "ValidationException"}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
		{name: "an unknown 4xx error code is permanent and not retried", fault: awskmsfake.Fault{Code: "SomethingNewException"}, times: 1, want: backends.ErrPermanent, wantCalls: 1},

		{name: "a wrong signature is caught by local verification and not returned", fault: awskmsfake.Fault{WrongSignature: true}, times: 1, want: backends.ErrBadSignature, wantCalls: 1},
		{name: "a signature by another key is not returned", fault: awskmsfake.Fault{WrongKeyID: true}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
		{name: "a signature with another algorithm is not returned", fault: awskmsfake.Fault{WrongAlgorithm: true}, times: 1, want: backends.ErrPermanent, wantCalls: 1},
	}
	srv := startFake(t, awskmsfake.Options{ReuseKeyMaterial: true})
	p := newProvider(t, awskms.Options{Retry: fastRetry(attempts)})
	algs := []backends.Algorithm{backends.ECDSAP256SHA256, backends.Ed25519}
	if !testing.Short() {
		algs = append(algs, backends.RSA2048PSSSHA256)
	}
	for _, alg := range algs {
		s := openKey(t, srv, p, alg)
		for _, tt := range tests {
			t.Run(string(alg)+"/"+tt.name, func(t *testing.T) {
				srv.ClearFaults()
				defer srv.ClearFaults()
				srv.Inject(awskmsfake.Sign, tt.fault, tt.times)
				before := srv.Calls(awskmsfake.Sign)
				d := kmstest.Digest(alg, tt.name)
				sig, err := s.SignContext(context.Background(), d, alg.SignerOpts())
				if calls := srv.Calls(awskmsfake.Sign) - before; calls != tt.wantCalls {
					t.Errorf("Sign called %d times, want %d", calls, tt.wantCalls)
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

func TestAWrongSignatureIsPermanentAndWrapsErrBadSignature(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.Inject(awskmsfake.Sign, awskmsfake.Fault{WrongSignature: true}, awskmsfake.Always)
	sig, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
	if sig != nil {
		t.Errorf("got a signature that does not verify: %x", sig)
	}
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	if !errors.Is(err, backends.ErrBadSignature) {
		t.Errorf("got %v, want an error wrapping backends.ErrBadSignature", err)
	}
}

func TestSignOnAKeyDisabledAfterOpenIsPermanent(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
	s := open(t, p, keyURI(srv, k.ID, ""))
	for _, state := range []string{"Disabled", "PendingDeletion"} {
		if err := srv.SetKeyState(k.ID, state); err != nil {
			t.Fatal(err)
		}
		before := srv.Calls(awskmsfake.Sign)
		_, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
		kmstest.CheckError(t, err, backends.ErrPermanent, "key-id")
		if n := srv.Calls(awskmsfake.Sign) - before; n != 1 {
			t.Errorf("%s: Sign called %d times, want 1", state, n)
		}
	}
}

func TestSignSlowerThanCallTimeoutIsTransientDeadlineExceeded(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{CallTimeout: 500 * time.Millisecond, Retry: fastRetry(2)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.SetLatency(time.Minute)
	start := time.Now()
	_, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "slow"), s.Algorithm().SignerOpts())
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want an error wrapping context.DeadlineExceeded", err)
	}
	if n := srv.Calls(awskmsfake.Sign); n != 2 {
		t.Errorf("Sign called %d times, want 2 (an attempt that timed out is retried)", n)
	}
	if elapsed := time.Since(start); elapsed > 30*time.Second {
		t.Errorf("SignContext took %v against a fake that answers after a minute: CallTimeout was not applied", elapsed)
	}
}

func TestSignWithinACallersDeadlineShorterThanCallTimeoutIsNotRetried(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.SetLatency(time.Minute)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := s.SignContext(ctx, kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("got %v, want context.DeadlineExceeded", err)
	}
	if n := srv.Calls(awskmsfake.Sign); n > 1 {
		t.Errorf("Sign called %d times after the caller's deadline, want at most 1", n)
	}
}

func TestSignCanceledDuringACallReturnsContextCanceled(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: fastRetry(3)})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.SetLatency(time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cancelAfterCalls(ctx, cancel, srv, awskmsfake.Sign, 1)
	_, err := s.SignContext(ctx, kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if n := srv.Calls(awskmsfake.Sign); n != 1 {
		t.Errorf("Sign called %d times, want 1 (no retry after cancellation)", n)
	}
}

func TestSignCanceledWhileWaitingToRetryReturnsContextCanceled(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{Retry: backends.RetryPolicy{MaxAttempts: 5, BaseBackoff: time.Hour}})
	s := openKey(t, srv, p, backends.ECDSAP256SHA256)
	srv.Inject(awskmsfake.Sign, awskmsfake.Fault{Code: "ThrottlingException"}, awskmsfake.Always)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cancelAfterCalls(ctx, cancel, srv, awskmsfake.Sign, 1)
	_, err := s.SignContext(ctx, kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	if n := srv.Calls(awskmsfake.Sign); n != 1 {
		t.Errorf("Sign called %d times, want 1", n)
	}
}

func TestSignWithADigestOfTheWrongLengthIsPermanentAndSendsNothing(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{})
	p := newProvider(t, awskms.Options{})
	s := openKey(t, srv, p, backends.ECDSAP384SHA384)
	_, err := s.SignContext(context.Background(), make([]byte, 32), s.Algorithm().SignerOpts())
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	e := openKey(t, srv, p, backends.Ed25519)
	_, err = e.SignContext(context.Background(), make([]byte, 4097), e.Algorithm().SignerOpts())
	kmstest.CheckError(t, err, backends.ErrPermanent, "")
	if n := srv.Calls(awskmsfake.Sign); n != 0 {
		t.Errorf("Sign called %d times, want 0", n)
	}
}

// cancelAfterCalls cancels once the fake has received n calls of action.
func cancelAfterCalls(ctx context.Context, cancel context.CancelFunc, srv *awskmsfake.Server, action string, n int) {
	for srv.Calls(action) < n {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Millisecond):
		}
	}
	cancel()
}

// The fake's account quota (Options.SignRate) refuses Sign calls beyond
// its bucket with ThrottlingException, records only the calls it signed,
// and refills at its rate: what BenchmarkKMSQuota throttles issuance with.
func TestFakeSignQuotaThrottles(t *testing.T) {
	srv := startFake(t, awskmsfake.Options{SignRate: 20, SignBurst: 5})
	p := newProvider(t, awskms.Options{Retry: fastRetry(1)})
	k := addKey(t, srv, awskmsfake.NewKey{Region: region, KeySpec: "ECC_NIST_P256"})
	s := open(t, p, keyURI(srv, k.ID, ""))
	sign := func() error {
		_, err := s.SignContext(context.Background(), kmstest.Digest(s.Algorithm(), "x"), s.Algorithm().SignerOpts())
		return err
	}
	ok := 0
	for range 10 {
		if sign() == nil {
			ok++
		}
	}
	// The burst of 5, and perhaps one more refilled meanwhile.
	if ok < 5 || ok > 6 {
		t.Errorf("%d of 10 back-to-back signatures passed a quota of burst 5, want 5 or 6", ok)
	}
	if got := srv.Throttled(); got != uint64(10-ok) {
		t.Errorf("Throttled() = %d, want %d", got, 10-ok)
	}
	if got := len(srv.SignRequests()); got != ok {
		t.Errorf("SignRequests() has %d, want the %d signed", got, ok)
	}
	err := sign()
	for err == nil {
		err = sign()
	}
	kmstest.CheckError(t, err, backends.ErrTransient, "")
	time.Sleep(200 * time.Millisecond) // 4 tokens at 20/s
	if err := sign(); err != nil {
		t.Errorf("after a refill: %v", err)
	}
}
