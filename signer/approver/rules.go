package approver

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/keyward/keyward/signer/config"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
)

// Condition reasons the approver writes. Approvals use kube-controller-
// manager's AutoApproved; the message names the rule.
const (
	ReasonAutoApproved = "AutoApproved"
	// ReasonInvalidRequest: the request does not have the shape its signer
	// name requires (subject, SAN kinds, usages).
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonRequesterNotAllowed: the requesting user may not ask for this
	// signer name (not the node itself, or not in approval.users/groups).
	ReasonRequesterNotAllowed = "RequesterNotAllowed"
	// ReasonSANNotOnNode: a kubelet serving CSR names a SAN that is not
	// among its Node's status.addresses.
	ReasonSANNotOnNode = "SANNotOnNode"
	// ReasonSANNotAllowed: a SAN outside approval.allowedDNSSuffixes /
	// allowedIPRanges, or outside a custom name's csr rules.
	ReasonSANNotAllowed = "SANNotAllowed"
	// ReasonSubjectNotAllowed: a custom name's subject outside its csr rules.
	ReasonSubjectNotAllowed = "SubjectNotAllowed"
	// ReasonUsageNotAllowed: a custom name's usages outside its csr rules.
	ReasonUsageNotAllowed = "UsageNotAllowed"
	// ReasonNodeNotFound: a kubelet serving CSR's Node did not exist for
	// Options.NodeWait after the CSR was created.
	ReasonNodeNotFound = "NodeNotFound"
)

const (
	nodeUserPrefix = "system:node:"
	nodesGroup     = "system:nodes"
)

// denial is a rule a request broke: a Denied condition's reason and message.
type denial struct{ reason, message string }

func (d *denial) Error() string { return d.reason + ": " + d.message }

func deny(reason, format string, args ...any) *denial {
	return &denial{reason: reason, message: fmt.Sprintf(format, args...)}
}

// parseRequest decodes spec.request (the apiserver checked it parses).
func parseRequest(pemBytes []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(pemBytes)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("spec.request is not a CERTIFICATE REQUEST PEM block")
	}
	return x509.ParseCertificateRequest(block.Bytes)
}

// usageSetIs reports whether usages, as a set, equals one of want.
func usageSetIs(usages []certificatesv1.KeyUsage, want ...[]certificatesv1.KeyUsage) bool {
	got := map[certificatesv1.KeyUsage]bool{}
	for _, u := range usages {
		got[u] = true
	}
	for _, w := range want {
		if len(w) != len(got) {
			continue
		}
		all := true
		for _, u := range w {
			all = all && got[u]
		}
		if all {
			return true
		}
	}
	return false
}

var (
	kubeletClientUsages = [][]certificatesv1.KeyUsage{
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth},
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
	}
	kubeletServingUsages = [][]certificatesv1.KeyUsage{
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageServerAuth},
		{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth},
	}
)

// kubeletClientMismatch says why req is not a kubelet client CSR as
// kube-controller-manager's csrapproving controller recognises one
// (O exactly system:nodes, no SANs, CN system:node:…, usages exactly
// digital signature + client auth, optionally key encipherment), or
// returns "" when it is one.
func kubeletClientMismatch(req *x509.CertificateRequest, usages []certificatesv1.KeyUsage) string {
	switch {
	case !slices.Equal(req.Subject.Organization, []string{nodesGroup}):
		return "subject organization is not exactly [system:nodes]"
	case len(req.DNSNames) > 0:
		return "DNS subjectAltNames are not allowed"
	case len(req.EmailAddresses) > 0:
		return "email subjectAltNames are not allowed"
	case len(req.IPAddresses) > 0:
		return "IP subjectAltNames are not allowed"
	case len(req.URIs) > 0:
		return "URI subjectAltNames are not allowed"
	case !strings.HasPrefix(req.Subject.CommonName, nodeUserPrefix):
		return "subject common name does not begin with system:node:"
	case !usageSetIs(usages, kubeletClientUsages...):
		return "usages are not exactly [digital signature, client auth] or [digital signature, key encipherment, client auth]"
	}
	return ""
}

// servingRules are the approval rules of the kubelet serving name.
type servingRules struct {
	dnsSuffixes []string
	ipRanges    []netip.Prefix
}

