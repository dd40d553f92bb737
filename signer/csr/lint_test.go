package csr

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/testsupport/lintgate"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// lintCase is one request a CSR profile signs: the request's subject and
// SANs and the spec.usages asked for.
type lintCase struct {
	name    string
	signer  config.Signer
	subject pkix.Name
	dns     []string
	ips     []net.IP
	uris    []*url.URL
	usages  []certv1.KeyUsage
}

func lintCases() []lintCase {
	node := pkix.Name{CommonName: "system:node:node-a", Organization: []string{"system:nodes"}}
	k8s := func(profile string) config.Signer {
		return config.Signer{Name: config.KubernetesSignerNames[profile], Profile: profile}
	}
	spiffe, _ := url.Parse("spiffe://cluster.local/ns/shop/sa/web")
	custom := config.Signer{Name: "keyward.dev/node-daemons", Profile: config.ProfileCSR, CSR: &config.CSRPolicy{
		TrustDistribution: "ClusterTrustBundle keyward.dev:node-daemons:live",
		CommonNames:       []string{"*.demo-node"}, Organizations: []string{"example"},
		DNSNames: []string{"*.demo-node"}, IPRanges: []string{"10.0.0.0/8"}, URIs: []string{"spiffe://cluster.local/*"},
		KeyUsages: []string{"digital signature", "client auth", "server auth"},
	}}
	sansOnly := custom
	sansOnly.CSR = &config.CSRPolicy{TrustDistribution: custom.CSR.TrustDistribution, DNSNames: []string{"*.demo-node"},
		KeyUsages: []string{"digital signature", "client auth"}}
	return []lintCase{
		{name: "kube-apiserver-client", signer: k8s(config.ProfileKubeAPIServerClient),
			subject: pkix.Name{CommonName: "alice", Organization: []string{"dev"}}, usages: []certv1.KeyUsage{certv1.UsageClientAuth}},
		{name: "kube-apiserver-client with digital signature", signer: k8s(config.ProfileKubeAPIServerClient),
			subject: pkix.Name{CommonName: "alice"}, usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
		{name: "kubelet client", signer: k8s(config.ProfileKubeAPIServerClientKubelet),
			subject: node, usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
		{name: "kubelet client with key encipherment", signer: k8s(config.ProfileKubeAPIServerClientKubelet),
			subject: node, usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageClientAuth}},
		{name: "kubelet serving with key encipherment", signer: k8s(config.ProfileKubeletServing), subject: node, dns: []string{"node-a"},
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment, certv1.UsageServerAuth}},
		{name: "kubelet serving", signer: k8s(config.ProfileKubeletServing), subject: node,
			dns: []string{"node-a", "node-a.example.com"}, ips: []net.IP{net.ParseIP("10.0.0.7"), net.ParseIP("fd00::7")},
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageServerAuth}},
		{name: "csr profile (custom signer name)", signer: custom,
			subject: pkix.Name{CommonName: "daemon.demo-node", Organization: []string{"example"}},
			dns:     []string{"daemon.demo-node"}, ips: []net.IP{net.ParseIP("10.1.2.3")}, uris: []*url.URL{spiffe},
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth, certv1.UsageServerAuth}},
		{name: "csr profile, empty subject and a DNS name", signer: sansOnly, dns: []string{"daemon.demo-node"},
			usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
	}
}

// What every CSR signer profile writes to status.certificate, for every
// key type and under every CA generation keyward makes, passes zlint's RFC
// 5280/5480/8813 lints: the leaf and each issuer sent with it. The
// certificate comes from the controller's own sync, as kube-apiserver
// would receive it.
func TestLintGateCSRSigners(t *testing.T) {
	reg := lintgate.Registry(t)
	keys := map[string]crypto.Signer{}
	for _, kt := range config.AllKeyTypes() {
		k, err := nodehelper.GenerateKey(kt)
		if err != nil {
			t.Fatal(err)
		}
		keys[kt] = k
	}
	for _, gen := range lintgate.Generations(t) {
		t.Run(gen.Name, func(t *testing.T) {
			for _, lc := range lintCases() {
				for _, kt := range config.AllKeyTypes() {
					t.Run(lc.name+" "+kt, func(t *testing.T) {
						out := signWithController(t, gen, lc, keys[kt])
						certs := parseChain(t, out)
						// The leaf, then the issuers below the root: an
						// intermediate's certificate is linted here too.
						if want := 1 + len(parseChain(t, gen.Auth.IssuersPEM())); len(certs) != want {
							t.Fatalf("status.certificate holds %d certificates, want %d", len(certs), want)
						}
						lintgate.Clean(t, reg, certs[0], keyEnciphermentExemptions(lc.usages, keys[kt].Public())...)
						for _, c := range certs[1:] {
							lintgate.Clean(t, reg, c)
						}
					})
				}
			}
		})
	}
}

