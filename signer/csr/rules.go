// Package csr is keyward's CertificateSigningRequest signer: for each
// signer name it owns (the three kubernetes.io names KEP-1513 defines, and
// custom names with the csr profile) it signs approved requests that keep
// the name's rules, through the same issuer.Issuer as the
// PodCertificateRequest signer, and marks the others Failed with the rule
// they broke.
package csr

import (
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/internal/uripattern"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	certv1 "k8s.io/api/certificates/v1"
)

// Failed condition reasons: each names the rule a request broke.
const (
	// ReasonInvalidRequest: spec.request is no PEM PKCS#10 request, or its
	// signature does not verify with its own key.
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonUnsupportedKeyType: the subject key is not in allowedKeyTypes.
	ReasonUnsupportedKeyType = "UnsupportedKeyType"
	// ReasonCARequested: the request asks for basicConstraints CA:TRUE or
	// a CA usage; keyward never issues a CA certificate.
	ReasonCARequested = "CARequested"
	// ReasonExtensionNotPermitted: the request asks for an extension the
	// signer name does not issue.
	ReasonExtensionNotPermitted = "ExtensionNotPermitted"
	// ReasonSubjectNotPermitted: the subject breaks the signer name's rules.
	ReasonSubjectNotPermitted = "SubjectNotPermitted"
	// ReasonSANNotPermitted: a subjectAltName breaks the signer name's rules.
	ReasonSANNotPermitted = "SubjectAltNameNotPermitted"
	// ReasonUsagesNotPermitted: spec.usages break the signer name's rules.
	ReasonUsagesNotPermitted = "UsagesNotPermitted"
	// ReasonBackendFailure: the CA key failed in a way no retry can cure.
	ReasonBackendFailure = "BackendFailure"
	// ReasonStatusRejected: kube-apiserver refused the certificate as
	// invalid; signing again would be refused the same way.
	ReasonStatusRejected = "StatusRejected"
)

// Violation is a rule a request breaks: a Failed condition's reason and
// message.
type Violation struct {
	Reason, Message string
}

func (v *Violation) Error() string { return v.Reason + ": " + v.Message }

func violation(reason, format string, args ...any) *Violation {
	return &Violation{Reason: reason, Message: fmt.Sprintf(format, args...)}
}

// Policy is one CSR signer name's rules.
type Policy struct {
	Name    string
	Profile string
	// CSR holds the rules of profile csr (nil for the kubernetes.io ones).
	CSR             *config.CSRPolicy
	AllowedKeyTypes []string
	MaxLifetime     time.Duration
	Backdate        time.Duration

	ipRanges []*net.IPNet
}

// NewPolicy builds the policy of a CSR profile's signer name.
func NewPolicy(sc config.Signer) (*Policy, error) {
	if !config.IsCSRProfile(sc.Profile) {
		return nil, fmt.Errorf("signer %s: profile %q serves PodCertificateRequests, not CSRs", sc.Name, sc.Profile)
	}
	p := &Policy{Name: sc.Name, Profile: sc.Profile, CSR: sc.CSR, AllowedKeyTypes: sc.AllowedKeyTypes, MaxLifetime: sc.MaxLifetime.Duration}
	if len(p.AllowedKeyTypes) == 0 {
		// The configuration's default (config.Default does the same).
		p.AllowedKeyTypes = config.AllKeyTypes()
	}
	if sc.Backdate != nil {
		p.Backdate = sc.Backdate.Duration
	}
	if sc.Profile == config.ProfileCSR {
		if sc.CSR == nil {
			return nil, fmt.Errorf("signer %s: profile csr without csr rules", sc.Name)
		}
		for _, r := range sc.CSR.IPRanges {
			_, n, err := net.ParseCIDR(r)
			if err != nil {
				return nil, fmt.Errorf("signer %s: ip range %q: %w", sc.Name, r, err)
			}
			p.ipRanges = append(p.ipRanges, n)
		}
	}
	return p, nil
}

