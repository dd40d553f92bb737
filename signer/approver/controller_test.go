package approver

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/signer/config"
	"github.com/prometheus/client_golang/prometheus"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	testclock "k8s.io/utils/clock/testing"
)

var now = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func pemRequest(t *testing.T, tmpl *x509.CertificateRequest) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

type csrSpec struct {
	signer  string
	user    string
	groups  []string
	usages  []certificatesv1.KeyUsage
	subject pkix.Name
	dns     []string
	ips     []string
	uris    []string
	emails  []string
	created time.Time
	status  certificatesv1.CertificateSigningRequestStatus
	// request, if set, replaces the PEM request built from the fields.
	request []byte
}

func (s csrSpec) build(t *testing.T, name string) *certificatesv1.CertificateSigningRequest {
	tmpl := &x509.CertificateRequest{Subject: s.subject, DNSNames: s.dns, EmailAddresses: s.emails}
	for _, ip := range s.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
	}
	for _, u := range s.uris {
		p, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, p)
	}
	created := s.created
	if created.IsZero() {
		created = now
	}
	request := pemRequest(t, tmpl)
	if s.request != nil {
		request = s.request
	}
	return &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(created)},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			SignerName: s.signer, Request: request, Usages: s.usages, Username: s.user, Groups: s.groups,
		},
		Status: s.status,
	}
}

var (
	servingUsages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
	clientUsages  = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageKeyEncipherment, certificatesv1.UsageClientAuth}
	nodeSubject   = pkix.Name{CommonName: "system:node:n1", Organization: []string{"system:nodes"}}
	nodeGroups    = []string{"system:nodes", "system:authenticated"}
)

func servingCSR(mod func(*csrSpec)) csrSpec {
	s := csrSpec{signer: kubeletServingName, user: "system:node:n1", groups: nodeGroups, usages: servingUsages,
		subject: nodeSubject, dns: []string{"n1", "n1.nodes.example.com"}, ips: []string{"10.0.0.5"}}
	if mod != nil {
		mod(&s)
	}
	return s
}

func clientCSR(user string, mod func(*csrSpec)) csrSpec {
	s := csrSpec{signer: kubeletClientName, user: user, groups: []string{"system:bootstrappers"}, usages: clientUsages, subject: nodeSubject}
	if user == "system:node:n1" {
		s.groups = nodeGroups
	}
	if mod != nil {
		mod(&s)
	}
	return s
}

func customCSR(user string, mod func(*csrSpec)) csrSpec {
	s := csrSpec{signer: "example.com/node-daemons", user: user, groups: []string{"system:authenticated"},
		usages:  []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		subject: pkix.Name{CommonName: "daemon.n1.daemons.example.com", Organization: []string{"daemons"}}, dns: []string{"daemon.n1.daemons.example.com"}}
	if mod != nil {
		mod(&s)
	}
	return s
}

// nodeBoundCSR is node n1 asking example.com/node-bound for its own names.
func nodeBoundCSR(mod func(*csrSpec)) csrSpec {
	s := csrSpec{signer: "example.com/node-bound", user: "system:node:n1", groups: nodeGroups,
		usages:  []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth},
		subject: pkix.Name{CommonName: "n1.daemons.example.com"}, dns: []string{"n1.daemons.example.com"},
		ips: []string{"10.0.0.5"}, uris: []string{"spiffe://example.com/node/n1/log-shipper"}}
	if mod != nil {
		mod(&s)
	}
	return s
}

