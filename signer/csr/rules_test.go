package csr_test

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var ecKey, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

func request(t *testing.T, key crypto.Signer, tmpl x509.CertificateRequest) *x509.CertificateRequest {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	req, err := csr.ParseRequest(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func policy(t testing.TB, sc config.Signer) *csr.Policy {
	t.Helper()
	if sc.Name == "" {
		sc.Name = config.KubernetesSignerNames[sc.Profile]
	}
	sc.AllowedKeyTypes = config.AllKeyTypes()
	sc.MaxLifetime = metav1.Duration{Duration: 24 * time.Hour}
	p, err := csr.NewPolicy(sc)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func u(us ...string) []certv1.KeyUsage {
	var out []certv1.KeyUsage
	for _, s := range us {
		out = append(out, certv1.KeyUsage(s))
	}
	return out
}

func ext(id asn1.ObjectIdentifier, v any) pkix.Extension {
	b, _ := asn1.Marshal(v)
	return pkix.Extension{Id: id, Value: b}
}

type basicConstraints struct {
	IsCA bool `asn1:"optional"`
}

var (
	node        = pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}
	custom      = config.Signer{Name: "example.com/node-daemons", Profile: config.ProfileCSR, CSR: &config.CSRPolicy{TrustDistribution: "x", CommonNames: []string{"*.nodes.example.com"}, Organizations: []string{"example"}, DNSNames: []string{"*.nodes.example.com"}, IPRanges: []string{"10.0.0.0/8"}, URIs: []string{"spiffe://example.com/*"}, KeyUsages: []string{"digital signature", "client auth"}}}
	apiClient   = config.Signer{Profile: config.ProfileKubeAPIServerClient}
	kubeletCli  = config.Signer{Profile: config.ProfileKubeAPIServerClientKubelet}
	kubeletServ = config.Signer{Profile: config.ProfileKubeletServing}
)

func TestRules(t *testing.T) {
	rsaKey, err := rsa.GenerateKey(rand.Reader, 3072)
	if err != nil {
		t.Fatal(err)
	}
	rsa2048, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	uri, _ := url.Parse("spiffe://example.com/ns/a")
	other, _ := url.Parse("spiffe://evil.example/x")
	cases := []struct {
		name   string
		signer config.Signer
		key    crypto.Signer
		req    x509.CertificateRequest
		usages []certv1.KeyUsage
		want   string // "" signs; else the Failed reason
	}{
		{"a kube-apiserver-client request with any subject and SANs and client auth is signed", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice", Organization: []string{"devs"}}, DNSNames: []string{"x"}}, u("client auth"), ""},
		{"a kube-apiserver-client request may add digital signature and key encipherment", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, u("digital signature", "key encipherment", "client auth"), ""},
		{"a kube-apiserver-client request without client auth fails", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, u("digital signature"), csr.ReasonUsagesNotPermitted},
		{"a kube-apiserver-client request asking server auth fails", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, u("client auth", "server auth"), csr.ReasonUsagesNotPermitted},
		{"a kube-apiserver-client request asking cert sign fails as a CA request", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, u("client auth", "cert sign"), csr.ReasonCARequested},
		{"a request asking basicConstraints CA:TRUE fails", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}, ExtraExtensions: []pkix.Extension{ext(asn1.ObjectIdentifier{2, 5, 29, 19}, basicConstraints{IsCA: true})}}, u("client auth"), csr.ReasonCARequested},
		{"a kubernetes.io request's other extensions are discarded, not failed", apiClient, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}, ExtraExtensions: []pkix.Extension{ext(asn1.ObjectIdentifier{1, 2, 3, 4}, 1)}}, u("client auth"), ""},
		{"an RSA-2048 key fails as unsupported", apiClient, rsa2048, x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, u("client auth"), csr.ReasonUnsupportedKeyType},

		{"a kubelet client request from a node with the ECDSA usages is signed", kubeletCli, nil, x509.CertificateRequest{Subject: node}, u("digital signature", "client auth"), ""},
		{"a kubelet client request with key encipherment too is signed", kubeletCli, rsaKey, x509.CertificateRequest{Subject: node}, u("key encipherment", "digital signature", "client auth"), ""},
		{"a kubelet client request without digital signature fails", kubeletCli, nil, x509.CertificateRequest{Subject: node}, u("client auth"), csr.ReasonUsagesNotPermitted},
		{"a kubelet client request with a DNS SAN fails", kubeletCli, nil, x509.CertificateRequest{Subject: node, DNSNames: []string{"n1"}}, u("digital signature", "client auth"), csr.ReasonSANNotPermitted},
		{"a kubelet client request outside system:nodes fails", kubeletCli, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes", "system:masters"}}}, u("digital signature", "client auth"), csr.ReasonSubjectNotPermitted},
		{"a kubelet client request with another CN fails", kubeletCli, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "n1", Organization: []string{"system:nodes"}}}, u("digital signature", "client auth"), csr.ReasonSubjectNotPermitted},

		{"a kubelet serving request with an IP and DNS SAN is signed", kubeletServ, nil, x509.CertificateRequest{Subject: node, DNSNames: []string{"n1"}, IPAddresses: []net.IP{net.ParseIP("10.1.2.3")}}, u("digital signature", "server auth"), ""},
		{"a kubelet serving request without a SAN fails", kubeletServ, nil, x509.CertificateRequest{Subject: node}, u("digital signature", "server auth"), csr.ReasonSANNotPermitted},
		{"a kubelet serving request with a URI SAN fails", kubeletServ, nil, x509.CertificateRequest{Subject: node, DNSNames: []string{"n1"}, URIs: []*url.URL{uri}}, u("digital signature", "server auth"), csr.ReasonSANNotPermitted},
		{"a kubelet serving request for a wildcard DNS name fails even when approved", kubeletServ, nil, x509.CertificateRequest{Subject: node, DNSNames: []string{"n1", "*.nodes.example.com"}}, u("digital signature", "server auth"), csr.ReasonSANNotPermitted},
		{"a kubelet serving request with a star inside a DNS label fails", kubeletServ, nil, x509.CertificateRequest{Subject: node, DNSNames: []string{"n*.nodes.example.com"}}, u("digital signature", "server auth"), csr.ReasonSANNotPermitted},
		{"a kubelet serving request whose node name holds a star fails", kubeletServ, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:*", Organization: []string{"system:nodes"}}, DNSNames: []string{"n1"}}, u("digital signature", "server auth"), csr.ReasonSubjectNotPermitted},
		{"a kubelet serving request with client auth too fails", kubeletServ, nil, x509.CertificateRequest{Subject: node, DNSNames: []string{"n1"}}, u("digital signature", "server auth", "client auth"), csr.ReasonUsagesNotPermitted},

		{"a custom request inside every rule is signed", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com", Organization: []string{"example"}}, DNSNames: []string{"a.nodes.example.com"}, IPAddresses: []net.IP{net.ParseIP("10.9.9.9")}, URIs: []*url.URL{uri}}, u("client auth"), ""},
		{"a custom request without a CN fails when commonNames are set", custom, nil, x509.CertificateRequest{DNSNames: []string{"a.nodes.example.com"}}, u("client auth"), csr.ReasonSubjectNotPermitted},
		{"a custom request whose CN is a wildcard fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "*.nodes.example.com"}}, u("client auth"), csr.ReasonSubjectNotPermitted},
		{"a custom request's CN is matched case-sensitively", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.NODES.example.com"}}, u("client auth"), csr.ReasonSubjectNotPermitted},
		{"a custom request's DNS names are matched case-insensitively", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, DNSNames: []string{"A.Nodes.Example.com"}}, u("client auth"), ""},
		{"a custom request with a CN outside the patterns fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.b.nodes.example.com"}}, u("client auth"), csr.ReasonSubjectNotPermitted},
		{"a custom request with another organization fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com", Organization: []string{"system:masters"}}}, u("client auth"), csr.ReasonSubjectNotPermitted},
		{"a custom request with an OU fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com", OrganizationalUnit: []string{"x"}}}, u("client auth"), csr.ReasonSubjectNotPermitted},
		{"a custom request with a DNS SAN outside the patterns fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, DNSNames: []string{"evil.example.com"}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request with an IP outside the ranges fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, IPAddresses: []net.IP{net.ParseIP("192.168.0.1")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request with a URI outside the patterns fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{other}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request whose URI under a star pattern has a dot-dot segment fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{mustURL(t, "spiffe://example.com/ns/a/../b")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request whose URI under a star pattern has a leading dot-dot segment fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{mustURL(t, "spiffe://example.com/../x")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request whose URI under a star pattern has an empty segment fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{mustURL(t, "spiffe://example.com/ns//a")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request whose URI under a star pattern has a %-escape fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{mustURL(t, "spiffe://example.com/ns/%2e%2e/a")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request whose URI under a star pattern has a query fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{mustURL(t, "spiffe://example.com/ns/a?x=1")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request whose URI under a star pattern has a fragment fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, URIs: []*url.URL{mustURL(t, "spiffe://example.com/ns/a#f")}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request with an email SAN fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, EmailAddresses: []string{"a@example.com"}}, u("client auth"), csr.ReasonSANNotPermitted},
		{"a custom request asking a usage not configured fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}}, u("client auth", "server auth"), csr.ReasonUsagesNotPermitted},
		{"a custom request asking no usage fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}}, nil, csr.ReasonUsagesNotPermitted},
		{"a custom request asking another extension fails", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, ExtraExtensions: []pkix.Extension{ext(asn1.ObjectIdentifier{1, 2, 3, 4}, 1)}}, u("client auth"), csr.ReasonExtensionNotPermitted},
		{"a custom request with basicConstraints CA:FALSE is tolerated", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, ExtraExtensions: []pkix.Extension{ext(asn1.ObjectIdentifier{2, 5, 29, 19}, basicConstraints{})}}, u("client auth"), ""},
		{"a custom request asking CA:TRUE fails as a CA request", custom, nil, x509.CertificateRequest{Subject: pkix.Name{CommonName: "a.nodes.example.com"}, ExtraExtensions: []pkix.Extension{ext(asn1.ObjectIdentifier{2, 5, 29, 19}, basicConstraints{IsCA: true})}}, u("client auth"), csr.ReasonCARequested},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := tc.key
			if key == nil {
				key = ecKey
			}
			v := policy(t, tc.signer).Check(request(t, key, tc.req), tc.usages)
			switch {
			case tc.want == "" && v != nil:
				t.Fatalf("Failed %s: %s", v.Reason, v.Message)
			case tc.want != "" && v == nil:
				t.Fatalf("signed, want Failed %s", tc.want)
			case tc.want != "" && v.Reason != tc.want:
				t.Fatalf("Failed %s (%s), want %s", v.Reason, v.Message, tc.want)
			}
		})
	}
}