func newServingRules(a *config.Approval) (*servingRules, error) {
	r := &servingRules{}
	if a == nil {
		return r, nil
	}
	r.dnsSuffixes = a.AllowedDNSSuffixes
	for _, s := range a.AllowedIPRanges {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("parsing allowedIPRanges: %w", err)
		}
		r.ipRanges = append(r.ipRanges, p.Masked())
	}
	return r, nil
}

// servingShape checks a kubelet serving CSR without its Node: the shape
// KEP-1513 and kube's ValidateKubeletServingCSR require, and that the
// requester is the node named in the CN. It returns the node name.
func servingShape(csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) (string, *denial) {
	switch {
	case !slices.Equal(req.Subject.Organization, []string{nodesGroup}):
		return "", deny(ReasonInvalidRequest, "subject organization %q is not exactly [system:nodes]", req.Subject.Organization)
	case len(req.DNSNames) == 0 && len(req.IPAddresses) == 0:
		return "", deny(ReasonInvalidRequest, "a DNS or IP subjectAltName is required")
	case len(req.EmailAddresses) > 0:
		return "", deny(ReasonInvalidRequest, "email subjectAltName %q is not allowed", req.EmailAddresses[0])
	case len(req.URIs) > 0:
		return "", deny(ReasonInvalidRequest, "URI subjectAltName %q is not allowed", req.URIs[0].String())
	case !usageSetIs(csr.Spec.Usages, kubeletServingUsages...):
		return "", deny(ReasonInvalidRequest, "usages %v are not exactly [digital signature, server auth] or [digital signature, key encipherment, server auth]", csr.Spec.Usages)
	case !strings.HasPrefix(req.Subject.CommonName, nodeUserPrefix) || req.Subject.CommonName == nodeUserPrefix:
		return "", deny(ReasonInvalidRequest, "subject common name %q is not system:node:<nodeName>", req.Subject.CommonName)
	}
	cn := req.Subject.CommonName
	if csr.Spec.Username != cn || !slices.Contains(csr.Spec.Groups, nodesGroup) {
		return "", deny(ReasonRequesterNotAllowed, "requested by user %q (groups %v); only the node itself (%s, group system:nodes) may request its serving certificate",
			csr.Spec.Username, csr.Spec.Groups, cn)
	}
	return strings.TrimPrefix(cn, nodeUserPrefix), nil
}

// servingSANs checks every SAN against the Node's addresses and the
// configured suffixes and ranges; the first offending SAN is named.
func (r *servingRules) servingSANs(req *x509.CertificateRequest, node *corev1.Node) *denial {
	var dns []string
	var ips []netip.Addr
	for _, a := range node.Status.Addresses {
		switch a.Type {
		case corev1.NodeHostName, corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			dns = append(dns, a.Address)
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				ips = append(ips, ip.Unmap())
			}
		}
	}
	for _, name := range req.DNSNames {
		if !slices.ContainsFunc(dns, func(d string) bool { return strings.EqualFold(d, name) }) {
			return deny(ReasonSANNotOnNode, "DNS subjectAltName %q is not a Hostname, InternalDNS or ExternalDNS address of Node %s", name, node.Name)
		}
		if len(r.dnsSuffixes) > 0 && !slices.ContainsFunc(r.dnsSuffixes, func(s string) bool { return dnsUnder(name, s) }) {
			return deny(ReasonSANNotAllowed, "DNS subjectAltName %q is not under approval.allowedDNSSuffixes %v", name, r.dnsSuffixes)
		}
	}
	for _, raw := range req.IPAddresses {
		ip, ok := addrOf(raw)
		if !ok {
			return deny(ReasonInvalidRequest, "IP subjectAltName %v does not parse", raw)
		}
		if !slices.Contains(ips, ip) {
			return deny(ReasonSANNotOnNode, "IP subjectAltName %s is not an InternalIP or ExternalIP address of Node %s", ip, node.Name)
		}
		if len(r.ipRanges) > 0 && !slices.ContainsFunc(r.ipRanges, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			return deny(ReasonSANNotAllowed, "IP subjectAltName %s is not in approval.allowedIPRanges %v", ip, r.ipRanges)
		}
	}
	return nil
}

// dnsUnder reports whether name is suffix or a name below it.
func dnsUnder(name, suffix string) bool {
	name, suffix = strings.ToLower(name), strings.ToLower(suffix)
	return name == suffix || strings.HasSuffix(name, "."+suffix)
}

func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// customRules are the approval rules of a csr-profile name: who may ask
// (approval.users/groups) and what (the name's csr policy).
type customRules struct {
	users, groups []string
	policy        *config.CSRPolicy
	ipRanges      []netip.Prefix
}