func testSigners() []config.Signer {
	return []config.Signer{
		{Name: kubeletClientName, Profile: config.ProfileKubeAPIServerClientKubelet},
		{Name: kubeletServingName, Profile: config.ProfileKubeletServing,
			Approval: &config.Approval{AllowedDNSSuffixes: []string{"nodes.example.com"}, AllowedIPRanges: []string{"10.0.0.0/8"}}},
		{Name: "example.com/node-daemons", Profile: config.ProfileCSR,
			CSR: &config.CSRPolicy{TrustDistribution: "CTB", CommonNames: []string{"*.n1.daemons.example.com"}, Organizations: []string{"daemons"},
				DNSNames: []string{"*.n1.daemons.example.com"}, IPRanges: []string{"192.168.0.0/16"}, URIs: []string{"spiffe://example.com/*"},
				KeyUsages: []string{"digital signature", "client auth"}},
			Approval: &config.Approval{Users: []string{"alice"}, Groups: []string{"daemon-requesters"}}},
		{Name: "example.com/node-bound", Profile: config.ProfileCSR,
			CSR: &config.CSRPolicy{TrustDistribution: "CTB", CommonNames: []string{"*.daemons.example.com"},
				DNSNames: []string{"*.daemons.example.com"}, IPRanges: []string{"10.0.0.0/8"}, URIs: []string{"spiffe://example.com/node/*"},
				KeyUsages: []string{"digital signature", "client auth"}},
			Approval: &config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}},
		{Name: "example.com/nested", Profile: config.ProfileCSR,
			CSR: &config.CSRPolicy{TrustDistribution: "CTB", CommonNames: []string{"*.b.example.com", "*.example.com"},
				DNSNames: []string{"*.b.example.com", "*.example.com"}, KeyUsages: []string{"digital signature", "client auth"}},
			Approval: &config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}},
		{Name: "example.com/unapproved", Profile: config.ProfileCSR, CSR: &config.CSRPolicy{TrustDistribution: "CTB", KeyUsages: []string{"client auth"}}},
		{Name: "kubernetes.io/kube-apiserver-client", Profile: config.ProfileKubeAPIServerClient},
	}
}

// newTestController builds a controller on a fake clientset whose Node
// cache holds n1, n2 (10.0.0.6), b and n1.b; the SubjectAccessReviews
// allow exactly grants[user] subresources.
func newTestController(t *testing.T, grants map[string][]string) (*Controller, *fake.Clientset, *[]string) {
	t.Helper()
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
		{Type: corev1.NodeHostName, Address: "n1"},
		{Type: corev1.NodeInternalDNS, Address: "n1.nodes.example.com"},
		{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
		{Type: corev1.NodeExternalIP, Address: "203.0.113.5"},
		{Type: corev1.NodeExternalDNS, Address: "n1.public.example.org"},
	}}}
	client := fake.NewClientset()
	var reviews []string
	client.PrependReactor("create", "subjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
		ra := sar.Spec.ResourceAttributes
		reviews = append(reviews, sar.Spec.User+" "+ra.Verb+" "+ra.Resource+"/"+ra.Subresource)
		for _, s := range grants[sar.Spec.User] {
			sar.Status.Allowed = sar.Status.Allowed || (s == ra.Subresource && ra.Verb == "create" && ra.Group == "certificates.k8s.io")
		}
		return true, sar, nil
	})
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Client: client, Signers: testSigners(), Metrics: m, Clock: testclock.NewFakeClock(now)})
	if err != nil {
		t.Fatal(err)
	}
	c.nodesSynced = func() bool { return true } // the Nodes below are the whole cluster
	for _, n := range []*corev1.Node{node,
		{ObjectMeta: metav1.ObjectMeta{Name: "n2"}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeHostName, Address: "n2"}, {Type: corev1.NodeInternalIP, Address: "10.0.0.6"}}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "b"}},
		{ObjectMeta: metav1.ObjectMeta{Name: "n1.b"}},
	} {
		if err := c.nodeInformer.GetIndexer().Add(n); err != nil {
			t.Fatal(err)
		}
	}
	return c, client, &reviews
}

