//go:build cgo

package pkcs11_test

import (
	"context"
	"crypto"
	"crypto/elliptic"
	"crypto/rsa"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/pkcs11"
	"github.com/keyward/keyward/testsupport/softhsm"
)

var (
	hsm   *softhsm.Env
	token *softhsm.Token
)

// One SoftHSM2 configuration for the test binary (SoftHSM reads it once per
// process), in a temp dir removed at the end.
func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "keyward-pkcs11-test-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		if hsm, err = softhsm.NewEnv(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if token, err = hsm.NewToken("conformance"); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// runID and labelSeq make object and token labels unique per test run, so
// that -count=N runs again on the same tokens without meeting its own keys.
var (
	runID    = time.Now().UnixNano()
	labelSeq atomic.Uint64
)

// unique returns prefix with a suffix no other call in this process gets.
func unique(prefix string) string {
	return fmt.Sprintf("%s-%d-%d", prefix, runID, labelSeq.Add(1))
}

func tokenURI(tok *softhsm.Token, path string) string {
	return "pkcs11:token=" + tok.Label + ";" + path + "?module-path=" + tok.ModulePath + "&pin-source=file:" + tok.PINFile
}

// fixture makes keys with crypto11 directly, as an operator's tooling would.
type fixture struct {
	ctx  *crypto11.Context
	mu   sync.Mutex
	made map[string]string // key shape -> object label
}

func newFixture(t *testing.T, tok *softhsm.Token) *fixture {
	t.Helper()
	c, err := crypto11.Configure(&crypto11.Config{Path: tok.ModulePath, TokenLabel: tok.Label, Pin: tok.PIN(), PoolWaitTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("fixture opening %v: %v", tok, err)
	}
	t.Cleanup(func() { c.Close() })
	return &fixture{ctx: c, made: map[string]string{}}
}

func (f *fixture) keyURI(t *testing.T, alg backends.Algorithm) string {
	shape := fmt.Sprintf("%d-%d-%v", alg.Kind(), alg.RSABits(), alg.Curve())
	f.mu.Lock()
	defer f.mu.Unlock()
	label, ok := f.made[shape]
	if !ok {
		label = unique("fixture")
		id := []byte(label)
		var err error
		switch alg.Kind() {
		case backends.KindECDSA:
			_, err = f.ctx.GenerateECDSAKeyPairWithLabel(id, id, alg.Curve())
		case backends.KindRSA:
			_, err = f.ctx.GenerateRSAKeyPairWithLabel(id, id, alg.RSABits())
		}
		if err != nil {
			t.Fatalf("fixture generating %s: %v", alg, err)
		}
		f.made[shape] = label
	}
	return tokenURI(token, "object="+label) + "&algorithm=" + string(alg)
}

func newProvider(t *testing.T, opts pkcs11.Options) *pkcs11.Provider {
	t.Helper()
	p, err := pkcs11.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func testAlgorithms() []backends.Algorithm {
	if !testing.Short() {
		return nil
	}
	return []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA256}
}

func TestConformance(t *testing.T) {
	f := newFixture(t, token)
	p521 := []byte(unique("p521"))
	if _, err := f.ctx.GenerateECDSAKeyPairWithLabel(p521, p521, elliptic.P521()); err != nil {
		t.Fatal(err)
	}
	backendtest.Run(t, backendtest.Harness{
		Provider:          newProvider(t, pkcs11.Options{}),
		KeyURI:            f.keyURI,
		MissingKeyURI:     tokenURI(token, "object=no-such-key"),
		UnsupportedKeyURI: tokenURI(token, "object="+string(p521)),
		CreateURI: func(t *testing.T, alg backends.Algorithm) string {
			return tokenURI(token, "object="+unique("created"))
		},
		Algorithms: testAlgorithms(),
		// No Stall: a PKCS#11 call cannot be interrupted, so only a context
		// canceled before the call is honoured.
	})
}

// The token's files vanish mid-run (the HSM goes away) and come back:
// signing fails with transient errors meanwhile and recovers without a new
// Provider, a new Open or a new process — by re-opening the token (module
// initialised again, logged in again) and finding the key again.
func TestSigningRecoversAfterTheTokenReturns(t *testing.T) {
	// A label of its own per run, so that -count=N makes a new token each time.
	tok, err := hsm.NewToken(fmt.Sprintf("recovery-%d", time.Now().UnixNano()))
	if err != nil {
		t.Fatal(err)
	}
	// SoftHSM serves a token from memory while its own files go; it notices
	// when the whole token directory does. Running as root, chmod would not
	// stop it reading, so the directory is moved away and back.
	tokDir := hsm.TokenDir()

	p := newProvider(t, pkcs11.Options{ReopenInterval: 20 * time.Millisecond})
	s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: tokenURI(tok, "object=ca"), Algorithm: backends.ECDSAP256SHA256,
	})
	if err != nil {
		t.Fatal(err)
	}
	sign := func() error {
		d := make([]byte, 32)
		sig, err := s.SignContext(context.Background(), d, s.Algorithm().SignerOpts())
		if err == nil {
			err = backends.VerifySignature(s.Public(), s.Algorithm(), d, sig)
		}
		return err
	}
	if err := sign(); err != nil {
		t.Fatalf("before the outage: %v", err)
	}
	if n := p.Reopens(); n != 0 {
		t.Fatalf("%d re-opens before the outage", n)
	}

	away := tokDir + ".away"
	if err := os.Rename(tokDir, away); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		err := sign()
		if err == nil {
			t.Fatal("signing succeeded while the token's files were gone")
		}
		if !backends.IsTransient(err) {
			t.Fatalf("during the outage: got %v, want a transient error", err)
		}
		// Re-finding the key is part of signing, and says so.
		if be := (*backends.Error)(nil); !errors.As(err, &be) || be.Op != "sign" {
			t.Fatalf("during the outage: got %v, want an error of op \"sign\"", err)
		}
		t.Logf("during the outage: %v", err)
		time.Sleep(30 * time.Millisecond)
	}
	if err := os.Rename(away, tokDir); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := sign()
		if err == nil {
			break
		}
		t.Logf("recovering: %v", err)
		if be := (*backends.Error)(nil); !errors.As(err, &be) || be.Op != "sign" {
			t.Fatalf("recovering: got %v, want an error of op \"sign\"", err)
		}
		if !backends.IsTransient(err) || time.Now().After(deadline) {
			t.Fatalf("after the token returned: %v", err)
		}
		time.Sleep(30 * time.Millisecond)
	}
	// The same Signer signed again, so the recovery went through the
	// re-open: a key handle from before it is refused (the token's
	// generation changed) and the key had to be found again.
	n := p.Reopens()
	if n == 0 {
		t.Fatal("signing recovered but the token was never re-opened")
	}
	t.Logf("recovered after %d re-open(s)", n)
	for range 3 {
		if err := sign(); err != nil {
			t.Fatalf("after recovering: %v", err)
		}
	}
	if got := p.Reopens(); got != n {
		t.Errorf("a healthy token was re-opened again: %d re-opens, was %d", got, n)
	}
}