func newCustomRules(a *config.Approval, p *config.CSRPolicy) (*customRules, error) {
	r := &customRules{users: a.Users, groups: a.Groups, policy: p}
	if p == nil {
		return r, nil
	}
	for _, s := range p.IPRanges {
		pr, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("parsing csr.ipRanges: %w", err)
		}
		r.ipRanges = append(r.ipRanges, pr.Masked())
	}
	return r, nil
}

// check approves only a request from an allowed user or group whose
// subject, SANs and usages are within the csr policy; the first rule
// broken is named.
func (r *customRules) check(csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) *denial {
	if !slices.Contains(r.users, csr.Spec.Username) && !slices.ContainsFunc(csr.Spec.Groups, func(g string) bool { return slices.Contains(r.groups, g) }) {
		return deny(ReasonRequesterNotAllowed, "user %q (groups %v) is in neither approval.users nor approval.groups", csr.Spec.Username, csr.Spec.Groups)
	}
	p := r.policy
	if p == nil {
		return deny(ReasonSubjectNotAllowed, "the signer name has no csr rules")
	}
	if cn := req.Subject.CommonName; cn != "" || len(p.CommonNames) > 0 {
		if !slices.ContainsFunc(p.CommonNames, func(pat string) bool { return nameMatches(pat, cn, false) }) {
			return deny(ReasonSubjectNotAllowed, "subject common name %q matches none of csr.commonNames %v", cn, p.CommonNames)
		}
	}
	for _, o := range req.Subject.Organization {
		if !slices.Contains(p.Organizations, o) {
			return deny(ReasonSubjectNotAllowed, "subject organization %q is not in csr.organizations %v", o, p.Organizations)
		}
	}
	if s := req.Subject; len(s.OrganizationalUnit)+len(s.Country)+len(s.Province)+len(s.Locality)+len(s.StreetAddress)+len(s.PostalCode) > 0 || s.SerialNumber != "" {
		return deny(ReasonSubjectNotAllowed, "subject %q has attributes besides CN and O", s.String())
	}
	for _, d := range req.DNSNames {
		if !slices.ContainsFunc(p.DNSNames, func(pat string) bool { return nameMatches(pat, d, true) }) {
			return deny(ReasonSANNotAllowed, "DNS subjectAltName %q matches none of csr.dnsNames %v", d, p.DNSNames)
		}
	}
	for _, raw := range req.IPAddresses {
		ip, ok := addrOf(raw)
		if !ok || !slices.ContainsFunc(r.ipRanges, func(pr netip.Prefix) bool { return pr.Contains(ip) }) {
			return deny(ReasonSANNotAllowed, "IP subjectAltName %v is in none of csr.ipRanges %v", raw, p.IPRanges)
		}
	}
	for _, u := range req.URIs {
		if !slices.ContainsFunc(p.URIs, func(pat string) bool { return uriMatches(pat, u.String()) }) {
			return deny(ReasonSANNotAllowed, "URI subjectAltName %q matches none of csr.uris %v", u.String(), p.URIs)
		}
	}
	if len(req.EmailAddresses) > 0 {
		return deny(ReasonSANNotAllowed, "email subjectAltName %q is not allowed (csr rules have no email SANs)", req.EmailAddresses[0])
	}
	for _, u := range csr.Spec.Usages {
		if !slices.Contains(p.KeyUsages, string(u)) {
			return deny(ReasonUsageNotAllowed, "usage %q is not in csr.keyUsages %v", u, p.KeyUsages)
		}
	}
	return nil
}

// nameMatches: "*" matches anything, "*.rest" one label then .rest,
// anything else itself; fold compares case-insensitively (DNS names).
func nameMatches(pattern, name string, fold bool) bool {
	eq := func(a, b string) bool { return a == b || fold && strings.EqualFold(a, b) }
	switch {
	case pattern == "*":
		return true
	case strings.HasPrefix(pattern, "*."):
		label, rest, ok := strings.Cut(name, ".")
		return ok && label != "" && label != "*" && eq(rest, pattern[2:])
	}
	return eq(pattern, name)
}

// uriMatches: a trailing "*" matches any rest, else exact.
func uriMatches(pattern, uri string) bool {
	if prefix, ok := strings.CutSuffix(pattern, "*"); ok {
		return strings.HasPrefix(uri, prefix)
	}
	return pattern == uri
}