// ParseRequest reads spec.request: one PEM CERTIFICATE REQUEST block whose
// signature verifies with the key it carries.
func ParseRequest(data []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, violation(ReasonInvalidRequest, "spec.request is not a PEM CERTIFICATE REQUEST block")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, violation(ReasonInvalidRequest, "spec.request does not parse as PKCS#10: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return nil, violation(ReasonInvalidRequest, "spec.request's signature does not verify with its own key: %v", err)
	}
	return req, nil
}

// Extension ids a request may carry.
var (
	oidSAN              = asn1.ObjectIdentifier{2, 5, 29, 17}
	oidBasicConstraints = asn1.ObjectIdentifier{2, 5, 29, 19}
	oidKeyUsage         = asn1.ObjectIdentifier{2, 5, 29, 15}
	oidExtKeyUsage      = asn1.ObjectIdentifier{2, 5, 29, 37}
	oidCommonName       = asn1.ObjectIdentifier{2, 5, 4, 3}
	oidOrganization     = asn1.ObjectIdentifier{2, 5, 4, 10}
)

// Check returns the first rule req (with spec.usages) breaks, or nil.
func (p *Policy) Check(req *x509.CertificateRequest, usages []certv1.KeyUsage) *Violation {
	if kt := pcr.KeyType(req.PublicKey); !slices.Contains(p.AllowedKeyTypes, kt) {
		return violation(ReasonUnsupportedKeyType, "signer %s does not sign %s keys (allowed: %s)", p.Name, kt, strings.Join(p.AllowedKeyTypes, ", "))
	}
	if v := checkExtensions(req, p.Profile == config.ProfileCSR); v != nil {
		return v
	}
	for _, u := range usages {
		if slices.Contains(config.CAUsages, string(u)) {
			return violation(ReasonCARequested, "usage %q is a CA's; signer %s never issues a CA certificate", u, p.Name)
		}
		if _, _, ok := x509Usage(u); !ok {
			return violation(ReasonUsagesNotPermitted, "usage %q is unknown", u)
		}
	}
	switch p.Profile {
	case config.ProfileKubeAPIServerClient:
		return kubeAPIServerClient(usages)
	case config.ProfileKubeAPIServerClientKubelet:
		return CheckKubeletClient(req, usages)
	case config.ProfileKubeletServing:
		return CheckKubeletServing(req, usages)
	}
	return p.CheckCustom(req, usages)
}

// checkExtensions refuses basicConstraints CA:TRUE everywhere. Under
// profile csr (strict) it also refuses every extension but
// subjectAltName, basicConstraints CA:FALSE, keyUsage and extKeyUsage
// (the last two are ignored: spec.usages decide the certificate's
// usages); the kubernetes.io profiles discard other extensions, as
// KEP-1513 says.
func checkExtensions(req *x509.CertificateRequest, strict bool) *Violation {
	for _, e := range req.Extensions {
		switch {
		case e.Id.Equal(oidBasicConstraints):
			var bc struct {
				IsCA       bool `asn1:"optional"`
				MaxPathLen int  `asn1:"optional,default:-1"`
			}
			if rest, err := asn1.Unmarshal(e.Value, &bc); err != nil || len(rest) > 0 {
				return violation(ReasonInvalidRequest, "the requested basicConstraints extension does not parse")
			}
			if bc.IsCA {
				return violation(ReasonCARequested, "the request asks for basicConstraints CA:TRUE; keyward never issues a CA certificate")
			}
		case e.Id.Equal(oidSAN), e.Id.Equal(oidKeyUsage), e.Id.Equal(oidExtKeyUsage):
		case strict:
			return violation(ReasonExtensionNotPermitted, "the request asks for extension %s; this signer issues subjectAltName only (usages come from spec.usages)", e.Id)
		}
	}
	return nil
}

// usageSet is usages as a set of strings.
func usageSet(usages []certv1.KeyUsage) map[string]bool {
	s := map[string]bool{}
	for _, u := range usages {
		s[string(u)] = true
	}
	return s
}

func sameSet(a map[string]bool, b ...string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, x := range b {
		if !a[x] {
			return false
		}
	}
	return true
}

