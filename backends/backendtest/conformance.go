// Package backendtest is the conformance suite every keyward key backend
// passes, for every algorithm it claims: sign and verify, a real x509 chain,
// 16 concurrent signers, context cancellation (before a call, and during one
// where the backend can be interrupted), typed errors, key creation.
package backendtest

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
)

// Harness tells the suite how to reach keys in the backend under test.
type Harness struct {
	Provider backends.Provider
	// KeyURI returns the URI of an existing key of alg, made by the backend's
	// own fixture (not through CreateKey).
	KeyURI func(t *testing.T, alg backends.Algorithm) string
	// MissingKeyURI is a well-formed URI naming a key that does not exist.
	MissingKeyURI string
	// UnsupportedKeyURI, if set, names an existing key whose type the backend
	// must refuse with ErrUnsupportedAlgorithm.
	UnsupportedKeyURI string
	// CreateURI, if set, returns the URI to create a new key of alg with
	// (backends that are KeyCreators only).
	CreateURI func(t *testing.T, alg backends.Algorithm) string
	// Algorithms restricts the run to these (default: Provider.Algorithms()),
	// e.g. to keep slow RSA-4096 generation out of -short runs.
	Algorithms []backends.Algorithm
	// Stall, if set, declares that the backend abandons a call in flight
	// when its context is canceled (the KMS backends do; a PKCS#11 call
	// cannot be interrupted, so pkcs11 leaves it nil). It makes every later
	// call to the backend's service hang until the caller gives up, and
	// returns a function that ends the stall. The suite then cancels a
	// signature mid-call and expects context.Canceled at once.
	Stall func(t *testing.T) (end func())
}

