package softhsmtests

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"io"
	"math/big"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// tokenKey creates a key of alg in the run's SoftHSM token through
// keyward's pkcs11 backend, and a self-signed certificate for it (the
// registry's rootcertbundle entry). The key stays open until the test ends.
func tokenKey(t *testing.T, alg backends.Algorithm) (backends.Signer, *x509.Certificate) {
	t.Helper()
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	ctx := testContext(t)
	key, err := reg.CreateKey(ctx, backends.CreateKeyRequest{URI: tokenKeyURI(uniqueName(t, "regtoken")), Algorithm: alg})
	if err != nil {
		t.Fatalf("creating a %s token-signing key in SoftHSM: %v", alg, err)
	}
	t.Cleanup(func() { key.Close() })
	// The registry trusts the token key's own certificate, not a CA of
	// keyward's: RSA 2048 token keys are in scope here, below ca's 3072-bit
	// floor for CA keys, so the certificate is made directly.
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(now.UnixNano()), Subject: pkix.Name{CommonName: "keyward registry tokens"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(24 * time.Hour), SignatureAlgorithm: key.SignatureAlgorithm(),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

func pullStatus(t *testing.T, reg *testregistry.Registry, tok string) (int, string) {
	t.Helper()
	resp := reg.GetManifest(t, testregistry.Repository, tok)
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode == http.StatusOK && resp.Header.Get("Docker-Content-Digest") != reg.ManifestDigest {
		t.Errorf("pulled digest %q, pushed %q", resp.Header.Get("Docker-Content-Digest"), reg.ManifestDigest)
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate")
}

// TestARegistryAcceptsTokensSignedInTheHSM: a CNCF Distribution registry,
// in this process, trusting a SoftHSM key's certificate, lets a token
// signed in the HSM (through backends.Signer) pull the repository it
// names, and refuses a token for another repository, an expired one, and
// one signed by another HSM key it does not trust.
func TestARegistryAcceptsTokensSignedInTheHSM(t *testing.T) {
	algs := []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA256}
	keys := map[backends.Algorithm]backends.Signer{}
	certs := map[backends.Algorithm]*x509.Certificate{}
	var roots []*x509.Certificate
	for _, alg := range algs {
		keys[alg], certs[alg] = tokenKey(t, alg)
		roots = append(roots, certs[alg])
	}
	untrusted, untrustedCert := tokenKey(t, backends.ECDSAP256SHA256)
	reg := testregistry.Start(t, testregistry.Options{RootCerts: roots})

	if code, challenge := pullStatus(t, reg, ""); code != http.StatusUnauthorized || !strings.Contains(challenge, `scope="repository:`+testregistry.Repository+`:pull"`) {
		t.Fatalf("anonymous pull: %d %q, want 401 with a pull challenge", code, challenge)
	}

	type tc struct {
		name string
		key  backends.Signer
		edit func(*registrytoken.Token)
		want int
	}
	var cases []tc
	for _, alg := range algs {
		jalg, err := registrytoken.JOSEAlgorithm(alg)
		if err != nil {
			t.Fatal(err)
		}
		cert := certs[alg]
		cases = append(cases,
			tc{name: "an HSM " + jalg + " token naming its key by kid pulls", key: keys[alg], want: http.StatusOK},
			tc{name: "an HSM " + jalg + " token carrying its certificate pulls", key: keys[alg], want: http.StatusOK,
				edit: func(tok *registrytoken.Token) { tok.Chain = []*x509.Certificate{cert} }})
	}
	es256 := keys[backends.ECDSAP256SHA256]
	cases = append(cases,
		tc{name: "an HSM token for another repository is refused", key: es256, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Access[0].Name = "keyward/other" }},
		tc{name: "an expired HSM token is refused", key: es256, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) {
				tok.NotBefore = time.Now().Add(-10 * time.Minute)
				tok.Expiry = time.Now().Add(-5 * time.Minute) // beyond the registry's 60 s leeway
			}},
		tc{name: "a token signed by an untrusted HSM key is refused", key: untrusted, want: http.StatusUnauthorized},
		tc{name: "a token signed by an untrusted HSM key with its own certificate is refused", key: untrusted, want: http.StatusUnauthorized,
			edit: func(tok *registrytoken.Token) { tok.Chain = []*x509.Certificate{untrustedCert} }},
	)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			now := time.Now()
			tok := registrytoken.Token{
				Issuer: reg.Issuer, Audience: reg.Service, Subject: "system:serviceaccount:team-a:puller",
				Access:    []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
				NotBefore: now, Expiry: now.Add(5 * time.Minute),
			}
			if c.edit != nil {
				c.edit(&tok)
			}
			raw, err := registrytoken.Mint(testContext(t), c.key, tok)
			if err != nil {
				t.Fatalf("minting in the HSM: %v", err)
			}
			if code, challenge := pullStatus(t, reg, raw); code != c.want {
				t.Fatalf("status %d, want %d (WWW-Authenticate: %s)", code, c.want, challenge)
			}
		})
	}
}