// keyEnciphermentExemptions are the two lints a leaf breaks because the
// request asked for "key encipherment", which kube-controller-manager's
// rules for the kubernetes.io names (KEP-1513) accept with any key and any
// purpose and keyward then grants as asked: the certificate carries exactly
// spec.usages (docs/signers.md). kubelet and keyward's node agent ask for it
// with an RSA client key. Neither lets the key do more: a TLS client only
// signs, and an EC or Ed25519 key cannot encipher a key. docs/security.md
// records it as a finding (drop the bit where it cannot apply, or keep
// kube-controller-manager's behaviour); the exemptions cover nothing else.
func keyEnciphermentExemptions(usages []certv1.KeyUsage, pub crypto.PublicKey) []lintgate.Exemption {
	if !slices.Contains(usages, certv1.UsageKeyEncipherment) {
		return nil
	}
	var ex []lintgate.Exemption
	if slices.Contains(usages, certv1.UsageClientAuth) && !slices.Contains(usages, certv1.UsageServerAuth) {
		ex = append(ex, lintgate.Exemption{Lint: "e_key_usage_and_extended_key_usage_inconsistent",
			Reason: "RFC 5280 4.2.1.12 lists digitalSignature/keyAgreement for clientAuth; spec.usages asked for key encipherment too"})
	}
	if _, ec := pub.(*ecdsa.PublicKey); ec {
		ex = append(ex, lintgate.Exemption{Lint: "e_ecdsa_allowed_ku",
			Reason: "RFC 5480 forbids keyEncipherment for an EC key; spec.usages asked for it and the kubernetes.io rules accept it"})
	}
	return ex
}

// signWithController runs one sync of a controller for lc's signer over an
// approved CSR and returns the status.certificate it wrote.
func signWithController(t *testing.T, gen lintgate.Generation, lc lintCase, key crypto.Signer) []byte {
	t.Helper()
	lc.signer.MaxLifetime = metav1.Duration{Duration: 24 * time.Hour}
	lc.signer.Backdate = &metav1.Duration{Duration: 5 * time.Minute}
	p, err := NewPolicy(lc.signer)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: lc.subject, DNSNames: lc.dns, IPAddresses: lc.ips, URIs: lc.uris}, key)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("lint-%d", time.Now().UnixNano())
	c := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-uid")},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: lc.signer.Name, Usages: lc.usages,
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
		Status: certv1.CertificateSigningRequestStatus{Conditions: []certv1.CertificateSigningRequestCondition{
			{Type: certv1.CertificateApproved, Status: corev1.ConditionTrue}}},
	}
	ctrl, client := unitController(t, &Signer{Policy: p, Issuer: issuer.Static{Authority: gen.Auth, Generation: "g1"}}, nil, c)
	if _, err := ctrl.sync(context.Background(), queueKey{signer: lc.signer.Name, name: name}); err != nil {
		t.Fatal(err)
	}
	updates := statusUpdates(client)
	if len(updates) != 1 {
		t.Fatalf("%d status updates, want 1", len(updates))
	}
	if cond := updates[0].Status.Conditions; len(updates[0].Status.Certificate) == 0 {
		t.Fatalf("no certificate written; conditions %+v", cond)
	}
	return updates[0].Status.Certificate
}

func parseChain(t *testing.T, data []byte) []*x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return certs
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatalf("status.certificate: %v", err)
		}
		certs = append(certs, c)
	}
}