// kubeAPIServerClient: any subject and SANs; usages "client auth", plus
// optionally "digital signature" and "key encipherment" and nothing else
// (kube-controller-manager's validAPIServerClientUsages).
func kubeAPIServerClient(usages []certv1.KeyUsage) *Violation {
	client := false
	for _, u := range usages {
		switch u {
		case certv1.UsageDigitalSignature, certv1.UsageKeyEncipherment:
		case certv1.UsageClientAuth:
			client = true
		default:
			return violation(ReasonUsagesNotPermitted, "usage %q is not permitted for kubernetes.io/kube-apiserver-client (allowed: client auth, optionally digital signature and key encipherment)", u)
		}
	}
	if !client {
		return violation(ReasonUsagesNotPermitted, "kubernetes.io/kube-apiserver-client requires usage \"client auth\"")
	}
	return nil
}

// nodeSubject is the subject both kubelet signers require: O exactly
// [system:nodes], CN system:node:<name>.
func nodeSubject(req *x509.CertificateRequest, signer string) *Violation {
	if !slices.Equal(req.Subject.Organization, []string{"system:nodes"}) {
		return violation(ReasonSubjectNotPermitted, "%s requires subject organization exactly [system:nodes], got %q", signer, req.Subject.Organization)
	}
	if !strings.HasPrefix(req.Subject.CommonName, "system:node:") {
		return violation(ReasonSubjectNotPermitted, "%s requires a subject common name beginning with system:node:, got %q", signer, req.Subject.CommonName)
	}
	return nil
}

// CheckKubeletClient is kube-controller-manager's ValidateKubeletClientCSR:
// the shape of a kubernetes.io/kube-apiserver-client-kubelet request (the
// approver recognises a kubelet client CSR by it too).
func CheckKubeletClient(req *x509.CertificateRequest, usages []certv1.KeyUsage) *Violation {
	const signer = "kubernetes.io/kube-apiserver-client-kubelet"
	if v := nodeSubject(req, signer); v != nil {
		return v
	}
	for kind, n := range map[string]int{"DNS": len(req.DNSNames), "email": len(req.EmailAddresses), "IP": len(req.IPAddresses), "URI": len(req.URIs)} {
		if n > 0 {
			return violation(ReasonSANNotPermitted, "%s permits no subjectAltNames; the request has %d %s", signer, n, kind)
		}
	}
	set := usageSet(usages)
	if !sameSet(set, "digital signature", "key encipherment", "client auth") && !sameSet(set, "digital signature", "client auth") {
		return violation(ReasonUsagesNotPermitted, "%s requires usages exactly [digital signature, client auth], optionally with key encipherment; got %q", signer, usages)
	}
	return nil
}

// CheckKubeletServing is kube-controller-manager's
// ValidateKubeletServingCSR: the shape of a kubernetes.io/kubelet-serving
// request (the approver checks it before the requester and the Node).
func CheckKubeletServing(req *x509.CertificateRequest, usages []certv1.KeyUsage) *Violation {
	const signer = "kubernetes.io/kubelet-serving"
	if v := nodeSubject(req, signer); v != nil {
		return v
	}
	if len(req.DNSNames) == 0 && len(req.IPAddresses) == 0 {
		return violation(ReasonSANNotPermitted, "%s requires at least one DNS or IP subjectAltName", signer)
	}
	// A wildcard serving certificate would let one kubelet impersonate
	// every kubelet whose name it covers: refused even when approved.
	for _, d := range req.DNSNames {
		if strings.Contains(d, "*") {
			return violation(ReasonSANNotPermitted, "%s never issues a wildcard: DNS subjectAltName %q contains '*'", signer, d)
		}
	}
	if strings.Contains(req.Subject.CommonName, "*") {
		return violation(ReasonSubjectNotPermitted, "%s never issues a wildcard: subject common name %q contains '*'", signer, req.Subject.CommonName)
	}
	if len(req.EmailAddresses) > 0 {
		return violation(ReasonSANNotPermitted, "%s permits no email subjectAltNames; the request has %q", signer, req.EmailAddresses)
	}
	if len(req.URIs) > 0 {
		return violation(ReasonSANNotPermitted, "%s permits no URI subjectAltNames; the request has %s", signer, req.URIs[0])
	}
	set := usageSet(usages)
	if !sameSet(set, "digital signature", "key encipherment", "server auth") && !sameSet(set, "digital signature", "server auth") {
		return violation(ReasonUsagesNotPermitted, "%s requires usages exactly [digital signature, server auth], optionally with key encipherment; got %q", signer, usages)
	}
	return nil
}

