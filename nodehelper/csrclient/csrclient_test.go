package csrclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"net"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func baseRequest(t *testing.T) Request {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("spiffe://example.com/daemon")
	exp := int32(3600)
	return Request{
		SignerName: "keyward.dev/node-daemons",
		Template: &x509.CertificateRequest{
			Subject:  pkix.Name{CommonName: "daemon", Organization: []string{"daemons"}},
			DNSNames: []string{"a.example.com"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.1")}, URIs: []*url.URL{u},
		},
		Usages:            []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth},
		ExpirationSeconds: &exp,
		Key:               key,
		NamePrefix:        "keyward-node-daemon-",
	}
}

func TestNameIsADigestOfTheRequest(t *testing.T) {
	base := baseRequest(t)
	name, err := Name(base)
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`^keyward-node-daemon-[a-z2-7]{52}$`).MatchString(name) {
		t.Fatalf("name %q, want the prefix and 52 base32 characters", name)
	}
	other := baseRequest(t)
	for _, tc := range []struct {
		name   string
		change func(r *Request)
		same   bool
	}{
		{"the same request gets the same name", func(r *Request) {}, true},
		{"the same usages in another order get the same name", func(r *Request) {
			r.Usages = []certv1.KeyUsage{certv1.UsageClientAuth, certv1.UsageDigitalSignature}
		}, true},
		{"an IPv4 address in 4-byte form gets the same name", func(r *Request) {
			t := *r.Template
			t.IPAddresses = []net.IP{net.ParseIP("10.0.0.1").To4()}
			r.Template = &t
		}, true},
		{"another key gets another name", func(r *Request) { r.Key = other.Key }, false},
		{"another signer gets another name", func(r *Request) { r.SignerName = "keyward.dev/other" }, false},
		{"another subject gets another name", func(r *Request) {
			t := *r.Template
			t.Subject.CommonName = "daemon2"
			r.Template = &t
		}, false},
		{"another DNS name gets another name", func(r *Request) {
			t := *r.Template
			t.DNSNames = []string{"b.example.com"}
			r.Template = &t
		}, false},
		{"a DNS name moved into the subject gets another name", func(r *Request) {
			t := *r.Template
			t.Subject.CommonName, t.DNSNames = "daemona.example.com", nil
			r.Template = &t
		}, false},
		{"another usage gets another name", func(r *Request) { r.Usages = append(r.Usages, certv1.UsageServerAuth) }, false},
		{"no expiration gets another name", func(r *Request) { r.ExpirationSeconds = nil }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			tc.change(&r)
			got, err := Name(r)
			if err != nil {
				t.Fatal(err)
			}
			if (got == name) != tc.same {
				t.Fatalf("Name %q, base %q, want same=%v", got, name, tc.same)
			}
		})
	}
}

func TestNameRefusesAnInvalidPrefixOrRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(r *Request)
	}{
		{"an upper-case prefix", func(r *Request) { r.NamePrefix = "Node-" }},
		{"a prefix making the name too long", func(r *Request) { r.NamePrefix = strings.Repeat("a", 230) }},
		{"no signer name", func(r *Request) { r.SignerName = "" }},
		{"no key", func(r *Request) { r.Key = nil }},
		{"no template", func(r *Request) { r.Template = nil }},
		{"no usages", func(r *Request) { r.Usages = nil }},
		// Neither is in the name: two requests differing only there would
		// share it, and Submit would take one for the other.
		{"a template with extra extensions", func(r *Request) {
			r.Template.ExtraExtensions = []pkix.Extension{{Id: []int{1, 2, 3, 4}, Value: []byte{5, 0}}}
		}},
		{"a template with attributes", func(r *Request) {
			r.Template.Attributes = []pkix.AttributeTypeAndValueSET{{Type: []int{1, 2, 840, 113549, 1, 9, 7}}}
		}},
	} {
		t.Run(tc.name+" is refused", func(t *testing.T) {
			r := baseRequest(t)
			tc.change(&r)
			if n, err := Name(r); err == nil {
				t.Fatalf("Name = %q, want an error", n)
			}
		})
	}
}

// Wait needs no client for a CSR already issued or refused: it answers
// from the object it is given.
func TestWaitAnswersAtOnceForADecidedCSR(t *testing.T) {
	cond := func(typ certv1.RequestConditionType) certv1.CertificateSigningRequestCondition {
		return certv1.CertificateSigningRequestCondition{Type: typ, Status: corev1.ConditionTrue, Reason: "Because", Message: "said so"}
	}
	for _, tc := range []struct {
		name     string
		status   certv1.CertificateSigningRequestStatus
		wantCert string
		wantType certv1.RequestConditionType
	}{
		{"an issued CSR returns its certificate", certv1.CertificateSigningRequestStatus{
			Conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved)}, Certificate: []byte("chain"),
		}, "chain", ""},
		{"a denied CSR is a DecisionError", certv1.CertificateSigningRequestStatus{
			Conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateDenied)},
		}, "", certv1.CertificateDenied},
		{"an approved and failed CSR is a DecisionError", certv1.CertificateSigningRequestStatus{
			Conditions: []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved), cond(certv1.CertificateFailed)},
		}, "", certv1.CertificateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Status: tc.status}
			cert, err := Wait(t.Context(), nil, c)
			var d *DecisionError
			switch {
			case tc.wantType == "" && (err != nil || string(cert) != tc.wantCert):
				t.Fatalf("Wait = %q, %v", cert, err)
			case tc.wantType != "" && (!errors.As(err, &d) || d.Type != tc.wantType || d.Reason != "Because" || d.Message != "said so" || d.Name != "x"):
				t.Fatalf("Wait error %#v, want a %s DecisionError", err, tc.wantType)
			}
		})
	}
}

// Wait's first list is a consistent read: a list from the watch cache
// (resourceVersion "0", "any") may predate the CSR Submit has just created,
// and its absence there would be taken for a deletion (ErrDeleted), as
// nodehelper.WaitForTerminal already guards against.
func TestWaitDoesNotTakeAStaleListForADeletion(t *testing.T) {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	issued := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: "x", UID: "u1"},
		Status:     certv1.CertificateSigningRequestStatus{Certificate: []byte("chain")},
	}
	c := fake.NewClientset(issued)
	c.PrependReactor("list", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.(k8stesting.ListActionImpl).ListOptions.ResourceVersion == "0" {
			// The watch cache, a moment behind the CSR's creation (its
			// ADDED event is not delivered before Wait looks).
			return true, &certv1.CertificateSigningRequestList{ListMeta: metav1.ListMeta{ResourceVersion: "999"}}, nil
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// As Submit returned it: created, not issued yet.
	cert, err := Wait(ctx, c, &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: "x", UID: "u1"}})
	if err != nil || string(cert) != "chain" {
		t.Fatalf("Wait = %q, %v; want the issued chain", cert, err)
	}
}
