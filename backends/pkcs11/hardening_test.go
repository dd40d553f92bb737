//go:build cgo

package pkcs11_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/pkcs11"
	"github.com/keyward/keyward/testsupport/softhsm"
	p11 "github.com/miekg/pkcs11"
)

// newToken makes a SoftHSM2 token of this test run's own.
func newToken(t *testing.T, prefix string) *softhsm.Token {
	t.Helper()
	tok, err := hsm.NewToken(unique(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// pinFile writes pin to a 0600 file and returns its path.
func pinFile(t *testing.T, pin string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "pin")
	if err := os.WriteFile(f, []byte(pin+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// withPIN is tokenURI with the PIN read from file instead.
func withPIN(tok *softhsm.Token, path, file string) string {
	return "pkcs11:token=" + tok.Label + ";" + path + "?module-path=" + tok.ModulePath + "&pin-source=file:" + file
}

func signOnce(s backends.Signer) error {
	d := make([]byte, s.Algorithm().Hash().Size())
	sig, err := s.SignContext(context.Background(), d, s.Algorithm().SignerOpts())
	if err == nil {
		err = backends.VerifySignature(s.Public(), s.Algorithm(), d, sig)
	}
	return err
}

func create(t *testing.T, p *pkcs11.Provider, uri string, alg backends.Algorithm) backends.Signer {
	t.Helper()
	s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: uri, Algorithm: alg})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// isPINIncorrect: permanent, blames the pin-source, carries
// CKR_PIN_INCORRECT, says so in words, and shows none of the PINs.
func checkPINIncorrect(t *testing.T, err error, pins ...string) {
	t.Helper()
	var be *backends.Error
	if !errors.Is(err, backends.ErrPermanent) || backends.IsTransient(err) || !errors.As(err, &be) || be.Part != "pin-source" ||
		!errors.Is(err, p11.Error(p11.CKR_PIN_INCORRECT)) || !errors.Is(err, backends.ErrLoginRefused) {
		t.Fatalf("got %v, want a permanent CKR_PIN_INCORRECT error naming pin-source, matching ErrLoginRefused", err)
	}
	if !strings.Contains(err.Error(), "PIN incorrect") {
		t.Errorf("error %q does not say \"PIN incorrect\"", err)
	}
	for _, pin := range pins {
		if strings.Contains(err.Error(), pin) {
			t.Errorf("error %q shows a PIN", err)
		}
	}
}

// Every open checks its PIN, also while the token is logged in: SoftHSM2
// answers C_Login with CKR_USER_ALREADY_LOGGED_IN before it looks at the
// PIN, and crypto11 takes that for success, so a second context for the
// token would accept any PIN.
func TestEveryOpenChecksThePIN(t *testing.T) {
	tok := newToken(t, "pin")
	const wrong = "not-the-pin-0815"
	wrongFile := pinFile(t, wrong)
	label := unique("pin-key")

	p := newProvider(t, pkcs11.Options{})
	create(t, p, tokenURI(tok, "object="+label), backends.ECDSAP256SHA256)
	t.Run("a wrong PIN is refused while the token is logged in", func(t *testing.T) {
		_, err := p.Open(context.Background(), backends.OpenRequest{URI: withPIN(tok, "object="+label, wrongFile)})
		checkPINIncorrect(t, err, wrong, tok.PIN())
	})
	t.Run("a wrong PIN is refused in another Provider of the process", func(t *testing.T) {
		other := newProvider(t, pkcs11.Options{})
		_, err := other.Open(context.Background(), backends.OpenRequest{URI: withPIN(tok, "object="+label, wrongFile)})
		checkPINIncorrect(t, err, wrong, tok.PIN())
	})
	t.Run("a wrong PIN is refused when the token is named by its serial", func(t *testing.T) {
		uri := "pkcs11:serial=" + tok.Serial + ";object=" + label + "?module-path=" + tok.ModulePath + "&pin-source=file:" + wrongFile
		_, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
		checkPINIncorrect(t, err, wrong, tok.PIN())
	})
	t.Run("the right PIN opens the key by the token's serial", func(t *testing.T) {
		uri := "pkcs11:serial=" + tok.Serial + ";object=" + label + "?module-path=" + tok.ModulePath + "&pin-source=file:" + tok.PINFile
		s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
		if err != nil {
			t.Fatal(err)
		}
		if err := signOnce(s); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("the right PIN from another source opens the key", func(t *testing.T) {
		t.Setenv("KEYWARD_TEST_PIN_2", tok.PIN())
		uri := "pkcs11:token=" + tok.Label + ";object=" + label + "?module-path=" + tok.ModulePath + "&pin-source=env:KEYWARD_TEST_PIN_2"
		s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
		if err != nil {
			t.Fatal(err)
		}
		if err := signOnce(s); err != nil {
			t.Fatal(err)
		}
	})
}

// A wrong PIN on a token's first open is refused by the token and leaves
// nothing behind: the right PIN opens it next.
func TestWrongFirstPINLeavesNothingBehind(t *testing.T) {
	tok := newToken(t, "first-pin")
	const wrong = "not-the-pin-0816"
	label := unique("pin-key")
	p := newProvider(t, pkcs11.Options{})
	_, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: withPIN(tok, "object="+label, pinFile(t, wrong)), Algorithm: backends.ECDSAP256SHA256})
	checkPINIncorrect(t, err, wrong, tok.PIN())
	s := create(t, p, tokenURI(tok, "object="+label), backends.ECDSAP256SHA256)
	if err := signOnce(s); err != nil {
		t.Fatal(err)
	}
}

// A symlink to the module and its target are one module: both spellings are
// allowed when one is, and they share crypto11's module handle — so neither
// fails with CKR_CRYPTOKI_ALREADY_INITIALIZED, and closing one does not
// finalise the module under the other.
func TestTwoSpellingsOfOneModuleShareIt(t *testing.T) {
	tok := newToken(t, "spellings")
	link := filepath.Join(t.TempDir(), "libsofthsm2.so")
	if err := os.Symlink(tok.ModulePath, link); err != nil {
		t.Fatal(err)
	}
	viaLink := func(path string) string {
		return "pkcs11:token=" + tok.Label + ";" + path + "?module-path=" + link + "&pin-source=file:" + tok.PINFile
	}
	byLink := newProvider(t, pkcs11.Options{AllowedModules: []string{link}})
	label := unique("spelled")
	s1 := create(t, byLink, viaLink("object="+label), backends.ECDSAP256SHA256)

	byTarget := newProvider(t, pkcs11.Options{AllowedModules: []string{tok.ModulePath}})
	s2, err := byTarget.Open(context.Background(), backends.OpenRequest{URI: tokenURI(tok, "object="+label)})
	if err != nil {
		t.Fatalf("opening the key through the module's real path: %v", err)
	}
	for name, s := range map[string]backends.Signer{"symlink": s1, "real path": s2} {
		if err := signOnce(s); err != nil {
			t.Fatalf("signing through the %s: %v", name, err)
		}
	}
	// Only the symlink is on byLink's allowlist: its target is the same module.
	if _, err := byLink.Open(context.Background(), backends.OpenRequest{URI: tokenURI(tok, "object="+label)}); err != nil {
		t.Fatalf("opening through the real path of an allowed symlink: %v", err)
	}
	_, err = byTarget.Open(context.Background(), backends.OpenRequest{URI: withPIN(tok, "object="+label, pinFile(t, "wrong-pin-4711"))})
	checkPINIncorrect(t, err, "wrong-pin-4711", tok.PIN())

	if err := byLink.Close(); err != nil {
		t.Fatal(err)
	}
	if err := signOnce(s2); err != nil {
		t.Fatalf("after the other spelling's Provider closed: %v", err)
	}
	if n := byTarget.Reopens(); n != 0 {
		t.Errorf("the token was re-opened %d times: closing one spelling disturbed the other", n)
	}
}

// The module is finalised under two open tokens (as another handle's
// C_Finalize does): the token in use recovers by itself, although the other
// is idle — its context would otherwise keep crypto11 from initialising the
// module again — and the idle one recovers when next used. A crypto11
// context outside keyward that keeps crypto11's module handle alive is no
// obstacle either.
func TestModuleFinalisedUnderTwoTokensRecovers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		foreign bool
	}{
		{"with keyward's contexts only", false},
		{"with a context outside keyward on the module", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := newToken(t, "reinit-a"), newToken(t, "reinit-b")
			p := newProvider(t, pkcs11.Options{ReopenInterval: 10 * time.Millisecond})
			sa := create(t, p, tokenURI(a, "object="+unique("ca")), backends.ECDSAP256SHA256)
			sb := create(t, p, tokenURI(b, "object="+unique("ca")), backends.RSA2048PKCS1SHA256)
			if tc.foreign {
				newFixture(t, b)
			}
			for _, s := range []backends.Signer{sa, sb} {
				if err := signOnce(s); err != nil {
					t.Fatalf("before the module was finalised: %v", err)
				}
			}

			h := p11.New(a.ModulePath)
			if h == nil {
				t.Fatal("loading the module")
			}
			if err := h.Finalize(); err != nil {
				t.Fatalf("C_Finalize: %v", err)
			}
			h.Destroy()

			recover := func(name string, s backends.Signer) {
				t.Helper()
				deadline := time.Now().Add(20 * time.Second)
				for i := 0; ; i++ {
					err := signOnce(s)
					if err == nil {
						return
					}
					if i == 0 {
						t.Logf("%s recovering: %v", name, err)
					}
					if !backends.IsTransient(err) || time.Now().After(deadline) {
						t.Fatalf("%s after the module was finalised: %v", name, err)
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			recover("token a", sa)
			recover("token b", sb)
			for _, s := range []backends.Signer{sa, sb, sa} {
				if err := signOnce(s); err != nil {
					t.Fatalf("after recovering: %v", err)
				}
			}
			if n := p.Reopens(); n < 2 {
				t.Errorf("%d re-opens, want one per token at least", n)
			}
		})
	}
}

// Keys keyward creates can sign and do nothing else, and never leave the
// token: read back from SoftHSM for every key type the backend creates,
// through crypto11 and through a PKCS#11 session of the test's own that
// tries to read the private value and to wrap the key (softhsm.KeyFacts).
func TestCreatedKeysAreSignOnly(t *testing.T) {
	algs := []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.RSA2048PKCS1SHA256, backends.RSA3072PKCS1SHA256, backends.RSA4096PKCS1SHA256}
	if testing.Short() {
		algs = []backends.Algorithm{backends.ECDSAP256SHA256, backends.RSA2048PKCS1SHA256}
	}
	p := newProvider(t, pkcs11.Options{})
	f := newFixture(t, token)
	for _, alg := range algs {
		t.Run(string(alg), func(t *testing.T) {
			id := make([]byte, 8)
			if _, err := rand.Read(id); err != nil {
				t.Fatal(err)
			}
			var esc strings.Builder
			for _, c := range id {
				fmt.Fprintf(&esc, "%%%02X", c)
			}
			label := unique("ca-sign-only")
			s := create(t, p, tokenURI(token, "object="+label+";id="+esc.String()), alg)
			if !strings.Contains(s.URI(), "id="+esc.String()) {
				t.Errorf("URI %s lost the id", s.URI())
			}
			key, err := f.ctx.FindKeyPair(id, nil)
			if err != nil || key == nil {
				t.Fatalf("finding the key by id: %v, %v", key, err)
			}
			check := func(which string, get func(any, []crypto11.AttributeType) (crypto11.AttributeSet, error), want map[crypto11.AttributeType]byte) {
				t.Helper()
				var types []crypto11.AttributeType
				for typ := range want {
					types = append(types, typ)
				}
				attrs, err := get(key, types)
				if err != nil {
					t.Fatalf("reading %s key attributes: %v", which, err)
				}
				for typ, v := range want {
					a := attrs[typ]
					if a == nil || len(a.Value) != 1 || a.Value[0] != v {
						t.Errorf("%s key: attribute 0x%x = %v, want %d", which, typ, a, v)
					}
				}
			}
			check("private", f.ctx.GetAttributes, map[crypto11.AttributeType]byte{
				crypto11.CkaSign: 1, crypto11.CkaDecrypt: 0, crypto11.CkaUnwrap: 0, crypto11.CkaDerive: 0, crypto11.CkaSignRecover: 0,
				crypto11.CkaExtractable: 0, crypto11.CkaSensitive: 1, crypto11.CkaPrivate: 1, crypto11.CkaToken: 1,
			})
			check("public", f.ctx.GetPubAttributes, map[crypto11.AttributeType]byte{
				crypto11.CkaVerify: 1, crypto11.CkaEncrypt: 0, crypto11.CkaWrap: 0, crypto11.CkaVerifyRecover: 0,
			})
			// Read as any application with the PIN would, in a session of
			// its own: the private value is refused and wrapping fails.
			facts, err := token.KeyFacts(label)
			if err != nil {
				t.Fatal(err)
			}
			if problems := facts.SignOnlyProblems(); len(problems) > 0 {
				t.Errorf("the key keyward created in the token:\n  %s", strings.Join(problems, "\n  "))
			}
			if err := signOnce(s); err != nil {
				t.Fatal(err)
			}

			_, err = p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: tokenURI(token, "object="+label), Algorithm: alg})
			if !errors.Is(err, backends.ErrPermanent) {
				t.Fatalf("creating a second key with the same label: got %v, want a permanent error", err)
			}
		})
	}
}

// An algorithm= in the URI that is not the requested algorithm is refused
// before a key is generated; one that agrees is taken.
func TestCreateKeyChecksTheURIAlgorithm(t *testing.T) {
	p := newProvider(t, pkcs11.Options{})
	for _, tc := range []struct {
		name     string
		uriAlg   backends.Algorithm
		alg      backends.Algorithm
		wantKind error // nil: the key is made
	}{
		{"another curve is refused", backends.ECDSAP384SHA384, backends.ECDSAP256SHA256, backends.ErrInvalidURI},
		{"RSA for an ECDSA key is refused", backends.RSA2048PKCS1SHA256, backends.ECDSAP256SHA256, backends.ErrInvalidURI},
		{"PSS for a PKCS#1 v1.5 key is refused", backends.RSA2048PSSSHA256, backends.RSA2048PKCS1SHA256, backends.ErrInvalidURI},
		{"the default for the key is refused for PSS", backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA256, backends.ErrInvalidURI},
		{"the requested algorithm is taken", backends.RSA2048PSSSHA256, backends.RSA2048PSSSHA256, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			label := unique("alg")
			s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{
				URI: tokenURI(token, "object="+label) + "&algorithm=" + string(tc.uriAlg), Algorithm: tc.alg,
			})
			if tc.wantKind == nil {
				if err != nil {
					t.Fatal(err)
				}
				if s.Algorithm() != tc.alg {
					t.Errorf("key signs with %s, want %s", s.Algorithm(), tc.alg)
				}
				return
			}
			var be *backends.Error
			if !errors.Is(err, tc.wantKind) || !errors.As(err, &be) || be.Part != "algorithm" {
				t.Fatalf("got %v, want %v naming algorithm", err, tc.wantKind)
			}
			_, err = p.Open(context.Background(), backends.OpenRequest{URI: tokenURI(token, "object="+label)})
			if !errors.Is(err, backends.ErrNotFound) {
				t.Fatalf("after the refusal, opening the label: got %v, want ErrNotFound (no key generated)", err)
			}
		})
	}
}