// CheckCustom applies a csr profile's rules (subject, SANs, usages) and
// nothing else: Check adds the key type and extension rules. The approver
// approves a custom name's request by these same rules. p must be of
// profile csr (NewPolicy then holds its rules).
func (p *Policy) CheckCustom(req *x509.CertificateRequest, usages []certv1.KeyUsage) *Violation {
	c := p.CSR
	for _, a := range req.Subject.Names {
		if !a.Type.Equal(oidCommonName) && !a.Type.Equal(oidOrganization) {
			return violation(ReasonSubjectNotPermitted, "signer %s permits only CN and O in the subject; the request's subject %q has attribute %s", p.Name, req.Subject.String(), a.Type)
		}
	}
	// A CN is required once commonNames are set ("*" alone admits none
	// too), and refused while they are not: the approver reads them alike.
	if cn := req.Subject.CommonName; (cn != "" || len(c.CommonNames) > 0) && !matchAny(c.CommonNames, cn, false) {
		return violation(ReasonSubjectNotPermitted, "subject CN %q matches none of signer %s's commonNames %q", cn, p.Name, c.CommonNames)
	}
	for _, o := range req.Subject.Organization {
		if !slices.Contains(c.Organizations, o) {
			return violation(ReasonSubjectNotPermitted, "subject O %q is not among signer %s's organizations %q", o, p.Name, c.Organizations)
		}
	}
	for _, d := range req.DNSNames {
		if !matchAny(c.DNSNames, d, true) {
			return violation(ReasonSANNotPermitted, "DNS name %q matches none of signer %s's dnsNames %q", d, p.Name, c.DNSNames)
		}
	}
	for _, ip := range req.IPAddresses {
		if !slices.ContainsFunc(p.ipRanges, func(n *net.IPNet) bool { return n.Contains(ip) }) {
			return violation(ReasonSANNotPermitted, "IP address %s lies in none of signer %s's ipRanges %q", ip, p.Name, c.IPRanges)
		}
	}
	for _, u := range req.URIs {
		if !slices.ContainsFunc(c.URIs, func(pat string) bool { return uripattern.Match(pat, u) }) {
			return violation(ReasonSANNotPermitted, "URI %q matches none of signer %s's uris %q", u.String(), p.Name, c.URIs)
		}
	}
	if len(req.EmailAddresses) > 0 {
		return violation(ReasonSANNotPermitted, "signer %s permits no email subjectAltNames; the request has %q", p.Name, req.EmailAddresses)
	}
	if len(usages) == 0 {
		return violation(ReasonUsagesNotPermitted, "the request asks for no usages; signer %s issues %q", p.Name, c.KeyUsages)
	}
	for _, u := range usages {
		if !slices.Contains(c.KeyUsages, string(u)) {
			return violation(ReasonUsagesNotPermitted, "usage %q is not among signer %s's keyUsages %q", u, p.Name, c.KeyUsages)
		}
	}
	return nil
}

// matchAny reports whether v matches one of the patterns: "*" anything,
// "*." plus a suffix one DNS label (not itself "*") in front of the
// suffix, else v itself; fold compares case-insensitively (DNS names).
// Config validation allows "*" alone only for commonNames.
func matchAny(patterns []string, v string, fold bool) bool {
	eq := func(a, b string) bool { return a == b || fold && strings.EqualFold(a, b) }
	for _, pat := range patterns {
		switch {
		case pat == "*":
			return true
		case strings.HasPrefix(pat, "*."):
			label, rest, ok := strings.Cut(v, ".")
			if ok && label != "" && label != "*" && eq(rest, pat[2:]) {
				return true
			}
		case eq(pat, v):
			return true
		}
	}
	return false
}