func TestDecisions(t *testing.T) {
	type want struct {
		outcome certificatesv1.RequestConditionType // "" = left undecided
		reason  string
		naming  string // the message names this (a SAN, user, rule)
		err     error  // errors.Is
		wait    bool   // looked at again later (waitError)
		held    string // left for a human with this reason
	}
	approved := want{outcome: certificatesv1.CertificateApproved, reason: ReasonAutoApproved}
	denied := func(reason, naming string) want {
		return want{outcome: certificatesv1.CertificateDenied, reason: reason, naming: naming}
	}
	held := func(reason, naming string) want { return want{held: reason, naming: naming} }
	grants := map[string][]string{"system:node:n1": {"selfnodeclient"}, "system:bootstrap:abcdef": {"nodeclient"}}
	cases := []struct {
		name string
		csr  csrSpec
		want want
	}{
		{"a node's serving CSR for its own addresses is approved", servingCSR(nil), approved},
		{"a serving CSR with an IP on no Node is left for a human naming it", servingCSR(func(s *csrSpec) { s.ips = []string{"10.0.0.5", "10.9.9.9"} }),
			held(ReasonSANNotOnNode, "10.9.9.9")},
		{"a serving CSR with a 64 KiB DNS name is left for a human", servingCSR(func(s *csrSpec) {
			s.dns = []string{strings.Repeat("a", 64<<10) + ".example.com"}
		}), held(ReasonSANNotAllowed, "aaaa")},
		{"a serving CSR with a DNS name that is not the node's is left for a human naming it", servingCSR(func(s *csrSpec) { s.dns = []string{"n1", "evil.example.com"} }),
			held(ReasonSANNotAllowed, "evil.example.com")},
		{"a serving CSR with a Node address outside the allowed ranges is left for a human naming it", servingCSR(func(s *csrSpec) { s.ips = []string{"203.0.113.5"} }),
			held(ReasonSANNotAllowed, "203.0.113.5")},
		{"a serving CSR with a Node DNS address outside the allowed suffixes is left for a human naming it", servingCSR(func(s *csrSpec) { s.dns = []string{"n1.public.example.org"} }),
			held(ReasonSANNotAllowed, "n1.public.example.org")},
		{"a serving CSR naming a wildcard is denied naming it", servingCSR(func(s *csrSpec) { s.dns = []string{"n1", "*.nodes.example.com"} }),
			denied(ReasonSANNotAllowed, "*.nodes.example.com")},
		{"a serving CSR with a star inside a label is denied naming it", servingCSR(func(s *csrSpec) { s.dns = []string{"n*.nodes.example.com"} }),
			denied(ReasonSANNotAllowed, "n*.nodes.example.com")},
		{"a serving CSR for another node's name under the suffix is denied naming that node", servingCSR(func(s *csrSpec) { s.dns = []string{"n1", "N2.nodes.example.com"} }),
			denied(ReasonSANNotAllowed, "Node n2")},
		{"a serving CSR for another node's bare name is denied naming that node", servingCSR(func(s *csrSpec) { s.dns = []string{"n2"} }),
			denied(ReasonSANNotAllowed, "Node n2")},
		{"a serving CSR for another node's IP is denied naming that node", servingCSR(func(s *csrSpec) { s.ips = []string{"10.0.0.5", "10.0.0.6"} }),
			denied(ReasonSANNotAllowed, "10.0.0.6 is an address of Node n2")},
		{"a serving CSR denies another node's IP before it holds an unproven name", servingCSR(func(s *csrSpec) { s.dns, s.ips = []string{"evil.example.com"}, []string{"10.0.0.6"} }),
			denied(ReasonSANNotAllowed, "Node n2")},
		{"a serving CSR requested by another node is denied", servingCSR(func(s *csrSpec) { s.user = "system:node:n2" }),
			denied(ReasonRequesterNotAllowed, "system:node:n2")},
		{"a serving CSR requested outside group system:nodes is denied", servingCSR(func(s *csrSpec) { s.groups = []string{"system:authenticated"} }),
			denied(ReasonRequesterNotAllowed, "system:node:n1")},
		{"a serving CSR without SANs is denied", servingCSR(func(s *csrSpec) { s.dns, s.ips = nil, nil }),
			denied(ReasonInvalidRequest, "DNS or IP")},
		{"a serving CSR with an email SAN is denied", servingCSR(func(s *csrSpec) { s.emails = []string{"root@n1"} }),
			denied(ReasonInvalidRequest, "root@n1")},
		{"a serving CSR with a URI SAN is denied", servingCSR(func(s *csrSpec) { s.uris = []string{"spiffe://x/y"} }),
			denied(ReasonInvalidRequest, "spiffe://x/y")},
		{"a serving CSR asking for client auth is denied", servingCSR(func(s *csrSpec) {
			s.usages = append(s.usages, certificatesv1.UsageClientAuth)
		}), denied(ReasonInvalidRequest, "client auth")},
		{"a serving CSR with key encipherment too is approved", servingCSR(func(s *csrSpec) {
			s.usages = append(s.usages, certificatesv1.UsageKeyEncipherment)
		}), approved},
		{"a serving CSR with another organization is denied", servingCSR(func(s *csrSpec) { s.subject.Organization = []string{"system:masters"} }),
			denied(ReasonInvalidRequest, "system:masters")},
		{"a serving CSR for a Node that does not exist yet is looked at again", servingCSR(func(s *csrSpec) {
			s.subject.CommonName, s.user = "system:node:n9", "system:node:n9"
		}), want{wait: true}},
		{"a serving CSR for a Node still missing after the wait is denied", servingCSR(func(s *csrSpec) {
			s.subject.CommonName, s.user, s.created = "system:node:n9", "system:node:n9", now.Add(-DefaultNodeWait)
		}), denied(ReasonNodeNotFound, "n9")},
		{"a node renewing its client certificate is approved (selfnodeclient)", clientCSR("system:node:n1", nil), approved},
		{"a bootstrap client CSR is approved (nodeclient)", clientCSR("system:bootstrap:abcdef", nil), approved},
		{"a client CSR from a requester no review allows is left undecided and retried", clientCSR("system:bootstrap:zzz", nil),
			want{err: errNotAuthorized}},
		{"a node asking for another node's client certificate without nodeclient is left undecided", clientCSR("system:node:n2", func(s *csrSpec) {
			s.groups = nodeGroups
		}), want{err: errNotAuthorized}},
		{"a client CSR with a SAN is left undecided", clientCSR("system:node:n1", func(s *csrSpec) { s.dns = []string{"n1"} }), want{}},
		{"a client CSR with server auth is left undecided", clientCSR("system:node:n1", func(s *csrSpec) {
			s.usages = []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth}
		}), want{}},
		{"a client CSR for another organization is left undecided", clientCSR("system:node:n1", func(s *csrSpec) {
			s.subject.Organization = []string{"system:masters"}
		}), want{}},
		{"a custom CSR from an allowed user is approved", customCSR("alice", nil), approved},
		{"a custom CSR from an allowed group is approved", customCSR("bob", func(s *csrSpec) { s.groups = []string{"daemon-requesters"} }), approved},
		{"a custom CSR from another user is denied naming them", customCSR("mallory", nil), denied(ReasonRequesterNotAllowed, "mallory")},
		{"a custom CSR with a DNS SAN outside the rules is denied naming it", customCSR("alice", func(s *csrSpec) {
			s.dns = append(s.dns, "a.b.n1.daemons.example.com")
		}), denied(ReasonSANNotAllowed, "a.b.n1.daemons.example.com")},
		{"a custom CSR with an IP outside the ranges is denied naming it", customCSR("alice", func(s *csrSpec) { s.ips = []string{"10.1.1.1"} }),
			denied(ReasonSANNotAllowed, "10.1.1.1")},
		{"a custom CSR with an allowed IP and URI is approved", customCSR("alice", func(s *csrSpec) {
			s.ips, s.uris = []string{"192.168.3.4"}, []string{"spiffe://example.com/ns/a"}
		}), approved},
		{"a custom CSR with a URI outside the rules is denied naming it", customCSR("alice", func(s *csrSpec) { s.uris = []string{"spiffe://other/x"} }),
			denied(ReasonSANNotAllowed, "spiffe://other/x")},
		{"a custom CSR with a CN outside the rules is denied naming it", customCSR("alice", func(s *csrSpec) { s.subject.CommonName = "admin" }),
			denied(ReasonSubjectNotAllowed, "admin")},
		{"a custom CSR with another organization is denied naming it", customCSR("alice", func(s *csrSpec) {
			s.subject.Organization = []string{"system:masters"}
		}), denied(ReasonSubjectNotAllowed, "system:masters")},
		{"a custom CSR with an organizational unit is denied", customCSR("alice", func(s *csrSpec) { s.subject.OrganizationalUnit = []string{"x"} }),
			denied(ReasonSubjectNotAllowed, "OU=x")},
		{"a custom CSR asking for server auth is denied naming it", customCSR("alice", func(s *csrSpec) {
			s.usages = append(s.usages, certificatesv1.UsageServerAuth)
		}), denied(ReasonUsageNotAllowed, "server auth")},
		{"a node-bound CSR from the node for its own names and address is approved", nodeBoundCSR(nil), approved},
		{"a node-bound CSR for another node's CN is denied naming it", nodeBoundCSR(func(s *csrSpec) { s.user = "system:node:n2" }),
			denied(ReasonSubjectNotAllowed, "n1.daemons.example.com")},
		{"a node-bound CSR for another node's DNS name is denied naming it", nodeBoundCSR(func(s *csrSpec) {
			s.dns = append(s.dns, "n2.daemons.example.com")
		}), denied(ReasonSANNotAllowed, "n2.daemons.example.com")},
		{"a node-bound CSR matches whole labels only (n1 is not in n10)", nodeBoundCSR(func(s *csrSpec) {
			s.subject.CommonName, s.dns = "n10.daemons.example.com", nil
		}), denied(ReasonSubjectNotAllowed, "n10.daemons.example.com")},
		{"a node-bound CSR with an IP that is not the Node's is denied naming it", nodeBoundCSR(func(s *csrSpec) { s.ips = []string{"10.9.9.9"} }),
			denied(ReasonSANNotOnNode, "10.9.9.9")},
		{"a node-bound CSR with a URI not naming the node is denied naming it", nodeBoundCSR(func(s *csrSpec) {
			s.uris = []string{"spiffe://example.com/node/n2/log-shipper"}
		}), denied(ReasonSANNotAllowed, "spiffe://example.com/node/n2/log-shipper")},
		{"a node-bound CSR from a node named after a fixed label of the rules (daemons) for another node's name is denied", nodeBoundCSR(func(s *csrSpec) {
			s.user, s.ips, s.uris = "system:node:daemons", nil, nil
		}), denied(ReasonSubjectNotAllowed, "n1.daemons.example.com")},
		{"a node-bound CSR from a node named after the TLD (com) for another node's DNS name is denied", nodeBoundCSR(func(s *csrSpec) {
			s.user, s.subject.CommonName, s.ips, s.uris = "system:node:com", "com.daemons.example.com", nil, nil
		}), denied(ReasonSANNotAllowed, "n1.daemons.example.com")},
		{"a node-bound CSR with the node's name as a later path segment of another node's URI is denied", nodeBoundCSR(func(s *csrSpec) {
			s.uris = []string{"spiffe://example.com/node/n2/n1"}
		}), denied(ReasonSANNotAllowed, "spiffe://example.com/node/n2/n1")},
		{"a node-bound CSR from a node named after a service label for another node's URI is denied", nodeBoundCSR(func(s *csrSpec) {
			s.user, s.subject.CommonName, s.dns, s.ips = "system:node:log-shipper", "log-shipper.daemons.example.com", nil, nil
		}), denied(ReasonSANNotAllowed, "spiffe://example.com/node/n1/log-shipper")},
		{"a node-bound CSR with a URI that climbs out of the node's path (..) is denied", nodeBoundCSR(func(s *csrSpec) {
			s.uris = []string{"spiffe://example.com/node/n1/../n2/log-shipper"}
		}), denied(ReasonSANNotAllowed, "n2/log-shipper")},
		{"a node-bound CSR with a percent-escaped slash in its URI is denied", nodeBoundCSR(func(s *csrSpec) {
			s.uris = []string{"spiffe://example.com/node/n1%2F..%2Fn2"}
		}), denied(ReasonSANNotAllowed, "n2")},
		{"a node-bound CSR from a non-node user in group system:nodes is denied", nodeBoundCSR(func(s *csrSpec) { s.user = "alice" }),
			denied(ReasonRequesterNotAllowed, "not a node identity")},
		{"a node-bound CSR with an IP from a Node that does not exist yet is looked at again", nodeBoundCSR(func(s *csrSpec) {
			s.user, s.subject.CommonName, s.dns, s.uris = "system:node:n9", "n9.daemons.example.com", nil, nil
		}), want{wait: true}},
		{"a nested node-bound CSR: node n1 fills * in *.b.example.com as one label and is approved", nodeBoundCSR(func(s *csrSpec) {
			s.signer, s.subject.CommonName, s.dns, s.ips, s.uris = "example.com/nested", "n1.b.example.com", []string{"n1.b.example.com"}, nil, nil
		}), approved},
		{"a nested node-bound CSR: node b obtains b.example.com", nodeBoundCSR(func(s *csrSpec) {
			s.signer, s.user, s.subject.CommonName, s.dns, s.ips, s.uris = "example.com/nested", "system:node:b", "b.example.com", []string{"b.example.com"}, nil, nil
		}), approved},
		{"a nested node-bound CSR: node n1.b does not obtain n1.b.example.com (node n1's name under *.b.example.com) through *.example.com", nodeBoundCSR(func(s *csrSpec) {
			s.signer, s.user, s.subject.CommonName, s.dns, s.ips, s.uris = "example.com/nested", "system:node:n1.b", "n1.b.example.com", []string{"n1.b.example.com"}, nil, nil
		}), denied(ReasonSubjectNotAllowed, "not one DNS label")},
		{"a node-bound CSR for another node's IP is denied naming that node", nodeBoundCSR(func(s *csrSpec) { s.ips = []string{"10.0.0.6"} }),
			denied(ReasonSANNotAllowed, "Node n2")},
		{"a custom name without an approval section is never touched", customCSR("alice", func(s *csrSpec) { s.signer = "example.com/unapproved" }), want{}},
		{"kube-apiserver-client CSRs are never touched", clientCSR("system:node:n1", func(s *csrSpec) { s.signer = "kubernetes.io/kube-apiserver-client" }), want{}},
		{"a signer name not configured is never touched", customCSR("alice", func(s *csrSpec) { s.signer = "example.com/other" }), want{}},
		{"an already denied CSR is never touched", servingCSR(func(s *csrSpec) {
			s.status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue}}
		}), want{}},
		{"a Failed CSR is never touched", clientCSR("system:node:n1", func(s *csrSpec) {
			s.status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue}}
		}), want{}},
		{"a CSR with a certificate is never touched", customCSR("mallory", func(s *csrSpec) { s.status.Certificate = []byte("x") }), want{}},
	}
	garbled := func(s csrSpec) csrSpec { s.request = []byte("not PEM"); return s }
	cases = append(cases, []struct {
		name string
		csr  csrSpec
		want want
	}{
		{"a kubelet client CSR whose request does not parse is left undecided", garbled(clientCSR("system:node:n1", nil)), want{}},
		{"a kubelet serving CSR whose request does not parse is denied", garbled(servingCSR(nil)), denied(ReasonInvalidRequest, "spec.request")},
	}...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, client, reviews := newTestController(t, grants)
			ctx := context.Background()
			csr := tc.csr.build(t, "csr-1")
			if _, err := client.CertificatesV1().CertificateSigningRequests().Create(ctx, csr, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			err := c.decide(ctx, csr)
			var w *waitError
			switch {
			case tc.want.err != nil:
				if !errors.Is(err, tc.want.err) {
					t.Fatalf("err = %v, want %v", err, tc.want.err)
				}
			case tc.want.wait:
				if !errors.As(err, &w) || w.after <= 0 {
					t.Fatalf("err = %v, want a wait", err)
				}
			case err != nil:
				t.Fatalf("decide: %v", err)
			}
			got, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, "csr-1", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			added := got.Status.Conditions[len(csr.Status.Conditions):]
			if tc.want.held != "" {
				msg := c.held[queueKey{signer: csr.Spec.SignerName, name: csr.Name}]
				if len(added) > 0 || msg == "" || !strings.Contains(msg, tc.want.naming) {
					t.Fatalf("conditions added %+v, held %q; want left for a human naming %q", added, msg, tc.want.naming)
				}
				return
			}
			if tc.want.outcome == "" {
				if len(added) > 0 {
					t.Fatalf("decided %+v, want undecided (reviews %v)", added, *reviews)
				}
				return
			}
			if len(added) != 1 {
				t.Fatalf("conditions added %+v, want one %s", added, tc.want.outcome)
			}
			cond := added[0]
			if cond.Type != tc.want.outcome || cond.Status != corev1.ConditionTrue || cond.Reason != tc.want.reason {
				t.Fatalf("condition %s/%s %s: %s, want %s %s", cond.Type, cond.Status, cond.Reason, cond.Message, tc.want.outcome, tc.want.reason)
			}
			if len(cond.Message) > kubemsg.MaxConditionMessage {
				t.Errorf("message of %d bytes, want at most %d", len(cond.Message), kubemsg.MaxConditionMessage)
			}
			if !strings.Contains(cond.Message, tc.want.naming) {
				t.Errorf("message %q does not name %q", cond.Message, tc.want.naming)
			}
		})
	}
}