// midCallWait is how long the suite lets a stalled signature run before
// canceling it; midCallLimit is how soon after that it must return.
const (
	midCallWait  = 50 * time.Millisecond
	midCallLimit = 5 * time.Second
)

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	algs := h.Algorithms
	if algs == nil {
		algs = h.Provider.Algorithms()
	}
	for _, alg := range algs {
		if !slices.Contains(h.Provider.Algorithms(), alg) {
			t.Fatalf("harness asks for %s, which the provider does not claim", alg)
		}
		t.Run(string(alg), func(t *testing.T) {
			s := open(t, h, h.KeyURI(t, alg))
			t.Run("key reports its algorithm and fingerprint", func(t *testing.T) { checkIdentity(t, s, alg) })
			t.Run("signature verifies", func(t *testing.T) { checkSignVerify(t, s) })
			t.Run("signs a verifiable x509 chain", func(t *testing.T) { checkChain(t, s) })
			t.Run("16 concurrent signers", func(t *testing.T) { checkConcurrent(t, s, 16, 8) })
			t.Run("canceled context stops signing", func(t *testing.T) { checkCanceled(t, s) })
			if h.Stall != nil {
				t.Run("cancellation stops a signature in flight", func(t *testing.T) { checkCanceledMidCall(t, s, h.Stall) })
			}
			t.Run("wrong signer options or digest length are refused", func(t *testing.T) { checkWrongOpts(t, s) })
			t.Run("reopening gives the same key", func(t *testing.T) {
				again := open(t, h, s.URI())
				if again.Fingerprint() != s.Fingerprint() || again.KeyVersion() != s.KeyVersion() {
					t.Fatalf("reopened %s: fingerprint %s version %s, want %s %s", s.URI(), again.Fingerprint(), again.KeyVersion(), s.Fingerprint(), s.KeyVersion())
				}
			})
		})
	}

	t.Run("missing key is ErrNotFound and permanent", func(t *testing.T) {
		_, err := h.Provider.Open(context.Background(), backends.OpenRequest{URI: h.MissingKeyURI})
		if !errors.Is(err, backends.ErrNotFound) || !errors.Is(err, backends.ErrPermanent) || backends.IsTransient(err) {
			t.Fatalf("open %s: got %v, want ErrNotFound (permanent)", h.MissingKeyURI, err)
		}
	})
	if h.UnsupportedKeyURI != "" {
		t.Run("unsupported key type is ErrUnsupportedAlgorithm", func(t *testing.T) {
			_, err := h.Provider.Open(context.Background(), backends.OpenRequest{URI: h.UnsupportedKeyURI})
			if !errors.Is(err, backends.ErrUnsupportedAlgorithm) {
				t.Fatalf("open %s: got %v, want ErrUnsupportedAlgorithm", h.UnsupportedKeyURI, err)
			}
		})
	}

	kc, isCreator := h.Provider.(backends.KeyCreator)
	if h.CreateURI == nil {
		if isCreator {
			t.Errorf("provider %s is a KeyCreator but the harness has no CreateURI", h.Provider.Scheme())
		}
		return
	}
	if !isCreator {
		t.Fatalf("harness has CreateURI but provider %s is not a KeyCreator", h.Provider.Scheme())
	}
	t.Run("create key", func(t *testing.T) {
		for _, alg := range algs {
			t.Run(string(alg), func(t *testing.T) {
				s, err := kc.CreateKey(context.Background(), backends.CreateKeyRequest{URI: h.CreateURI(t, alg), Algorithm: alg})
				if err != nil {
					t.Fatalf("creating %s key: %v", alg, err)
				}
				t.Cleanup(func() { s.Close() })
				checkIdentity(t, s, alg)
				checkSignVerify(t, s)
				again := open(t, h, s.URI())
				if again.Fingerprint() != s.Fingerprint() {
					t.Fatalf("created key reopened at %s has fingerprint %s, want %s", s.URI(), again.Fingerprint(), s.Fingerprint())
				}
			})
		}
		t.Run("a created key can be destroyed and then no longer opens", func(t *testing.T) {
			s, err := kc.CreateKey(context.Background(), backends.CreateKeyRequest{URI: h.CreateURI(t, algs[0]), Algorithm: algs[0]})
			if err != nil {
				t.Fatalf("creating %s key: %v", algs[0], err)
			}
			t.Cleanup(func() { s.Close() })
			d, ok := s.(backends.Destroyer)
			if !ok {
				t.Fatalf("the %s key CreateKey returned (%T) is not a backends.Destroyer", h.Provider.Scheme(), s)
			}
			// The same key, opened: never destroyed through keyward.
			opened := open(t, h, s.URI())
			if od, ok := opened.(backends.Destroyer); ok {
				if what, err := od.Destroy(context.Background()); err == nil || !errors.Is(err, backends.ErrPermanent) {
					t.Fatalf("Destroy of an opened key: %q, %v; want a permanent refusal", what, err)
				}
				if again, err := h.Provider.Open(context.Background(), backends.OpenRequest{URI: s.URI()}); err != nil {
					t.Fatalf("%s no longer opens after a refused Destroy: %v", s.URI(), err)
				} else {
					again.Close()
				}
			}
			what, err := d.Destroy(context.Background())
			if err != nil {
				t.Fatalf("destroying %s: %v", s.URI(), err)
			}
			if what == "" {
				t.Error("Destroy said nothing about what it did")
			}
			if again, err := h.Provider.Open(context.Background(), backends.OpenRequest{URI: s.URI()}); err == nil {
				again.Close()
				t.Fatalf("%s opened after Destroy (%s)", s.URI(), what)
			}
		})
		if unsupported := firstUnsupported(h.Provider); unsupported != "" {
			t.Run("unsupported algorithm is refused", func(t *testing.T) {
				_, err := kc.CreateKey(context.Background(), backends.CreateKeyRequest{URI: h.CreateURI(t, algs[0]), Algorithm: unsupported})
				if !errors.Is(err, backends.ErrUnsupportedAlgorithm) {
					t.Fatalf("creating %s: got %v, want ErrUnsupportedAlgorithm", unsupported, err)
				}
			})
		}
	})
}

func firstUnsupported(p backends.Provider) backends.Algorithm {
	for _, a := range backends.AllAlgorithms() {
		if !slices.Contains(p.Algorithms(), a) {
			return a
		}
	}
	return ""
}

func open(t *testing.T, h Harness, uri string) backends.Signer {
	t.Helper()
	s, err := h.Provider.Open(context.Background(), backends.OpenRequest{URI: uri})
	if err != nil {
		t.Fatalf("open %s: %v", uri, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close %s: %v", uri, err)
		}
	})
	return s
}

func checkIdentity(t *testing.T, s backends.Signer, alg backends.Algorithm) {
	t.Helper()
	if s.Algorithm() != alg {
		t.Errorf("Algorithm() = %s, want %s", s.Algorithm(), alg)
	}
	if s.SignatureAlgorithm() != alg.SignatureAlgorithm() {
		t.Errorf("SignatureAlgorithm() = %v, want %v", s.SignatureAlgorithm(), alg.SignatureAlgorithm())
	}
	if err := alg.CheckPublicKey(s.Public()); err != nil {
		t.Error(err)
	}
	fp, err := backends.Fingerprint(s.Public())
	if err != nil || fp != s.Fingerprint() {
		t.Errorf("Fingerprint() = %s, want %s (%v)", s.Fingerprint(), fp, err)
	}
	if s.KeyVersion() == "" {
		t.Error("KeyVersion() is empty")
	}
}

// digestFor returns what SignContext takes for alg: the message's digest, or
// for Ed25519 the message itself.
func digestFor(alg backends.Algorithm, msg []byte) []byte {
	if alg.Hash() == 0 {
		return msg
	}
	h := alg.Hash().New()
	h.Write(msg)
	return h.Sum(nil)
}