// x509Usage maps a certificates.k8s.io usage to X.509 (as
// kube-controller-manager does); ok is false for an unknown one.
func x509Usage(u certv1.KeyUsage) (x509.KeyUsage, x509.ExtKeyUsage, bool) {
	switch u {
	case certv1.UsageSigning, certv1.UsageDigitalSignature:
		return x509.KeyUsageDigitalSignature, -1, true
	case certv1.UsageContentCommitment:
		return x509.KeyUsageContentCommitment, -1, true
	case certv1.UsageKeyEncipherment:
		return x509.KeyUsageKeyEncipherment, -1, true
	case certv1.UsageKeyAgreement:
		return x509.KeyUsageKeyAgreement, -1, true
	case certv1.UsageDataEncipherment:
		return x509.KeyUsageDataEncipherment, -1, true
	case certv1.UsageCertSign:
		return x509.KeyUsageCertSign, -1, true
	case certv1.UsageCRLSign:
		return x509.KeyUsageCRLSign, -1, true
	case certv1.UsageEncipherOnly:
		return x509.KeyUsageEncipherOnly, -1, true
	case certv1.UsageDecipherOnly:
		return x509.KeyUsageDecipherOnly, -1, true
	case certv1.UsageAny:
		return 0, x509.ExtKeyUsageAny, true
	case certv1.UsageServerAuth:
		return 0, x509.ExtKeyUsageServerAuth, true
	case certv1.UsageClientAuth:
		return 0, x509.ExtKeyUsageClientAuth, true
	case certv1.UsageCodeSigning:
		return 0, x509.ExtKeyUsageCodeSigning, true
	case certv1.UsageEmailProtection, certv1.UsageSMIME:
		return 0, x509.ExtKeyUsageEmailProtection, true
	case certv1.UsageIPsecEndSystem:
		return 0, x509.ExtKeyUsageIPSECEndSystem, true
	case certv1.UsageIPsecTunnel:
		return 0, x509.ExtKeyUsageIPSECTunnel, true
	case certv1.UsageIPsecUser:
		return 0, x509.ExtKeyUsageIPSECUser, true
	case certv1.UsageTimestamping:
		return 0, x509.ExtKeyUsageTimeStamping, true
	case certv1.UsageOCSPSigning:
		return 0, x509.ExtKeyUsageOCSPSigning, true
	case certv1.UsageMicrosoftSGC:
		return 0, x509.ExtKeyUsageMicrosoftServerGatedCrypto, true
	case certv1.UsageNetscapeSGC:
		return 0, x509.ExtKeyUsageNetscapeServerGatedCrypto, true
	}
	return 0, 0, false
}

// Template is the leaf a request that passed Check gets: its subject and
// SANs, exactly spec.usages, never a CA (authority.Sign sets CA:FALSE).
func Template(req *x509.CertificateRequest, usages []certv1.KeyUsage) (*x509.Certificate, error) {
	t := &x509.Certificate{
		Subject:        req.Subject,
		DNSNames:       req.DNSNames,
		IPAddresses:    req.IPAddresses,
		URIs:           req.URIs,
		EmailAddresses: req.EmailAddresses,
	}
	for _, u := range usages {
		ku, eku, ok := x509Usage(u)
		if !ok {
			return nil, errors.New("unknown usage " + string(u))
		}
		t.KeyUsage |= ku
		if eku >= 0 && !slices.Contains(t.ExtKeyUsage, eku) {
			t.ExtKeyUsage = append(t.ExtKeyUsage, eku)
		}
	}
	return t, nil
}

// Lifetime is min(maxLifetime, spec.expirationSeconds). kube-apiserver
// refuses expirationSeconds under 600, so a requested 10 minutes is
// honoured as is.
func (p *Policy) Lifetime(expirationSeconds *int32) time.Duration {
	if expirationSeconds == nil {
		return p.MaxLifetime
	}
	return min(p.MaxLifetime, time.Duration(*expirationSeconds)*time.Second)
}