// Mistakes of the caller are refused before the token is asked, as
// permanent errors: retrying them cannot help.
func TestCallerMistakesArePermanent(t *testing.T) {
	p := newProvider(t, pkcs11.Options{})
	for _, tc := range []struct {
		name   string
		alg    backends.Algorithm
		digest []byte
		opts   crypto.SignerOpts
		want   error
	}{
		{"a digest shorter than the hash", backends.ECDSAP256SHA256, make([]byte, 20), crypto.SHA256, backends.ErrPermanent},
		{"a digest longer than the hash", backends.RSA2048PKCS1SHA256, make([]byte, 48), crypto.SHA256, backends.ErrPermanent},
		{"PSS with an automatic salt length", backends.RSA2048PSSSHA256, make([]byte, 32),
			&rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthAuto, Hash: crypto.SHA256}, backends.ErrUnsupportedAlgorithm},
		{"PSS options for a PKCS#1 v1.5 key", backends.RSA2048PKCS1SHA256, make([]byte, 32),
			&rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: crypto.SHA256}, backends.ErrUnsupportedAlgorithm},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
				URI: tokenURI(token, "object="+unique("mistake")), Algorithm: tc.alg,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			_, err = s.SignContext(context.Background(), tc.digest, tc.opts)
			if !errors.Is(err, tc.want) || !errors.Is(err, backends.ErrPermanent) || backends.IsTransient(err) {
				t.Fatalf("got %v, want %v (permanent)", err, tc.want)
			}
		})
	}
}