// Concurrent creates of one label make one key: the others are told it
// exists.
func TestConcurrentCreatesOfOneLabelMakeOneKey(t *testing.T) {
	const n = 6
	label := unique("race")
	uri := tokenURI(token, "object="+label)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		// A Provider each: creates from several Providers of one process
		// must be serialised too.
		p := newProvider(t, pkcs11.Options{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: uri, Algorithm: backends.RSA2048PKCS1SHA256})
		}()
	}
	wg.Wait()
	var made int
	for _, err := range errs {
		switch {
		case err == nil:
			made++
		case !errors.Is(err, backends.ErrPermanent):
			t.Errorf("a losing create: got %v, want a permanent error", err)
		}
	}
	f := newFixture(t, token)
	keys, err := f.ctx.FindKeyPairs(nil, []byte(label))
	if err != nil {
		t.Fatal(err)
	}
	if made != 1 || len(keys) != 1 {
		t.Fatalf("%d creates succeeded and the token has %d keys labelled %s, want 1 and 1", made, len(keys), label)
	}
}

// A Signer of a closed Provider refuses to sign, permanently, rather than
// opening its token again; another Provider's Signer on the same token goes
// on signing.
func TestSignerAfterProviderCloseIsPermanent(t *testing.T) {
	tok := newToken(t, "closed")
	label := unique("ca")
	p, err := pkcs11.New(pkcs11.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := create(t, p, tokenURI(tok, "object="+label), backends.ECDSAP256SHA256)
	other := newProvider(t, pkcs11.Options{})
	o, err := other.Open(context.Background(), backends.OpenRequest{URI: tokenURI(tok, "object="+label)})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		err := signOnce(s)
		if !errors.Is(err, backends.ErrPermanent) || backends.IsTransient(err) {
			t.Fatalf("signing after Close: got %v, want a permanent error", err)
		}
	}
	if _, err := p.Open(context.Background(), backends.OpenRequest{URI: tokenURI(tok, "object="+label)}); !errors.Is(err, backends.ErrPermanent) {
		t.Fatalf("opening after Close: got %v, want a permanent error", err)
	}
	if err := signOnce(o); err != nil {
		t.Fatalf("the other Provider's signer: %v", err)
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if err := signOnce(o); !errors.Is(err, backends.ErrPermanent) || backends.IsTransient(err) {
		t.Fatalf("signing after the last Provider closed: got %v, want a permanent error", err)
	}
}

// A key has one version id however its URI names it: the id a create
// reports (label-only URI, a random CKA_ID made) is what an Open by label
// alone, or by id, reports too.
func TestKeyVersionIsStableAcrossURIForms(t *testing.T) {
	tok := newToken(t, "version")
	label := unique("ca")
	p := newProvider(t, pkcs11.Options{})
	created := create(t, p, tokenURI(tok, "object="+label), backends.ECDSAP256SHA256)
	byLabel, err := p.Open(context.Background(), backends.OpenRequest{URI: tokenURI(tok, "object="+label)})
	if err != nil {
		t.Fatal(err)
	}
	if created.KeyVersion() != byLabel.KeyVersion() {
		t.Fatalf("created as %q, opened by label as %q: want one version id", created.KeyVersion(), byLabel.KeyVersion())
	}
	if !strings.Contains(created.KeyVersion(), "/id:") {
		t.Errorf("version id %q does not name the key's CKA_ID", created.KeyVersion())
	}
}
