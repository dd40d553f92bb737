package profile_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/profile"
	"golang.org/x/crypto/cryptobyte"
	cbasn1 "golang.org/x/crypto/cryptobyte/asn1"
)

func request(t *testing.T, annotations map[string]string) profile.Request {
	k, err := backends.GenerateKey(backends.ECDSAP256SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return profile.Request{
		Namespace: "shop", PodName: "web-0", PodUID: "pod-uid",
		ServiceAccountName: "web", ServiceAccountUID: "sa-uid", NodeName: "node-a", NodeUID: "node-uid",
		Annotations: annotations, PublicKey: k.Public(),
	}
}

func TestServerProfileAllowsOnlyMatchingNames(t *testing.T) {
	p, err := profile.New(config.Signer{Name: "keyward.dev/server", Profile: config.ProfileServer, Server: &config.Server{
		DNSNamesAnnotation: "keyward.dev/dns-names",
		AllowedDNSNames:    []string{"{serviceAccount}.{namespace}.svc", "*.{namespace}.svc.cluster.local"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	// The service name and n-1 names under the wildcard pattern.
	many := func(n int) string {
		names := []string{"web.shop.svc"}
		for i := 1; i < n; i++ {
			names = append(names, fmt.Sprintf("h%d.shop.svc.cluster.local", i))
		}
		return strings.Join(names, ",")
	}
	cases := []struct {
		name       string
		names      string
		wantReason string
		wantInMsg  string
	}{
		{name: "the service name", names: "web.shop.svc"},
		{name: "as many names as a certificate carries", names: many(profile.MaxDNSNames)},
		{name: "one name more", names: many(profile.MaxDNSNames + 1), wantReason: profile.ReasonInvalidAnnotations, wantInMsg: "keyward.dev/dns-names lists more than 100"},
		{name: "one label under a wildcard pattern", names: "web.shop.svc, api.shop.svc.cluster.local"},
		{name: "another namespace's service", names: "web.billing.svc", wantReason: profile.ReasonDNSNameNotAllowed, wantInMsg: `"web.billing.svc"`},
		{name: "two labels under a wildcard pattern", names: "a.b.shop.svc.cluster.local", wantReason: profile.ReasonDNSNameNotAllowed, wantInMsg: `"a.b.shop.svc.cluster.local"`},
		{name: "a requested wildcard", names: "*.shop.svc.cluster.local", wantReason: profile.ReasonDNSNameNotAllowed, wantInMsg: `"*.shop.svc.cluster.local"`},
		{name: "not a DNS name", names: "Web_Shop", wantReason: profile.ReasonInvalidAnnotations, wantInMsg: `"Web_Shop"`},
		{name: "no names", names: " , ", wantReason: profile.ReasonInvalidAnnotations},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := p.Template(request(t, map[string]string{"keyward.dev/dns-names": tc.names}))
			if tc.wantReason == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(tmpl.DNSNames) == 0 || tmpl.DNSNames[0] != "web.shop.svc" {
					t.Fatalf("DNS names %v", tmpl.DNSNames)
				}
				return
			}
			var d *profile.Denial
			if !errors.As(err, &d) || d.Reason != tc.wantReason {
				t.Fatalf("got %v, want a %s denial", err, tc.wantReason)
			}
			if tc.wantInMsg != "" && !strings.Contains(d.Message, tc.wantInMsg) {
				t.Fatalf("message %q does not name %s", d.Message, tc.wantInMsg)
			}
		})
	}
	_, err = p.Template(request(t, nil))
	var d *profile.Denial
	if !errors.As(err, &d) || d.Reason != profile.ReasonInvalidAnnotations {
		t.Fatalf("no annotation: got %v", err)
	}
}

func TestSPIFFEProfileNamesTheServiceAccount(t *testing.T) {
	p, err := profile.New(config.Signer{Name: "keyward.dev/spiffe", Profile: config.ProfileSPIFFE, SPIFFE: &config.SPIFFE{TrustDomain: "cluster.local"}})
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := p.Template(request(t, nil))
	if err != nil {
		t.Fatal(err)
	}
	if len(tmpl.URIs) != 1 || tmpl.URIs[0].String() != "spiffe://cluster.local/ns/shop/sa/web" {
		t.Fatalf("URIs %v", tmpl.URIs)
	}
}

// The extension's bytes are a SEQUENCE of seven UTF8Strings in the order of
// k8s.io/component-helpers/kubernetesx509 (namespace, service account name
// and UID, pod name and UID, node name and UID), built here by hand so that
// a change of struct tags cannot pass unnoticed.
func TestPodIdentityWireFormat(t *testing.T) {
	p, err := profile.New(config.Signer{Name: "keyward.dev/pod-identity", Profile: config.ProfilePodIdentity})
	if err != nil {
		t.Fatal(err)
	}
	r := request(t, nil)
	tmpl, err := p.Template(r)
	if err != nil {
		t.Fatal(err)
	}
	var b cryptobyte.Builder
	b.AddASN1(cbasn1.SEQUENCE, func(b *cryptobyte.Builder) {
		for _, s := range []string{r.Namespace, r.ServiceAccountName, r.ServiceAccountUID, r.PodName, r.PodUID, r.NodeName, r.NodeUID} {
			b.AddASN1(cbasn1.UTF8String, func(b *cryptobyte.Builder) { b.AddBytes([]byte(s)) })
		}
	})
	want := b.BytesOrPanic()

	if len(tmpl.ExtraExtensions) != 1 {
		t.Fatalf("%d extra extensions, want the PodIdentity extension alone", len(tmpl.ExtraExtensions))
	}
	ext := tmpl.ExtraExtensions[0]
	if !ext.Id.Equal(profile.OIDPodIdentity) || ext.Id.String() != "1.3.6.1.4.1.57683.1" {
		t.Errorf("extension OID %s, want 1.3.6.1.4.1.57683.1", ext.Id)
	}
	if ext.Critical {
		t.Error("PodIdentity extension is critical by default")
	}
	if !bytes.Equal(ext.Value, want) {
		t.Errorf("extension value\n got %x\nwant %x", ext.Value, want)
	}
	if len(tmpl.DNSNames)+len(tmpl.URIs)+len(tmpl.IPAddresses)+len(tmpl.EmailAddresses) != 0 {
		t.Error("podIdentity template has SANs")
	}
	if len(tmpl.ExtKeyUsage) != 1 || tmpl.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Errorf("extended key usage %v, want client auth only", tmpl.ExtKeyUsage)
	}
}

// The extension is critical only where a signer asks for it.
func TestPodIdentityCriticalityFollowsTheSignerSetting(t *testing.T) {
	cases := []struct {
		name     string
		settings *config.PodIdentity
		want     bool
	}{
		{name: "no settings give a non-critical extension"},
		{name: "critical false gives a non-critical extension", settings: &config.PodIdentity{}},
		{name: "critical true gives a critical extension", settings: &config.PodIdentity{Critical: true}, want: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := profile.New(config.Signer{Name: "keyward.dev/pod-identity", Profile: config.ProfilePodIdentity, PodIdentity: tc.settings})
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := p.Template(request(t, nil))
			if err != nil {
				t.Fatal(err)
			}
			if len(tmpl.ExtraExtensions) != 1 || tmpl.ExtraExtensions[0].Critical != tc.want {
				t.Fatalf("extensions %+v, want one PodIdentity extension with critical=%v", tmpl.ExtraExtensions, tc.want)
			}
		})
	}
}
