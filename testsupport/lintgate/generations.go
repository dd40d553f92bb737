package lintgate

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/signer/authority"
)

// Generation is a CA generation made the way `keyward ca init` makes one,
// with a file-backend key: a self-signed root (ca.SelfSign), or an
// intermediate from its --csr-out request (ca.CreateCSR) signed by an
// external root.
type Generation struct {
	Name string
	Auth *authority.Authority
	// Made are the CA certificates keyward made and lints: the root, or
	// for an intermediate the request's subject and extensions as an
	// external CA that grants them exactly issues them.
	Made []*x509.Certificate
}

// Generations makes every shape of CA generation keyward makes: each
// --algorithm `ca init` offers at its defaults (subject "CN=<signer> CA
// <generation>", path length 0, a year), one with a full --subject,
// --path-len 1 and name constraints, and an intermediate. RSA4096 is left
// out under -short (its key takes seconds on a loaded machine).
func Generations(t testing.TB) []Generation {
	t.Helper()
	algs := []string{"ECDSAP256", "ECDSAP384", "RSA3072", "RSA4096"}
	if testing.Short() {
		algs = algs[:3]
	}
	var gens []Generation
	for _, name := range algs {
		alg := caInitAlgorithms[name]
		key := newKey(t, alg)
		root := selfSign(t, key, ca.Options{Subject: pkix.Name{CommonName: "keyward.dev/lint CA " + strings.ToLower(name)}, Lifetime: 365 * 24 * time.Hour})
		gens = append(gens, Generation{Name: "ca init --algorithm " + name, Auth: newAuthority(t, root, nil, key), Made: []*x509.Certificate{root}})
	}

	full := ca.Options{
		Subject:      mustSubject(t, "CN=workload CA 2026-11,O=Example,OU=Platform,C=DE,ST=Berlin,L=Berlin"),
		Lifetime:     2 * 365 * 24 * time.Hour,
		PathLen:      1,
		PermittedDNS: []string{".svc.cluster.local", "example.com"},
		ExcludedDNS:  []string{"admin.example.com"},
	}
	key := newKey(t, backends.RSA3072PKCS1SHA256)
	root := selfSign(t, key, full)
	gens = append(gens, Generation{Name: "ca init --subject --path-len 1 --permitted-dns --excluded-dns", Auth: newAuthority(t, root, nil, key), Made: []*x509.Certificate{root}})

	gens = append(gens, intermediate(t))
	return gens
}

// caInitAlgorithms are ca init's --algorithm short names (cmd/keyward/app)
// that it accepts as strong enough.
var caInitAlgorithms = map[string]backends.Algorithm{
	"ECDSAP256": backends.ECDSAP256SHA256,
	"ECDSAP384": backends.ECDSAP384SHA384,
	"RSA3072":   backends.RSA3072PKCS1SHA256,
	"RSA4096":   backends.RSA4096PKCS1SHA256,
}

// intermediate is `ca init --csr-out` then `ca import`: keyward's request,
// signed by an external root that grants exactly the extensions asked for
// (subject key id added, as every CA tool does).
func intermediate(t testing.TB) Generation {
	t.Helper()
	ctx := context.Background()
	extKey := newKey(t, backends.ECDSAP384SHA384)
	extRoot := selfSign(t, extKey, ca.Options{Subject: pkix.Name{CommonName: "external offline root", Organization: []string{"Example"}}, Lifetime: 5 * 365 * 24 * time.Hour, PathLen: 1})

	key := newKey(t, backends.ECDSAP256SHA256)
	der, err := ca.CreateCSR(ctx, key, ca.Options{Subject: pkix.Name{CommonName: "keyward.dev/lint CA intermediate"}, PermittedDNS: []string{".svc.cluster.local"}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := x509.ParseCertificateRequest(der)
	if err != nil {
		t.Fatal(err)
	}
	if err := req.CheckSignature(); err != nil {
		t.Fatalf("ca init's certificate request does not verify: %v", err)
	}
	skid, err := ca.SubjectKeyID(req.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:    serial(t),
		Subject:         req.Subject,
		NotBefore:       now.Add(-time.Hour).Truncate(time.Second),
		NotAfter:        now.Add(365 * 24 * time.Hour).Truncate(time.Second),
		SubjectKeyId:    skid,
		ExtraExtensions: req.Extensions,
	}
	signed, err := x509.CreateCertificate(rand.Reader, tmpl, extRoot, req.PublicKey, extKey)
	if err != nil {
		t.Fatalf("the external root signing ca init's request: %v", err)
	}
	inter, err := x509.ParseCertificate(signed)
	if err != nil {
		t.Fatal(err)
	}
	// What ca import checks before it adds the generation.
	if _, err := ca.CheckImport([]*x509.Certificate{inter, extRoot}, key.Public()); err != nil {
		t.Fatalf("ca import refuses the intermediate: %v", err)
	}
	return Generation{Name: "ca init --csr-out, signed externally, ca import", Auth: newAuthority(t, inter, []*x509.Certificate{extRoot}, key), Made: []*x509.Certificate{inter}}
}

func newKey(t testing.TB, alg backends.Algorithm) backends.Signer {
	t.Helper()
	key, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{URI: "file:" + filepath.Join(t.TempDir(), "ca.key"), Algorithm: alg})
	if err != nil {
		t.Fatalf("creating a %s CA key: %v", alg, err)
	}
	t.Cleanup(func() { key.Close() })
	return key
}

func selfSign(t testing.TB, key backends.Signer, o ca.Options) *x509.Certificate {
	t.Helper()
	root, err := ca.SelfSign(context.Background(), key, o)
	if err != nil {
		t.Fatalf("self-signing %q: %v", o.Subject, err)
	}
	return root
}

func newAuthority(t testing.TB, cert *x509.Certificate, chain []*x509.Certificate, key backends.Signer) *authority.Authority {
	t.Helper()
	a, err := authority.New(cert, chain, key)
	if err != nil {
		t.Fatalf("authority for %q: %v", cert.Subject, err)
	}
	return a
}

func mustSubject(t testing.TB, s string) pkix.Name {
	t.Helper()
	n, err := ca.ParseSubject(s)
	if err != nil {
		t.Fatalf("subject %q: %v", s, err)
	}
	return n
}

// serial is a positive 127-bit serial number, as keyward's own CAs draw.
func serial(t testing.TB) *big.Int {
	t.Helper()
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		t.Fatal(err)
	}
	return s.Add(s, big.NewInt(1))
}
