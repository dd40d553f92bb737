package testregistry_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// fileKey creates a key of alg with keyward's file backend; tokens are
// signed through its backends.Signer.
func fileKey(t *testing.T, alg backends.Algorithm) backends.Signer {
	t.Helper()
	s, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "token.key"), Algorithm: alg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func selfSign(t *testing.T, key crypto.Signer) *x509.Certificate {
	t.Helper()
	c, err := testregistry.SelfSign(key, "keyward registry token signer")
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func pull() []registrytoken.Access {
	return []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}}
}

func mint(t *testing.T, key crypto.Signer, reg *testregistry.Registry, edit func(*registrytoken.Token)) string {
	t.Helper()
	now := time.Now()
	tok := registrytoken.Token{
		Issuer: reg.Issuer, Audience: reg.Service, Subject: "system:serviceaccount:team-a:puller",
		Access: pull(), NotBefore: now, Expiry: now.Add(5 * time.Minute),
	}
	if edit != nil {
		edit(&tok)
	}
	s, err := registrytoken.Mint(context.Background(), key, tok)
	if err != nil {
		t.Fatalf("minting: %v", err)
	}
	return s
}

func status(t *testing.T, reg *testregistry.Registry, repo, tok string) (int, string) {
	t.Helper()
	resp := reg.GetManifest(t, repo, tok)
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK && resp.Header.Get("Docker-Content-Digest") != reg.ManifestDigest {
		t.Errorf("pulled digest %q, pushed %q", resp.Header.Get("Docker-Content-Digest"), reg.ManifestDigest)
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

func TestAnAnonymousPullIsChallenged(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{selfSign(t, key)}})
	code, challenge := status(t, reg, testregistry.Repository, "")
	if code != http.StatusUnauthorized {
		t.Fatalf("anonymous pull: status %d, want 401", code)
	}
	// The challenge is what a client (or keyward's plugin) reads to ask
	// the token service; this test is about its exact text.
	want := `Bearer realm="` + reg.Realm + `",service="` + reg.Service + `",scope="repository:` + testregistry.Repository + `:pull"`
	if challenge != want {
		t.Errorf("WWW-Authenticate %q, want %q", challenge, want)
	}
}

// TestTheRegistryChecksKeywardTokens: an ES256 key in the file backend,
// trusted through the rootcertbundle, named by kid (its thumbprint) or by
// x5c, or trusted through a JWKS.
func TestTheRegistryChecksKeywardTokens(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	cert := selfSign(t, key)
	jwksKey := fileKey(t, backends.ECDSAP256SHA256)
	other := fileKey(t, backends.ECDSAP256SHA256)
	reg := testregistry.Start(t, testregistry.Options{
		RootCerts: []*x509.Certificate{cert},
		JWKS:      map[string]crypto.PublicKey{"keyward-2026-11": jwksKey.Public()},
	})
	thumb, err := registrytoken.Thumbprint(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		key  crypto.Signer
		repo string
		edit func(*registrytoken.Token)
		want int
	}{
		{name: "a token naming its key by thumbprint pulls", key: key, want: http.StatusOK},
		{name: "a token carrying its certificate in x5c pulls", key: key, want: http.StatusOK,
			edit: func(tok *registrytoken.Token) { tok.Chain = []*x509.Certificate{cert} }},
		{name: "a token naming a JWKS key by kid pulls", key: jwksKey, want: http.StatusOK,
			edit: func(tok *registrytoken.Token) { tok.KeyID = "keyward-2026-11" }},
		{name: "a token granting push and pull pulls", key: key, want: http.StatusOK,
			edit: func(tok *registrytoken.Token) { tok.Access[0].Actions = []string{"push", "pull"} }},
		{name: "a token for another repository is refused", key: key, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Access[0].Name = "keyward/other" }},
		{name: "a token for the repository does not open another one", key: key, repo: "keyward/other", want: http.StatusUnauthorized},
		{name: "a token granting only push is refused a pull", key: key, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Access[0].Actions = []string{"push"} }},
		{name: "a token with no access is refused", key: key, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Access = nil }},
		{name: "an expired token is refused", key: key, want: http.StatusUnauthorized,
			// beyond the registry's 60 s leeway
			edit: func(tok *registrytoken.Token) {
				tok.NotBefore = time.Now().Add(-10 * time.Minute)
				tok.Expiry = time.Now().Add(-5 * time.Minute)
			}},
		{name: "a token not yet valid is refused", key: key, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) {
				tok.NotBefore = time.Now().Add(5 * time.Minute)
				tok.Expiry = time.Now().Add(10 * time.Minute)
			}},
		{name: "a token for another registry is refused", key: key, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Audience = "registry.elsewhere.test" }},
		{name: "a token from another issuer is refused", key: key, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Issuer = "someone-else" }},
		{name: "a token signed by an untrusted key is refused", key: other, want: http.StatusUnauthorized},
		{name: "a token signed by an untrusted key naming a trusted kid is refused", key: other, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.KeyID = thumb }},
		{name: "a token signed by an untrusted key naming a JWKS kid is refused", key: other, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.KeyID = "keyward-2026-11" }},
		{name: "a token signed by an untrusted key with its own x5c is refused", key: other, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Chain = []*x509.Certificate{selfSign(t, other)} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			repo := tc.repo
			if repo == "" {
				repo = testregistry.Repository
			}
			code, challenge := status(t, reg, repo, mint(t, tc.key, reg, tc.edit))
			if code != tc.want {
				t.Fatalf("status %d, want %d (WWW-Authenticate: %s)", code, tc.want, challenge)
			}
			if code == http.StatusUnauthorized && !strings.HasPrefix(challenge, "Bearer realm=") {
				t.Errorf("refusal without a bearer challenge: %q", challenge)
			}
		})
	}
}

