package ca

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
	"math/big"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
)

func fileKey(t *testing.T, alg backends.Algorithm) backends.Signer {
	t.Helper()
	k, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: alg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func TestSelfSignMakesARootCA(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	root, err := SelfSign(context.Background(), key, Options{
		Subject: pkix.Name{CommonName: "test root"}, Lifetime: 30 * 24 * time.Hour, PathLen: 1,
		PermittedDNS: []string{".svc.cluster.local"}, ExcludedDNS: []string{"evil.example"},
		Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !root.IsCA || !root.BasicConstraintsValid || root.MaxPathLen != 1 {
		t.Errorf("basic constraints CA=%v valid=%v pathlen=%d, want CA, 1", root.IsCA, root.BasicConstraintsValid, root.MaxPathLen)
	}
	if root.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign {
		t.Errorf("key usage %v, want certSign|crlSign", root.KeyUsage)
	}
	if len(root.SubjectKeyId) != 20 {
		t.Errorf("subject key id %x", root.SubjectKeyId)
	}
	if !root.NotBefore.Equal(now.Add(-Backdate)) || !root.NotAfter.Equal(now.Add(30*24*time.Hour)) {
		t.Errorf("validity %s – %s", root.NotBefore, root.NotAfter)
	}
	if !slices.Equal(root.PermittedDNSDomains, []string{".svc.cluster.local"}) || !slices.Equal(root.ExcludedDNSDomains, []string{"evil.example"}) || !root.PermittedDNSDomainsCritical {
		t.Errorf("name constraints permitted %v excluded %v critical %v", root.PermittedDNSDomains, root.ExcludedDNSDomains, root.PermittedDNSDomainsCritical)
	}
	for _, e := range root.Extensions {
		if (e.Id.Equal(oidBasicConstraints) || e.Id.Equal(oidKeyUsage)) && !e.Critical {
			t.Errorf("extension %v not critical", e.Id)
		}
	}
	if err := root.CheckSignatureFrom(root); err != nil {
		t.Errorf("not self-signed: %v", err)
	}
	if _, err := CheckImport([]*x509.Certificate{root}, key.Public()); err != nil {
		t.Errorf("a self-signed root does not pass CheckImport: %v", err)
	}
}

func TestWeakParametersAreRefused(t *testing.T) {
	ec := fileKey(t, backends.ECDSAP256SHA256)
	cases := []struct {
		name string
		key  backends.Signer
		o    Options
	}{
		{"an RSA 2048 key is refused", fileKey(t, backends.RSA2048PKCS1SHA256), Options{Subject: pkix.Name{CommonName: "x"}, Lifetime: time.Hour}},
		{"a path length of 2 is refused", ec, Options{Subject: pkix.Name{CommonName: "x"}, Lifetime: time.Hour, PathLen: 2}},
		{"a lifetime over 20 years is refused", ec, Options{Subject: pkix.Name{CommonName: "x"}, Lifetime: 21 * 365 * 24 * time.Hour}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := SelfSign(context.Background(), tc.key, tc.o); !errors.Is(err, ErrWeak) {
				t.Errorf("SelfSign: got %v, want ErrWeak", err)
			}
			if tc.o.Lifetime < MaxLifetime {
				if _, err := CreateCSR(context.Background(), tc.key, tc.o); !errors.Is(err, ErrWeak) {
					t.Errorf("CreateCSR: got %v, want ErrWeak", err)
				}
			}
		})
	}
}

// The refusal of a short lifetime names every number that went into it.
func TestShortLifetimeIsRefusedWithTheNumbers(t *testing.T) {
	w := Windows{CanarySoak: time.Hour, PropagationWindow: 5 * time.Minute}
	err := CheckLifetime(25*time.Hour, 24*time.Hour, w)
	var le *LifetimeError
	if !errors.Is(err, ErrLifetimeTooShort) || !errors.As(err, &le) || le.LeafMax != 24*time.Hour {
		t.Fatalf("got %v, want a *LifetimeError matching ErrLifetimeTooShort", err)
	}
	want := "CA lifetime 25h0m0s is shorter than leaf maximum 24h0m0s + rotation windows 2h20m0s (canary soak 1h0m0s ×2, propagation window 5m0s ×4) = 26h20m0s"
	if err.Error() != want {
		t.Errorf("message\n%s\nwant\n%s", err, want)
	}
	if err := CheckLifetime(26*time.Hour+20*time.Minute, 24*time.Hour, w); err != nil {
		t.Errorf("exactly the minimum: %v", err)
	}
}

// ca is a CA held in memory, as an external root would be.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newCA(t *testing.T, parent *ca, key crypto.Signer, name string, pathLen int, mod func(*x509.Certificate)) *ca {
	t.Helper()
	if key == nil {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		key = k
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
		MaxPathLen: pathLen, MaxPathLenZero: pathLen == 0,
	}
	if mod != nil {
		mod(tmpl)
	}
	parentCert, parentKey := tmpl, key
	if parent != nil {
		parentCert, parentKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parentCert, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &ca{cert: c, key: key}
}

// A CSR from CreateCSR, signed by an external root that copies the
// requested extensions, gives an intermediate that CheckImport accepts with
// the issuers given in any order.
func TestCSRSignedByAnExternalRootImports(t *testing.T) {
	key := fileKey(t, backends.ECDSAP384SHA384)
	der, err := CreateCSR(context.Background(), key, Options{Subject: pkix.Name{CommonName: "keyward intermediate"}, PermittedDNS: []string{".example.com"}})
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := csr.CheckSignature(); err != nil {
		t.Fatal(err)
	}
	root := newCA(t, nil, nil, "external root", 2, nil)
	mid := newCA(t, root, nil, "external issuing", 1, nil)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7), Subject: csr.Subject,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour),
		ExtraExtensions: csr.Extensions,
	}
	certDER, err := x509.CreateCertificate(rand.Reader, tmpl, mid.cert, csr.PublicKey, mid.key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(certDER)
	if !cert.IsCA || cert.MaxPathLen != 0 || !cert.MaxPathLenZero || cert.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign ||
		!slices.Equal(cert.PermittedDNSDomains, []string{".example.com"}) {
		t.Fatalf("requested extensions did not come through: CA=%v pathlen=%d zero=%v ku=%v permitted=%v", cert.IsCA, cert.MaxPathLen, cert.MaxPathLenZero, cert.KeyUsage, cert.PermittedDNSDomains)
	}
	im, err := CheckImport([]*x509.Certificate{cert, root.cert, mid.cert}, key.Public())
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Issuers) != 2 || im.Issuers[0] != mid.cert || im.Issuers[1] != root.cert {
		t.Errorf("issuers not nearest first")
	}
}

