package profile_test

import (
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/profile"
	"github.com/keyward/keyward/testsupport/lintgate"
)

// subjectKeys makes one key of every type kube-apiserver accepts in a
// PodCertificateRequest, as the node helper makes them.
func subjectKeys(t *testing.T) map[string]crypto.PublicKey {
	t.Helper()
	keys := map[string]crypto.PublicKey{}
	for _, kt := range config.AllKeyTypes() {
		k, err := nodehelper.GenerateKey(kt)
		if err != nil {
			t.Fatal(err)
		}
		keys[kt] = k.Public()
	}
	return keys
}

// interopProfile is one profile configuration the test issues under.
type interopProfile struct {
	name        string
	signer      config.Signer
	annotations map[string]string
	// eku is what a verifier asks of the leaf, one purpose at a time.
	eku []x509.ExtKeyUsage
	// critical: the leaf carries the PodIdentity extension critical and
	// every verifier that does not know it must refuse it.
	critical bool
}

func interopProfiles() []interopProfile {
	server := &config.Server{DNSNamesAnnotation: config.DefaultDNSNamesKey,
		AllowedDNSNames: []string{"{serviceAccount}.{namespace}.svc", "*.{namespace}.svc.cluster.local"}}
	long := strings.Repeat("a", 63) + ".shop.svc.cluster.local"
	return []interopProfile{
		{name: "podIdentity", eku: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			signer: config.Signer{Name: "keyward.dev/pod-identity", Profile: config.ProfilePodIdentity}},
		{name: "podIdentity critical", eku: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, critical: true,
			signer: config.Signer{Name: "keyward.dev/pod-identity", Profile: config.ProfilePodIdentity, PodIdentity: &config.PodIdentity{Critical: true}}},
		{name: "spiffe", eku: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			signer: config.Signer{Name: "keyward.dev/spiffe", Profile: config.ProfileSPIFFE, SPIFFE: &config.SPIFFE{TrustDomain: "cluster.local"}}},
		{name: "server", eku: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			signer:      config.Signer{Name: "keyward.dev/server", Profile: config.ProfileServer, Server: server},
			annotations: map[string]string{config.DefaultDNSNamesKey: "web.shop.svc, api.shop.svc.cluster.local"}},
		{name: "server with a name too long for a common name", eku: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
			signer:      config.Signer{Name: "keyward.dev/server", Profile: config.ProfileServer, Server: server},
			annotations: map[string]string{config.DefaultDNSNamesKey: long}},
	}
}

// interopCA is a root made by ca.SelfSign for a file-backend key.
type interopCA struct {
	auth *authority.Authority
	pem  string // path of the root's PEM file
}

