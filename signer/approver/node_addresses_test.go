package approver

import (
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/config"
	corev1 "k8s.io/api/core/v1"
)

func TestKubeletServingApprovalIsOptIn(t *testing.T) {
	cases := []struct {
		name   string
		signer config.Signer
		want   bool
	}{
		{"a kubelet serving name without an approval section is never approved (as kube-controller-manager)", config.Signer{Name: kubeletServingName, Profile: config.ProfileKubeletServing}, false},
		{"a kubelet serving name with an approval section is approved by the rules", config.Signer{Name: kubeletServingName, Profile: config.ProfileKubeletServing, Approval: &config.Approval{}}, true},
		{"the kubelet client name is approved by SubjectAccessReview as before", config.Signer{Name: kubeletClientName, Profile: config.ProfileKubeAPIServerClientKubelet}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Approves(tc.signer); got != tc.want {
				t.Fatalf("Approves = %v, want %v", got, tc.want)
			}
		})
	}
}

// Until the cloud controller has initialized a Node (removed the taint
// kubelet registers with under --cloud-provider=external), its addresses
// are only what the node registered with: no IP SAN counts as on the
// Node, for kubelet serving (held) and nodeBound (denied) alike, and the
// message names the taint. Once the taint is gone the same IP counts.
func TestAnUninitializedNodesAddressesAreNotProof(t *testing.T) {
	r, err := newServingRules(&config.Approval{AllowedIPRanges: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := newTestController(t, nil)
	node, _ := c.nodes.get("n1")
	tainted := node.DeepCopy()
	tainted.Spec.Taints = []corev1.Taint{{Key: TaintUninitialized, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
	req := (&x509Request{ips: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}).build()

	d := r.servingSANs(req, tainted, c.nodes)
	if d == nil || !d.hold || d.reason != ReasonSANNotOnNode || !strings.Contains(d.message, TaintUninitialized) {
		t.Fatalf("serving, uninitialized: got %+v, want held %s naming the taint", d, ReasonSANNotOnNode)
	}
	if d := nodeIPs(req, tainted, c.nodes); d == nil || d.hold || d.reason != ReasonSANNotOnNode || !strings.Contains(d.message, TaintUninitialized) {
		t.Fatalf("nodeBound, uninitialized: got %+v, want denied %s naming the taint", d, ReasonSANNotOnNode)
	}
	if d := r.servingSANs(req, node, c.nodes); d != nil {
		t.Fatalf("serving, initialized: got %+v, want approved", d)
	}
	if d := nodeIPs(req, node, c.nodes); d != nil {
		t.Fatalf("nodeBound, initialized: got %+v, want approved", d)
	}
	if got := nodeAddrIPs(node); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("203.0.113.5")}) {
		t.Fatalf("nodeAddrIPs = %v, want the InternalIP and ExternalIP only", got)
	}
}

type x509Request struct{ ips []netip.Addr }

func (r *x509Request) build() *x509.CertificateRequest {
	req := &x509.CertificateRequest{}
	for _, ip := range r.ips {
		req.IPAddresses = append(req.IPAddresses, net.IP(ip.AsSlice()))
	}
	return req
}

// Nothing is decided on an incomplete Node cache (a missing nodes grant
// keeps it so): a Node absent from it may exist, and another Node may
// hold the same IP. The CSR is looked at again later, not denied
// NodeNotFound, and not approved.
func TestAnUnsyncedNodeCacheDecidesNothing(t *testing.T) {
	c, _, _ := newTestController(t, nil)
	c.nodesSynced = func() bool { return false }
	node, err := c.getNode(t.Context(), nil, "n1")
	var w *waitError
	if node != nil || !errors.As(err, &w) || !strings.Contains(err.Error(), "list and watch nodes") {
		t.Fatalf("getNode on an unsynced cache = %v, %v; want a waitError naming the nodes grant", node, err)
	}
}
