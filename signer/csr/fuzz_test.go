package csr_test

import (
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
)

// FuzzCSRPolicy: spec.request as sent (raw) never panics ParseRequest,
// which refuses it as InvalidRequest naming spec.request or returns a
// request whose signature verifies. A request made from fuzzed subject,
// SANs and usages is judged by each profile's rules without a panic; each
// refusal has a known reason and a message; each request passed gets a
// template that is no CA, carries exactly the request's names, and keeps
// the profile's rules (checked here independently of rules.go).
func FuzzCSRPolicy(f *testing.F) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: node, DNSNames: []string{"n1"}}, ecKey)
	if err != nil {
		f.Fatal(err)
	}
	good := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	bad := slices.Clone(der)
	bad[len(bad)-3] ^= 0xff
	for _, raw := range [][]byte{good, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: bad}), good[:len(good)/2], []byte("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n")} {
		f.Add(raw, "a.nodes.example.com", "example", "a.nodes.example.com", "10.9.9.9", "spiffe://example.com/ns/a", "", "client auth")
	}
	f.Add([]byte(nil), "system:node:n1", "system:nodes", "n1", "10.1.2.3", "", "", "digital signature,server auth")
	f.Add([]byte(nil), "system:node:n1", "system:nodes", "", "", "", "", "digital signature,key encipherment,client auth")
	f.Add([]byte(nil), "alice", "devs", "x", "", "", "", "client auth,cert sign")
	f.Add([]byte(nil), "a.nodes.example.com", "", "A.Nodes.Example.com,*.nodes.example.com", "::ffff:10.0.0.1,192.168.0.1", "spiffe://example.com/../x,spiffe://evil.example/x", "a@example.com", "digital signature,client auth")

	policies := []*csr.Policy{policy(f, apiClient), policy(f, kubeletCli), policy(f, kubeletServ), policy(f, custom)}
	reasons := []string{csr.ReasonUnsupportedKeyType, csr.ReasonCARequested, csr.ReasonExtensionNotPermitted, csr.ReasonSubjectNotPermitted,
		csr.ReasonSANNotPermitted, csr.ReasonUsagesNotPermitted, csr.ReasonInvalidRequest}
	f.Fuzz(func(t *testing.T, raw []byte, cn, orgs, dnsNames, ips, uris, emails, usages string) {
		if req, err := csr.ParseRequest(raw); err != nil {
			var v *csr.Violation
			if !errors.As(err, &v) || v.Reason != csr.ReasonInvalidRequest || !strings.Contains(v.Message, "spec.request") {
				t.Fatalf("ParseRequest refused with %v, want %s naming spec.request", err, csr.ReasonInvalidRequest)
			}
		} else if err := req.CheckSignature(); err != nil {
			t.Fatalf("ParseRequest accepted a request whose signature does not verify: %v", err)
		}

		tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: cn, Organization: split(orgs)}, DNSNames: split(dnsNames), EmailAddresses: split(emails)}
		for _, s := range split(ips) {
			if ip := net.ParseIP(s); ip != nil {
				tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
			}
		}
		for _, s := range split(uris) {
			if u, err := url.Parse(s); err == nil {
				tmpl.URIs = append(tmpl.URIs, u)
			}
		}
		der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, ecKey)
		if err != nil {
			return // crypto/x509 will not encode it: no client can send it either
		}
		req, err := csr.ParseRequest(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
		if err != nil {
			// crypto/x509 encodes some names its parser then refuses (a
			// URI "//."): refused as unparsable, that is no keyward rule.
			var v *csr.Violation
			if _, perr := x509.ParseCertificateRequest(der); perr == nil || !errors.As(err, &v) || v.Reason != csr.ReasonInvalidRequest {
				t.Fatalf("a request crypto/x509 made and parses is refused: %v", err)
			}
			return
		}
		us := u(split(usages)...)
		for _, p := range policies {
			if v := p.Check(req, us); v != nil {
				if !slices.Contains(reasons, v.Reason) || v.Message == "" {
					t.Fatalf("%s: refusal %q: %q", p.Name, v.Reason, v.Message)
				}
				continue
			}
			leaf, err := csr.Template(req, us)
			if err != nil {
				t.Fatalf("%s passed a request it cannot make a template for: %v", p.Name, err)
			}
			if leaf.IsCA || leaf.KeyUsage&(x509.KeyUsageCertSign|x509.KeyUsageCRLSign) != 0 {
				t.Fatalf("%s: a CA template for usages %q", p.Name, us)
			}
			if !slices.Equal(leaf.DNSNames, req.DNSNames) || len(leaf.IPAddresses) != len(req.IPAddresses) || len(leaf.URIs) != len(req.URIs) || !slices.Equal(leaf.EmailAddresses, req.EmailAddresses) {
				t.Fatalf("%s: template names differ from the request's", p.Name)
			}
			keepsRules(t, p, req, usages)
		}
	})
}