func TestCheckImportRefusals(t *testing.T) {
	root := newCA(t, nil, nil, "root", 1, nil)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	good := newCA(t, root, key, "good", 0, nil)
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	weakRoot := newCA(t, nil, rsa2048, "weak root", 1, nil)
	zeroRoot := newCA(t, nil, nil, "root with path length 0", 0, nil)
	cases := []struct {
		name  string
		certs []*x509.Certificate
		pub   crypto.PublicKey
		want  error
	}{
		{"a certificate for another key is refused", []*x509.Certificate{good.cert, root.cert}, root.key.Public(), ErrNotForKey},
		{"a chain without its root is refused", []*x509.Certificate{good.cert}, key.Public(), ErrChain},
		{"a path length of 2 is refused", []*x509.Certificate{newCA(t, newCA(t, nil, nil, "r", 3, nil), key, "pl2", 2, nil).cert}, key.Public(), ErrWeak},
		{"a CA with no path length is refused", []*x509.Certificate{newCA(t, nil, key, "unbounded", -1, nil).cert}, key.Public(), ErrWeak},
		{"a root with path length 0 cannot have a CA below it", []*x509.Certificate{newCA(t, zeroRoot, key, "below zero", 0, nil).cert, zeroRoot.cert}, key.Public(), ErrChain},
		{"an RSA 2048 root is refused", []*x509.Certificate{newCA(t, weakRoot, key, "under weak", 0, nil).cert, weakRoot.cert}, key.Public(), ErrWeak},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := CheckImport(tc.certs, tc.pub); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
	if _, err := CheckImport([]*x509.Certificate{good.cert, root.cert}, key.Public()); err != nil {
		t.Errorf("a good chain is refused: %v", err)
	}
}

// A root of the right name but another key (a re-issued root) is named as
// the one that did not sign, not reported as "no issuer given".
func TestCheckImportNamesAnIssuerOfTheRightNameThatDidNotSign(t *testing.T) {
	root := newCA(t, nil, nil, "root", 1, nil)
	impostor := newCA(t, nil, nil, "root", 1, nil)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	mid := newCA(t, root, key, "intermediate", 0, nil)
	_, err := CheckImport([]*x509.Certificate{mid.cert, impostor.cert}, key.Public())
	if !errors.Is(err, ErrChain) {
		t.Fatalf("got %v, want ErrChain", err)
	}
	// The message is what this test is about.
	if !strings.Contains(err.Error(), `"CN=root" given in the chain`) || !strings.Contains(err.Error(), "did not sign") {
		t.Errorf("message %q does not say that the given root did not sign the intermediate", err)
	}
}

func TestParseSubject(t *testing.T) {
	n, err := ParseSubject(`CN=workload CA\, 2026,O=Example,OU=platform,C=DE`)
	if err != nil {
		t.Fatal(err)
	}
	if n.CommonName != "workload CA, 2026" || !slices.Equal(n.Organization, []string{"Example"}) || !slices.Equal(n.OrganizationalUnit, []string{"platform"}) || !slices.Equal(n.Country, []string{"DE"}) {
		t.Errorf("parsed %+v", n)
	}
	for _, bad := range []string{"CN", "XX=1", "CN="} {
		if _, err := ParseSubject(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