// TestTheRegistryAcceptsEveryTokenAlgorithmKeywardSigns: each algorithm,
// from a file-backend key, by kid and by x5c.
func TestTheRegistryAcceptsEveryTokenAlgorithmKeywardSigns(t *testing.T) {
	algs := []backends.Algorithm{
		backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.Ed25519,
		backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA256, backends.RSA3072PKCS1SHA384, backends.RSA3072PSSSHA512,
	}
	keys := map[backends.Algorithm]backends.Signer{}
	certs := map[backends.Algorithm]*x509.Certificate{}
	var roots []*x509.Certificate
	for _, alg := range algs {
		keys[alg] = fileKey(t, alg)
		certs[alg] = selfSign(t, keys[alg])
		roots = append(roots, certs[alg])
	}
	reg := testregistry.Start(t, testregistry.Options{RootCerts: roots})
	for _, alg := range algs {
		jalg, err := registrytoken.JOSEAlgorithm(alg)
		if err != nil {
			t.Fatal(err)
		}
		for _, x5c := range []bool{false, true} {
			name := string(alg) + " (" + jalg + ") by kid"
			if x5c {
				name = string(alg) + " (" + jalg + ") by x5c"
			}
			t.Run(name, func(t *testing.T) {
				tok := mint(t, keys[alg], reg, func(tok *registrytoken.Token) {
					if x5c {
						tok.Chain = []*x509.Certificate{certs[alg]}
					}
				})
				if code, challenge := status(t, reg, testregistry.Repository, tok); code != http.StatusOK {
					t.Fatalf("status %d, want 200 (WWW-Authenticate: %s)", code, challenge)
				}
			})
		}
	}
}

// TestARegistryLimitedToES256RefusesOtherAlgorithms: the registry's
// signingalgorithms option is a real allow-list.
func TestARegistryLimitedToES256RefusesOtherAlgorithms(t *testing.T) {
	es := fileKey(t, backends.ECDSAP256SHA256)
	rs := fileKey(t, backends.RSA2048PKCS1SHA256)
	reg := testregistry.Start(t, testregistry.Options{
		RootCerts:         []*x509.Certificate{selfSign(t, es), selfSign(t, rs)},
		SigningAlgorithms: []string{"ES256"},
	})
	if code, challenge := status(t, reg, testregistry.Repository, mint(t, es, reg, nil)); code != http.StatusOK {
		t.Fatalf("ES256: status %d, want 200 (%s)", code, challenge)
	}
	if code, _ := status(t, reg, testregistry.Repository, mint(t, rs, reg, nil)); code != http.StatusUnauthorized {
		t.Fatalf("RS256 to an ES256-only registry: status %d, want 401", code)
	}
}

// TestATokenKeyCertifiedByATrustedRootNeedsNoRegistryChange: with a root
// in the rootcertbundle, a new token-signing key whose certificate that
// root issued is accepted when the token carries the chain in x5c, so a
// token key can rotate without touching the registry's configuration; by
// kid alone it is not trusted (only the bundle's own keys have kids).
func TestATokenKeyCertifiedByATrustedRootNeedsNoRegistryChange(t *testing.T) {
	rootKey := fileKey(t, backends.ECDSAP256SHA256)
	root := selfSign(t, rootKey)
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{root}})

	leafKey := fileKey(t, backends.ECDSAP256SHA256)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "keyward registry tokens gen-2"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, SignatureAlgorithm: rootKey.SignatureAlgorithm(),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, root, leafKey.Public(), rootKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*registrytoken.Token)
		want int
	}{
		{name: "a token carrying the leaf and root pulls", want: http.StatusOK,
			edit: func(tok *registrytoken.Token) { tok.Chain = []*x509.Certificate{leaf, root} }},
		{name: "a token carrying the leaf alone pulls", want: http.StatusOK,
			edit: func(tok *registrytoken.Token) { tok.Chain = []*x509.Certificate{leaf} }},
		{name: "a token naming the leaf key by kid is refused", want: http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code, challenge := status(t, reg, testregistry.Repository, mint(t, leafKey, reg, tc.edit)); code != tc.want {
				t.Fatalf("status %d, want %d (WWW-Authenticate: %s)", code, tc.want, challenge)
			}
		})
	}
}
