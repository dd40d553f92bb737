package approver

import (
	"crypto/x509"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/keyward/keyward/internal/uripattern"
	"github.com/keyward/keyward/signer/config"
	csrsigner "github.com/keyward/keyward/signer/csr"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"
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

// denial is a rule a request broke: a Denied condition's reason and
// message. A held one is not written: the CSR is left for a human
// (Event NotAutoApproved), since nothing proves it bad, only unproven.
type denial struct {
	reason, message string
	hold            bool
}

func (d *denial) Error() string { return d.reason + ": " + d.message }

func deny(reason, format string, args ...any) *denial {
	return &denial{reason: reason, message: fmt.Sprintf(format, args...)}
}

func hold(reason, format string, args ...any) *denial {
	return &denial{reason: reason, message: fmt.Sprintf(format, args...), hold: true}
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
	for _, s := range a.AllowedDNSSuffixes {
		r.dnsSuffixes = append(r.dnsSuffixes, strings.ToLower(s))
	}
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
// KEP-1513 and kube's ValidateKubeletServingCSR require (signer/csr's
// rules, every break denied as InvalidRequest), a node name after
// system:node:, and that the requester is that node. It returns the node
// name.
func servingShape(csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) (string, *denial) {
	for _, name := range req.DNSNames {
		if strings.Contains(name, "*") {
			return "", deny(ReasonSANNotAllowed, "DNS subjectAltName %q is a wildcard: a kubelet serving certificate never names one (it would let this node impersonate every kubelet it covers)", name)
		}
	}
	if v := csrsigner.CheckKubeletServing(req, csr.Spec.Usages); v != nil {
		return "", deny(ReasonInvalidRequest, "%s", v.Message)
	}
	cn := req.Subject.CommonName
	if cn == nodeUserPrefix {
		return "", deny(ReasonInvalidRequest, "subject common name %q is not system:node:<nodeName>", cn)
	}
	if csr.Spec.Username != cn || !slices.Contains(csr.Spec.Groups, nodesGroup) {
		return "", deny(ReasonRequesterNotAllowed, "requested by user %q (groups %v); only the node itself (%s, group system:nodes) may request its serving certificate",
			csr.Spec.Username, csr.Spec.Groups, cn)
	}
	return strings.TrimPrefix(cn, nodeUserPrefix), nil
}

// dnsOwners are the Nodes a DNS name is bound to: the Node of that name,
// and the Node <label> when the name is <label>.<suffix> for an allowed
// suffix. Node names are lower case; name must be too.
func (r *servingRules) dnsOwners(name string) []string {
	owners := []string{name}
	if label, rest, ok := strings.Cut(name, "."); ok && slices.Contains(r.dnsSuffixes, rest) {
		owners = append(owners, label)
	}
	return owners
}

// servingSANs checks every SAN of node's serving CSR. A SAN bound to
// another Node (its name, <its name>.<suffix>, or an IP it lists) is
// Denied; a SAN not proven the node's (not its name or <name>.<suffix>,
// an IP outside allowedIPRanges or not among the Node's addresses, or any
// IP while the Node is uninitialized) is held for a human. The
// first offending SAN is named, denials before holds.
func (r *servingRules) servingSANs(req *x509.CertificateRequest, node *corev1.Node, nodes nodeCache) *denial {
	var ips []netip.Addr
	for _, raw := range req.IPAddresses {
		ip, ok := addrOf(raw)
		if !ok {
			return deny(ReasonInvalidRequest, "IP subjectAltName %v does not parse", raw)
		}
		ips = append(ips, ip)
	}
	for _, name := range req.DNSNames {
		lower := strings.ToLower(name)
		for _, owner := range r.dnsOwners(lower) {
			if _, exists := nodes.get(owner); exists && owner != node.Name {
				return deny(ReasonSANNotAllowed, "DNS subjectAltName %q is bound to Node %s (its name, or its name under approval.allowedDNSSuffixes %v), not to the requesting Node %s", name, owner, r.dnsSuffixes, node.Name)
			}
		}
	}
	for _, ip := range ips {
		if others := nodes.othersWithIP(ip, node.Name); len(others) > 0 {
			return deny(ReasonSANNotAllowed, "IP subjectAltName %s is an address of Node %s, not only of the requesting Node %s", ip, strings.Join(others, ", "), node.Name)
		}
	}
	for _, name := range req.DNSNames {
		lower := strings.ToLower(name)
		label, rest, _ := strings.Cut(lower, ".")
		if lower != node.Name && (label != node.Name || !slices.Contains(r.dnsSuffixes, rest)) {
			return hold(ReasonSANNotAllowed, "DNS subjectAltName %q is neither the node's name %s nor %s.<suffix> for approval.allowedDNSSuffixes %v", name, node.Name, node.Name, r.dnsSuffixes)
		}
	}
	own := nodeAddrIPs(node)
	for _, ip := range ips {
		if !slices.ContainsFunc(r.ipRanges, func(p netip.Prefix) bool { return p.Contains(ip) }) {
			return hold(ReasonSANNotAllowed, "IP subjectAltName %s is not in approval.allowedIPRanges %v (none: no IP SAN is approved automatically)", ip, r.ipRanges)
		}
		if !slices.Contains(own, ip) {
			return hold(ReasonSANNotOnNode, "%s", notOnNode(ip, node))
		}
	}
	return nil
}

func addrOf(ip net.IP) (netip.Addr, bool) {
	a, ok := netip.AddrFromSlice(ip)
	return a.Unmap(), ok
}

// customRules are the approval rules of a csr-profile name: who may ask
// (approval.users/groups) and what (the name's csr rules, as the signer
// reads them).
type customRules struct {
	users, groups []string
	policy        *csrsigner.Policy // nil: the name has no csr rules
	nodeBound     bool
}

func newCustomRules(s config.Signer) (*customRules, error) {
	r := &customRules{users: s.Approval.Users, groups: s.Approval.Groups, nodeBound: s.Approval.NodeBound}
	if s.CSR == nil {
		return r, nil
	}
	p, err := csrsigner.NewPolicy(s)
	if err != nil {
		return nil, err
	}
	r.policy = p
	return r, nil
}

// customReasons name the signer's rule breaks as the approver's denials.
var customReasons = map[string]string{
	csrsigner.ReasonSubjectNotPermitted: ReasonSubjectNotAllowed,
	csrsigner.ReasonSANNotPermitted:     ReasonSANNotAllowed,
	csrsigner.ReasonUsagesNotPermitted:  ReasonUsageNotAllowed,
}

// check approves only a request from an allowed user or group whose
// subject, SANs and usages are within the csr rules; the first rule
// broken is named.
func (r *customRules) check(csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) *denial {
	if !slices.Contains(r.users, csr.Spec.Username) && !slices.ContainsFunc(csr.Spec.Groups, func(g string) bool { return slices.Contains(r.groups, g) }) {
		return deny(ReasonRequesterNotAllowed, "user %q (groups %v) is in neither approval.users nor approval.groups", csr.Spec.Username, csr.Spec.Groups)
	}
	if r.nodeBound {
		if _, ok := requestingNode(csr); !ok {
			return deny(ReasonRequesterNotAllowed, "approval.nodeBound: user %q (groups %v) is not a node identity (system:node:<name> in group system:nodes)", csr.Spec.Username, csr.Spec.Groups)
		}
	}
	if r.policy == nil {
		return deny(ReasonSubjectNotAllowed, "the signer name has no csr rules")
	}
	if v := r.policy.Check(req, csr.Spec.Usages); v != nil {
		reason, ok := customReasons[v.Reason]
		if !ok {
			reason = v.Reason
		}
		return deny(reason, "%s", v.Message)
	}
	if node, ok := requestingNode(csr); r.nodeBound && ok {
		return nodeBoundNames(node, req, r.policy.CSR)
	}
	return nil
}

// requestingNode is the node a CSR was requested by: its user is
// system:node:<name> and it is in group system:nodes (the Node
// authorizer's test of a node identity).
func requestingNode(csr *certificatesv1.CertificateSigningRequest) (string, bool) {
	node, ok := strings.CutPrefix(csr.Spec.Username, nodeUserPrefix)
	if !ok || len(validation.IsDNS1123Subdomain(node)) > 0 || !slices.Contains(csr.Spec.Groups, nodesGroup) {
		return "", false
	}
	return node, true
}

// nodeBoundNames checks that the subject CN and every DNS and URI SAN are
// the requesting node's own (approval.nodeBound): the node's name fills the
// wildcard of a csr rule that matches it, so where the name sits is fixed
// by the rules, not guessed. A CN or DNS name is <node>.<suffix> for a
// pattern *.<suffix>; a URI is <prefix><node> or <prefix><node>/<path> for
// a pattern <prefix>*, with no userinfo, query, fragment, percent-encoding
// or empty/dot path segments. Found anywhere else, the node's labels would
// bind nothing: a node named after a fixed label (daemons, com, node) could
// ask for every other node's names. IP SANs are checked against the
// Node's addresses by the controller.
func nodeBoundNames(node string, req *x509.CertificateRequest, rules *config.CSRPolicy) *denial {
	if strings.Contains(node, ".") && (req.Subject.CommonName != "" || len(req.DNSNames) > 0) {
		return deny(ReasonSubjectNotAllowed, "approval.nodeBound: node name %q is not one DNS label, so it cannot fill a pattern's * (which matches exactly one label); such a node obtains no CN or DNS name here", node)
	}
	if cn := req.Subject.CommonName; cn != "" && !boundName(cn, node, rules.CommonNames, false) {
		return deny(ReasonSubjectNotAllowed, "approval.nodeBound: subject CN %q is not %s.<suffix> for a commonNames pattern *.<suffix> %q (the requesting node's name must fill the pattern's *)", cn, node, rules.CommonNames)
	}
	for _, name := range req.DNSNames {
		if !boundName(name, node, rules.DNSNames, true) {
			return deny(ReasonSANNotAllowed, "approval.nodeBound: DNS subjectAltName %q is not %s.<suffix> for a dnsNames pattern *.<suffix> %q (the requesting node's name must fill the pattern's *)", name, node, rules.DNSNames)
		}
	}
	for _, u := range req.URIs {
		if !boundURI(u, node, rules.URIs) {
			return deny(ReasonSANNotAllowed, "approval.nodeBound: URI subjectAltName %q is not <prefix>%s or <prefix>%s/<path> for a uris pattern <prefix>* %q (the requesting node's name must fill the pattern's *; no userinfo, query, fragment, %%-escapes or empty, . or .. segments)", u, node, node, rules.URIs)
		}
	}
	return nil
}

// boundName reports whether name is node.<suffix> for one of the patterns
// *.<suffix>, the node's name filling the * as exactly one label (as the
// csr rules match a *): a node named n1.b is bound to no name, else under
// patterns *.b.example.com and *.example.com it would obtain
// n1.b.example.com, node n1's name under the first. DNS names (fold)
// compare ASCII case-insensitively, CNs exactly, as the csr rules match
// them.
func boundName(name, node string, patterns []string, fold bool) bool {
	if node == "" || strings.Contains(node, ".") {
		return false
	}
	for _, pat := range patterns {
		suffix, ok := strings.CutPrefix(pat, "*.")
		if !ok || suffix == "" {
			continue
		}
		want := node + "." + suffix
		if name == want || fold && asciiEqualFold(name, want) {
			return true
		}
	}
	return false
}

// asciiEqualFold is strings.EqualFold for ASCII only: no Unicode folding
// (the Kelvin sign K is not k).
func asciiEqualFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// boundURI reports whether u is <prefix>node or <prefix>node/<path> for one
// of the patterns <prefix>*, in the plain form of uripattern.Under.
func boundURI(u *url.URL, node string, patterns []string) bool {
	for _, pat := range patterns {
		prefix, ok := strings.CutSuffix(pat, "*")
		if !ok || prefix == "" {
			continue
		}
		if segs, ok := uripattern.Under(u, prefix); ok && segs[0] == node {
			return true
		}
	}
	return false
}

// nodeIPs checks that every IP SAN is an InternalIP or ExternalIP of
// node (as managers count them) and of no other Node.
func nodeIPs(req *x509.CertificateRequest, node *corev1.Node, nodes nodeCache) *denial {
	ips := nodeAddrIPs(node)
	for _, raw := range req.IPAddresses {
		ip, ok := addrOf(raw)
		if !ok {
			return deny(ReasonInvalidRequest, "IP subjectAltName %v does not parse", raw)
		}
		if others := nodes.othersWithIP(ip, node.Name); len(others) > 0 {
			return deny(ReasonSANNotAllowed, "approval.nodeBound: IP subjectAltName %s is an address of Node %s, not only of the requesting Node %s", ip, strings.Join(others, ", "), node.Name)
		}
		if !slices.Contains(ips, ip) {
			return deny(ReasonSANNotOnNode, "approval.nodeBound: %s", notOnNode(ip, node))
		}
	}
	return nil
}