// split is a comma-separated list; empty gives none.
func split(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// keepsRules restates each profile's rules for a request it passed.
func keepsRules(t *testing.T, p *csr.Policy, req *x509.CertificateRequest, usages string) {
	t.Helper()
	us := split(usages)
	sans := len(req.DNSNames) + len(req.IPAddresses) + len(req.URIs) + len(req.EmailAddresses)
	isNode := slices.Equal(req.Subject.Organization, []string{"system:nodes"}) && strings.HasPrefix(req.Subject.CommonName, "system:node:")
	switch p.Profile {
	case config.ProfileKubeAPIServerClient:
		if !slices.Contains(us, "client auth") {
			t.Fatalf("%s passed usages %q without client auth", p.Name, us)
		}
	case config.ProfileKubeAPIServerClientKubelet:
		if !isNode || sans > 0 || !slices.Contains(us, "client auth") {
			t.Fatalf("%s passed subject %q, %d SANs, usages %q", p.Name, req.Subject, sans, us)
		}
	case config.ProfileKubeletServing:
		if !isNode || len(req.DNSNames)+len(req.IPAddresses) == 0 || len(req.URIs)+len(req.EmailAddresses) > 0 || !slices.Contains(us, "server auth") {
			t.Fatalf("%s passed subject %q, SANs %v %v %v %v, usages %q", p.Name, req.Subject, req.DNSNames, req.IPAddresses, req.URIs, req.EmailAddresses, us)
		}
	case config.ProfileCSR:
		// custom: CN and DNS names one label under nodes.example.com
		// (DNS case-insensitively), O example, IPs in 10.0.0.0/8, URIs
		// under spiffe://example.com/, no email, usages configured.
		underNodes := func(name string, fold bool) bool {
			label, rest, ok := strings.Cut(name, ".")
			return ok && label != "" && label != "*" && (rest == "nodes.example.com" || fold && strings.EqualFold(rest, "nodes.example.com"))
		}
		if !underNodes(req.Subject.CommonName, false) {
			t.Fatalf("%s passed CN %q", p.Name, req.Subject.CommonName)
		}
		for _, a := range req.Subject.Names {
			if s := a.Type.String(); s != "2.5.4.3" && s != "2.5.4.10" {
				t.Fatalf("%s passed subject attribute %s", p.Name, s)
			}
		}
		for _, o := range req.Subject.Organization {
			if o != "example" {
				t.Fatalf("%s passed O %q", p.Name, o)
			}
		}
		for _, d := range req.DNSNames {
			if !underNodes(d, true) {
				t.Fatalf("%s passed DNS name %q", p.Name, d)
			}
		}
		_, tenNet, _ := net.ParseCIDR("10.0.0.0/8")
		for _, ip := range req.IPAddresses {
			if !tenNet.Contains(ip) {
				t.Fatalf("%s passed IP %s", p.Name, ip)
			}
		}
		for _, u := range req.URIs {
			if !strings.HasPrefix(u.String(), "spiffe://example.com/") || u.Host != "example.com" {
				t.Fatalf("%s passed URI %q (host %q)", p.Name, u, u.Host)
			}
			// Under a "*" pattern only a plain path: what every relying
			// party reads the same way.
			path := strings.TrimPrefix(u.String(), "spiffe://example.com/")
			if strings.ContainsAny(u.String(), "%?#@") || slices.ContainsFunc(strings.Split(path, "/"), func(seg string) bool { return seg == "." || seg == ".." }) ||
				strings.Contains(path, "//") {
				t.Fatalf("%s passed URI %q, which is not a plain path under the pattern", p.Name, u)
			}
		}
		if len(req.EmailAddresses) > 0 || len(us) == 0 {
			t.Fatalf("%s passed emails %q, usages %q", p.Name, req.EmailAddresses, us)
		}
		for _, x := range us {
			if x != "digital signature" && x != "client auth" {
				t.Fatalf("%s passed usage %q", p.Name, x)
			}
		}
	}
}