func checkSignVerify(t *testing.T, s backends.Signer) {
	t.Helper()
	msg := []byte("keyward conformance " + time.Now().String())
	d := digestFor(s.Algorithm(), msg)
	sig, err := s.Sign(rand.Reader, d, s.Algorithm().SignerOpts())
	if err != nil {
		t.Fatalf("Sign: %v", err)
	}
	if err := backends.VerifySignature(s.Public(), s.Algorithm(), d, sig); err != nil {
		t.Fatalf("signature from %s: %v", s.URI(), err)
	}
	other := digestFor(s.Algorithm(), append(msg, '!'))
	if backends.VerifySignature(s.Public(), s.Algorithm(), other, sig) == nil {
		t.Fatal("signature also verifies for another message")
	}
}

func checkChain(t *testing.T, s backends.Signer) {
	t.Helper()
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "conformance CA " + string(s.Algorithm())},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SignatureAlgorithm:    s.SignatureAlgorithm(),
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, s.Public(), s)
	if err != nil {
		t.Fatalf("self-signing CA with %s: %v", s.Algorithm(), err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber:       big.NewInt(2),
		Subject:            pkix.Name{CommonName: "leaf"},
		DNSNames:           []string{"leaf.example"},
		NotBefore:          now.Add(-time.Minute),
		NotAfter:           now.Add(30 * time.Minute),
		KeyUsage:           x509.KeyUsageDigitalSignature,
		ExtKeyUsage:        []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		SignatureAlgorithm: s.SignatureAlgorithm(),
	}, ca, leafKey.Public(), s)
	if err != nil {
		t.Fatalf("signing leaf with %s: %v", s.Algorithm(), err)
	}
	leaf, err := x509.ParseCertificate(leafDER)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: "leaf.example"}); err != nil {
		t.Fatalf("chain signed by %s does not verify: %v", s.Algorithm(), err)
	}
}

func checkConcurrent(t *testing.T, s backends.Signer, workers, each int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				d := digestFor(s.Algorithm(), fmt.Appendf(nil, "worker %d message %d", w, i))
				sig, err := s.SignContext(context.Background(), d, s.Algorithm().SignerOpts())
				if err == nil {
					err = backends.VerifySignature(s.Public(), s.Algorithm(), d, sig)
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func checkCanceled(t *testing.T, s backends.Signer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := s.SignContext(ctx, digestFor(s.Algorithm(), []byte("x")), s.Algorithm().SignerOpts())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("SignContext with a canceled context: got %v, want context.Canceled", err)
	}
}

func checkCanceledMidCall(t *testing.T, s backends.Signer, stall func(*testing.T) func()) {
	t.Helper()
	end := stall(t)
	defer end()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.SignContext(ctx, digestFor(s.Algorithm(), []byte("x")), s.Algorithm().SignerOpts())
		done <- err
	}()
	select {
	case err := <-done:
		t.Fatalf("SignContext returned (%v) before its context was canceled: the backend did not stall", err)
	case <-time.After(midCallWait):
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) || !backends.IsTransient(err) {
			t.Fatalf("SignContext canceled mid-call: got %v, want context.Canceled (transient)", err)
		}
	case <-time.After(midCallLimit):
		t.Fatalf("SignContext still running %v after its context was canceled: the call was not interrupted", midCallLimit)
	}
}

func checkWrongOpts(t *testing.T, s backends.Signer) {
	t.Helper()
	wrong := crypto.Hash(crypto.SHA1)
	_, err := s.SignContext(context.Background(), make([]byte, 20), wrong)
	if !errors.Is(err, backends.ErrUnsupportedAlgorithm) {
		t.Fatalf("SignContext with SHA-1 options: got %v, want ErrUnsupportedAlgorithm", err)
	}
	if alg := s.Algorithm(); alg.Hash() != 0 {
		short := digestFor(alg, []byte("x"))[1:]
		_, err := s.SignContext(context.Background(), short, alg.SignerOpts())
		if !errors.Is(err, backends.ErrPermanent) || backends.IsTransient(err) {
			t.Fatalf("SignContext with a %d-byte digest: got %v, want a permanent error", len(short), err)
		}
	}
	if alg := s.Algorithm(); alg.PSS() {
		auto := &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthAuto, Hash: alg.Hash()}
		_, err := s.SignContext(context.Background(), digestFor(alg, []byte("x")), auto)
		if !errors.Is(err, backends.ErrUnsupportedAlgorithm) {
			t.Fatalf("SignContext with PSS options of automatic salt length: got %v, want ErrUnsupportedAlgorithm", err)
		}
	}
}