func TestARequestWhoseSignatureDoesNotVerifyIsInvalid(t *testing.T) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, ecKey)
	if err != nil {
		t.Fatal(err)
	}
	der[len(der)-3] ^= 0xff // inside the signature
	_, err = csr.ParseRequest(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	var v *csr.Violation
	if !errors.As(err, &v) || v.Reason != csr.ReasonInvalidRequest {
		t.Fatalf("ParseRequest = %v, want %s", err, csr.ReasonInvalidRequest)
	}
}

func TestTemplateCarriesExactlyTheUsagesAsked(t *testing.T) {
	tmpl, err := csr.Template(request(t, ecKey, x509.CertificateRequest{Subject: node, DNSNames: []string{"n1"}}), u("digital signature", "server auth"))
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.KeyUsage != x509.KeyUsageDigitalSignature || !slices.Equal(tmpl.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
		t.Fatalf("usages %v %v", tmpl.KeyUsage, tmpl.ExtKeyUsage)
	}
	if tmpl.Subject.CommonName != "system:node:n1" || !slices.Equal(tmpl.DNSNames, []string{"n1"}) {
		t.Fatalf("subject %v SANs %v", tmpl.Subject, tmpl.DNSNames)
	}
}

func TestLifetimeIsTheShorterOfMaximumAndRequest(t *testing.T) {
	p := policy(t, apiClient)
	for _, tc := range []struct {
		name string
		exp  *int32
		want time.Duration
	}{
		{"no expirationSeconds gets the maximum", nil, 24 * time.Hour},
		{"ten minutes asked gets ten minutes", ptr(600), 10 * time.Minute},
		{"a week asked gets the maximum", ptr(7 * 86400), 24 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Lifetime(tc.exp); got != tc.want {
				t.Fatalf("Lifetime = %s, want %s", got, tc.want)
			}
		})
	}
}

func ptr(v int32) *int32 { return &v }

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