func newInteropCA(t *testing.T, alg backends.Algorithm) interopCA {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	key, err := file.New().CreateKey(ctx, backends.CreateKeyRequest{URI: "file:" + filepath.Join(dir, "ca.key"), Algorithm: alg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { key.Close() })
	root, err := ca.SelfSign(ctx, key, ca.Options{Subject: pkix.Name{CommonName: "keyward interop " + string(alg)}, Lifetime: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authority.New(root, nil, key)
	if err != nil {
		t.Fatal(err)
	}
	return interopCA{auth: a, pem: writePEM(t, dir, "ca.pem", root)}
}

func writePEM(t *testing.T, dir, name string, c *x509.Certificate) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// opensslPath finds the system openssl. Without one the openssl checks
// are skipped on a workstation; under CI (CI set) that is a failure, since
// hack/install-deps.sh installs it.
func opensslPath(t *testing.T) string {
	t.Helper()
	path, err := exec.LookPath("openssl")
	if err == nil {
		return path
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("openssl is not installed (run hack/install-deps.sh): %v", err)
	}
	return ""
}

// Every profile, for every subject key type the apiserver accepts, under
// ECDSA, Ed25519 and RSA CAs, issues a leaf that the system openssl and Go's
// x509.Verify accept with default options for its purpose, and that zlint's
// RFC 5280/5480/8813 lints pass without an error or a warning. The opt-in
// critical PodIdentity extension is refused by both verifiers for exactly
// that reason.
func TestEveryProfileAndKeyTypeInteroperates(t *testing.T) {
	openssl := opensslPath(t)
	registry := lintgate.Registry(t)
	keys := subjectKeys(t)
	cas := []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.Ed25519, backends.RSA3072PKCS1SHA256, backends.RSA3072PSSSHA256}
	for _, caAlg := range cas {
		ca := newInteropCA(t, caAlg)
		t.Run("CA "+string(caAlg), func(t *testing.T) {
			t.Run("the root lints clean", func(t *testing.T) {
				lintgate.Clean(t, registry, ca.auth.Certificate())
			})
			eachProfileAndKeyType(t, func(t *testing.T, ip interopProfile, prof profile.Profile, kt string) {
				leaf := issue(t, ca, prof, ip, keys[kt])
				checkKeyUsage(t, leaf, ip)
				goVerify(t, ca, leaf, ip)
				lintgate.Clean(t, registry, leaf)
				if openssl != "" {
					opensslVerify(t, openssl, ca, leaf, ip)
				}
			})
		})
	}
	if openssl == "" {
		t.Skip("openssl is not installed: the openssl half of this test was skipped (set CI=true to make that a failure)")
	}
}

// eachProfileAndKeyType runs f in a subtest for every interop profile and
// every subject key type.
func eachProfileAndKeyType(t *testing.T, f func(t *testing.T, ip interopProfile, prof profile.Profile, kt string)) {
	t.Helper()
	for _, ip := range interopProfiles() {
		prof, err := profile.New(ip.signer)
		if err != nil {
			t.Fatal(err)
		}
		for _, kt := range config.AllKeyTypes() {
			t.Run(ip.name+" "+kt, func(t *testing.T) { f(t, ip, prof, kt) })
		}
	}
}

func issue(t *testing.T, ca interopCA, prof profile.Profile, ip interopProfile, pub crypto.PublicKey) *x509.Certificate {
	t.Helper()
	tmpl, err := prof.Template(profile.Request{
		SignerName: ip.signer.Name, Namespace: "shop", PodName: "web-0", PodUID: "0b7c3c1e-5c9e-4c53-9d36-6a1d2f6f7a10",
		ServiceAccountName: "web", ServiceAccountUID: "5f1f8a0c-2b1e-4d0e-8d35-0c3e0b1c9a2d",
		NodeName: "node-a", NodeUID: "9d0b8f5e-6a4c-4f3b-a1e2-3c4d5e6f7a8b",
		Annotations: ip.annotations, PublicKey: pub,
	})
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ca.auth.Sign(context.Background(), tmpl, pub, authority.Policy{Lifetime: 24 * time.Hour, Backdate: 2 * time.Minute, MinLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return leaf
}

// checkKeyUsage: digitalSignature for every leaf, keyEncipherment only for
// an RSA key that may be a TLS server, a key id linking leaf to CA.
func checkKeyUsage(t *testing.T, leaf *x509.Certificate, ip interopProfile) {
	t.Helper()
	want := x509.KeyUsageDigitalSignature
	if _, rsaKey := leaf.PublicKey.(*rsa.PublicKey); rsaKey && slices.Contains(ip.eku, x509.ExtKeyUsageServerAuth) {
		want |= x509.KeyUsageKeyEncipherment
	}
	if leaf.KeyUsage != want {
		t.Errorf("key usage %b, want %b", leaf.KeyUsage, want)
	}
	if len(leaf.SubjectKeyId) == 0 || len(leaf.AuthorityKeyId) == 0 {
		t.Errorf("subject key id %x, authority key id %x: want both", leaf.SubjectKeyId, leaf.AuthorityKeyId)
	}
}

// goVerify runs x509.Verify with nothing but the root and the purpose.
func goVerify(t *testing.T, ca interopCA, leaf *x509.Certificate, ip interopProfile) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(ca.auth.Certificate())
	for _, eku := range ip.eku {
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{eku}})
		if ip.critical {
			var unhandled x509.UnhandledCriticalExtension
			if !errors.As(err, &unhandled) {
				t.Errorf("x509.Verify of a leaf with a critical PodIdentity extension: got %v, want UnhandledCriticalExtension", err)
			}
			if len(leaf.UnhandledCriticalExtensions) != 1 || !leaf.UnhandledCriticalExtensions[0].Equal(profile.OIDPodIdentity) {
				t.Errorf("unhandled critical extensions %v, want the PodIdentity extension alone", leaf.UnhandledCriticalExtensions)
			}
			continue
		}
		if err != nil {
			t.Errorf("x509.Verify for %v: %v", eku, err)
		}
	}
}

// opensslVerify runs `openssl verify -x509_strict -purpose …` for each of
// the leaf's purposes.
func opensslVerify(t *testing.T, openssl string, ca interopCA, leaf *x509.Certificate, ip interopProfile) {
	t.Helper()
	leafPEM := writePEM(t, t.TempDir(), "leaf.pem", leaf)
	for _, eku := range ip.eku {
		purpose := map[x509.ExtKeyUsage]string{x509.ExtKeyUsageClientAuth: "sslclient", x509.ExtKeyUsageServerAuth: "sslserver"}[eku]
		out, err := exec.Command(openssl, "verify", "-x509_strict", "-CAfile", ca.pem, "-purpose", purpose, leafPEM).CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("running openssl: %v", err)
		}
		if ip.critical {
			// What openssl says is exactly what this case is about.
			if err == nil || !strings.Contains(string(out), "unhandled critical extension") {
				t.Errorf("openssl verify -purpose %s of a leaf with a critical PodIdentity extension: %v\n%s\nwant refusal for an unhandled critical extension", purpose, err, out)
			}
			continue
		}
		if err != nil {
			t.Errorf("openssl verify -purpose %s: %v\n%s", purpose, err, out)
		}
	}
}

// Every PodCertificateRequest profile issues, for every subject key type
// and under every CA generation `ca init` makes (lintgate.Generations: each
// algorithm, path length 1 with name constraints, an intermediate), a leaf
// that zlint's RFC 5280/5480/8813 lints pass. The interop test above does
// the same under ca.SelfSign test roots.
func TestLintGatePCRProfiles(t *testing.T) {
	reg := lintgate.Registry(t)
	covered := map[string]bool{}
	for _, ip := range interopProfiles() {
		covered[ip.signer.Profile] = true
	}
	for _, p := range []string{config.ProfilePodIdentity, config.ProfileSPIFFE, config.ProfileServer} {
		if !covered[p] {
			t.Errorf("profile %s is not among the linted profiles", p)
		}
	}
	keys := subjectKeys(t)
	for _, gen := range lintgate.Generations(t) {
		t.Run(gen.Name, func(t *testing.T) {
			ca := interopCA{auth: gen.Auth}
			eachProfileAndKeyType(t, func(t *testing.T, ip interopProfile, prof profile.Profile, kt string) {
				lintgate.Clean(t, reg, issue(t, ca, prof, ip, keys[kt]))
			})
		})
	}
}
