package approver

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"testing"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stesting "k8s.io/client-go/testing"
)

// docs/approver.md promises: "The signer enforces the same csr rules when it
// signs; the approver's check only keeps a request it would refuse from
// being approved at all." The approver's customRules.check is a second,
// hand-written copy of signer/csr's Policy.checkCustom and misses rules the
// signer enforces, so these requests are Approved and then Failed by the
// signer (no certificate is issued, but the approval is a lie and the
// requester sees Approved+Failed instead of one Denied naming the rule):
//   - a subject attribute the pkix.Name fields do not surface (DC, UID,
//     emailAddress): the approver looks only at OU/C/ST/L/street/postal/
//     serialNumber, the signer at every attribute in Subject.Names;
//   - basicConstraints CA:TRUE, or any extension besides SAN/keyUsage/
//     extKeyUsage/basicConstraints (signer/csr checkExtensions, strict);
//   - a subject key type outside allowedKeyTypes.
//
// Fix (signer/approver/rules.go, customRules.check): after the requester
// check, build the name's signer/csr Policy once in newCustomRules
// (csr.NewPolicy(signer config)) and deny with the Violation's message when
// Policy.Check(req, csr.Spec.Usages) returns one — one source of truth for
// the csr rules (this also removes the duplicated nameMatches/uriMatches).
func TestCustomApprovalDeniesWhatTheSignerWouldFail(t *testing.T) {
	oidDC := asn1.ObjectIdentifier{0, 9, 2342, 19200300, 100, 1, 25}
	oidBasicConstraints := asn1.ObjectIdentifier{2, 5, 29, 19}
	caTrue, err := asn1.Marshal(struct{ IsCA bool }{true})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		csr  csrSpec
	}{
		{"a custom CSR whose subject carries a DC attribute is denied", customCSR("alice", func(s *csrSpec) {
			s.subject.ExtraNames = []pkix.AttributeTypeAndValue{{Type: oidDC, Value: "example"}}
		})},
		{"a custom CSR asking for basicConstraints CA:TRUE is denied", customCSR("alice", func(s *csrSpec) {
			s.request = pemRequest(t, &x509.CertificateRequest{Subject: s.subject, DNSNames: s.dns,
				ExtraExtensions: []pkix.Extension{{Id: oidBasicConstraints, Critical: true, Value: caTrue}}})
		})},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.csr.build(t, "custom")
			// The premise: keyward's signer marks this request Failed.
			var sc config.Signer
			for _, s := range testSigners() {
				if s.Name == obj.Spec.SignerName {
					sc = s
				}
			}
			sc.AllowedKeyTypes = config.AllKeyTypes()
			policy, err := csr.NewPolicy(sc)
			if err != nil {
				t.Fatal(err)
			}
			req, err := csr.ParseRequest(obj.Spec.Request)
			if err != nil {
				t.Fatal(err)
			}
			if v := policy.Check(req, obj.Spec.Usages); v == nil {
				t.Fatal("premise broken: the signer would sign this request")
			} else {
				t.Logf("the signer fails it: %v", v)
			}
			c, client, _ := newTestController(t, nil)
			if _, err := client.CertificatesV1().CertificateSigningRequests().Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			client.ClearActions()
			if err := c.decide(context.Background(), obj); err != nil {
				t.Fatal(err)
			}
			var got certificatesv1.RequestConditionType
			for _, a := range client.Actions() {
				if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "approval" {
					conds := u.GetObject().(*certificatesv1.CertificateSigningRequest).Status.Conditions
					got = conds[len(conds)-1].Type
				}
			}
			if got != certificatesv1.CertificateDenied {
				t.Errorf("decision %q, want Denied: the signer marks this request Failed", got)
			}
		})
	}
}