func TestURIErrorsNameThePart(t *testing.T) {
	p := newProvider(t, pkcs11.Options{})
	wrongPIN := filepath.Join(t.TempDir(), "wrong.pin")
	if err := os.WriteFile(wrongPIN, []byte("not-the-pin-4711\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	mod := token.ModulePath
	pin := "&pin-source=file:" + token.PINFile
	cases := []struct {
		name string
		uri  string
		kind error
		part string
	}{
		{"module path missing", "pkcs11:token=conformance;object=x?pin-source=file:" + token.PINFile, backends.ErrInvalidURI, "module-path"},
		{"module not on the allowlist", "pkcs11:token=conformance;object=x?module-path=/tmp/evil.so" + pin, backends.ErrInvalidURI, "module-path"},
		{"PIN in the URI", "pkcs11:token=conformance;object=x;pin-value=1234?module-path=" + mod, backends.ErrInvalidURI, "pin-value"},
		{"slot number instead of a label", "pkcs11:slot-id=0;object=x?module-path=" + mod + pin, backends.ErrInvalidURI, "slot-id"},
		{"scheme written with //", "pkcs11://token=conformance;object=x?module-path=" + mod + pin, backends.ErrInvalidURI, "scheme"},
		{"no token", "pkcs11:object=x?module-path=" + mod + pin, backends.ErrInvalidURI, "token"},
		{"no key label or id", "pkcs11:token=conformance?module-path=" + mod + pin, backends.ErrInvalidURI, "object"},
		{"unknown attribute", "pkcs11:token=conformance;object=x;colour=red?module-path=" + mod + pin, backends.ErrInvalidURI, "colour"},
		{"misspelled PIN attribute", "pkcs11:token=conformance;object=x;pin-valeu=1234?module-path=" + mod + pin, backends.ErrInvalidURI, "pin-valeu"},
		{"no PIN source", "pkcs11:token=conformance;object=x?module-path=" + mod, backends.ErrInvalidURI, "pin-source"},
		{"token that does not exist", "pkcs11:token=nope;object=x?module-path=" + mod + pin, backends.ErrNotFound, "token"},
		{"wrong PIN", "pkcs11:token=conformance;object=x?module-path=" + mod + "&pin-source=file:" + wrongPIN, backends.ErrPermanent, "pin-source"},
		{"PIN from an unset variable", "pkcs11:token=conformance;object=x?module-path=" + mod + "&pin-source=env:KEYWARD_TEST_UNSET_PIN", backends.ErrPermanent, "pin-source"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.Open(context.Background(), backends.OpenRequest{URI: tc.uri})
			var be *backends.Error
			if !errors.Is(err, tc.kind) || !errors.As(err, &be) || be.Part != tc.part {
				t.Fatalf("got %v, want %v naming %q", err, tc.kind, tc.part)
			}
			for _, secret := range []string{"1234", "not-the-pin-4711", token.PIN()} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("error %q shows a PIN", err)
				}
			}
		})
	}
}

// A module path on the allowlist whose file does not exist says so, not
// crypto11's bare "failed to open module".
func TestMissingModuleFileIsNamed(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libnothere.so")
	p := newProvider(t, pkcs11.Options{AllowedModules: []string{missing}})
	_, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
		URI:       "pkcs11:token=conformance;object=x?module-path=" + missing + "&pin-source=file:" + token.PINFile,
		Algorithm: backends.ECDSAP256SHA256,
	})
	var be *backends.Error
	if !errors.Is(err, backends.ErrPermanent) || !errors.As(err, &be) || be.Part != "module-path" || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("got %v, want a permanent error naming module-path and wrapping fs.ErrNotExist", err)
	}
}

func TestPINFromEnvironment(t *testing.T) {
	t.Setenv("KEYWARD_TEST_PIN", token.PIN())
	p := newProvider(t, pkcs11.Options{})
	s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
		URI:       "pkcs11:token=conformance;object=" + unique("env-pin") + "?module-path=" + token.ModulePath + "&pin-source=env:KEYWARD_TEST_PIN",
		Algorithm: backends.ECDSAP384SHA384,
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(s.URI(), token.PIN()) {
		t.Errorf("URI %s shows the PIN", s.URI())
	}
}