// The SubjectAccessReviews are kube-controller-manager's: a node renewing
// its own credential is asked about selfnodeclient first; a bootstrap
// identity only about nodeclient.
func TestKubeletClientReviews(t *testing.T) {
	cases := []struct {
		name string
		user string
		want []string
	}{
		{"a node renewing its own credential is reviewed for selfnodeclient only when that is allowed", "system:node:n1",
			[]string{"system:node:n1 create certificatesigningrequests/selfnodeclient"}},
		{"a bootstrap token is reviewed for nodeclient only", "system:bootstrap:abcdef",
			[]string{"system:bootstrap:abcdef create certificatesigningrequests/nodeclient"}},
		{"a requester allowed nothing is reviewed for nodeclient only when it is not the node", "system:bootstrap:zzz",
			[]string{"system:bootstrap:zzz create certificatesigningrequests/nodeclient"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, _, reviews := newTestController(t, map[string][]string{"system:node:n1": {"selfnodeclient"}, "system:bootstrap:abcdef": {"nodeclient"}})
			_ = c.decide(context.Background(), clientCSR(tc.user, nil).build(t, "csr-1"))
			if strings.Join(*reviews, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("reviews %v, want %v", *reviews, tc.want)
			}
		})
	}
}

// A configuration shared with the signer that has nothing to approve
// (only PodCertificateRequest names, a csr name without approval) makes an
// approver that idles ready instead of failing: the shipped Deployment
// mounts the signer's ConfigMap.
func TestNothingToApproveIdles(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Options{Client: fake.NewClientset(), Metrics: m, Signers: []config.Signer{
		{Name: "keyward.dev/pod-identity", Profile: config.ProfilePodIdentity},
		{Name: "example.com/unapproved", Profile: config.ProfileCSR, CSR: &config.CSRPolicy{KeyUsages: []string{"client auth"}}},
	}})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if names := c.SignerNames(); len(names) != 0 {
		t.Fatalf("approves for %v, want nothing", names)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	if err := wait.PollUntilContextTimeout(context.Background(), 10*time.Millisecond, time.Minute, true,
		func(context.Context) (bool, error) { return c.HasSynced(), nil }); err != nil {
		t.Fatalf("never ready: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
