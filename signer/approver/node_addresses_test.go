package approver

import (
	"crypto/x509"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/keyward/keyward/signer/config"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

func managed(manager, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, Subresource: "status", FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
}

func TestTrustedAddressManagersCountOnlyTheirEntries(t *testing.T) {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1", ManagedFields: []metav1.ManagedFieldsEntry{
			managed("cloud-controller-manager", `{"f:status":{"f:addresses":{".":{},"k:{\"type\":\"InternalIP\"}":{".":{},"f:address":{},"f:type":{}}}}}`),
			managed("kubelet", `{"f:status":{"f:addresses":{"k:{\"type\":\"ExternalIP\"}":{".":{},"f:address":{},"f:type":{}}},"f:conditions":{}}}`),
			// Owns the entry's type only: someone else wrote the address.
			managed("cloud-controller-manager", `{"f:status":{"f:addresses":{"k:{\"type\":\"Hostname\"}":{"f:type":{}}}}}`),
		}},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{
			{Type: corev1.NodeInternalIP, Address: "10.0.0.5"},
			{Type: corev1.NodeExternalIP, Address: "203.0.113.5"},
		}},
	}
	cases := []struct {
		name     string
		managers []string
		want     []string
	}{
		{"without trusted managers every InternalIP and ExternalIP counts", nil, []string{"10.0.0.5", "203.0.113.5"}},
		{"with cloud-controller-manager trusted only the InternalIP it wrote counts", []string{"cloud-controller-manager"}, []string{"10.0.0.5"}},
		{"with a manager that wrote nothing no address counts", []string{"nobody"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, ip := range nodeAddrIPs(node, tc.managers) {
				got = append(got, ip.String())
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("counted %v, want %v", got, tc.want)
			}
		})
	}
	if got := trustedAddressTypes(node, []string{"cloud-controller-manager"}); got[corev1.NodeHostName] {
		t.Errorf("an entry whose address the manager does not own counts as trusted: %v", got)
	}
}

func TestAServingIPIsHeldUnlessATrustedManagerWroteIt(t *testing.T) {
	r, err := newServingRules(&config.Approval{AllowedIPRanges: []string{"10.0.0.0/8"}, TrustedAddressManagers: []string{"cloud-controller-manager"}})
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := newTestController(t, nil)
	node, _ := c.nodes.get("n1") // its addresses carry no managedFields
	req := &x509Request{ips: []netip.Addr{netip.MustParseAddr("10.0.0.5")}}
	d := r.servingSANs(req.build(), node, c.nodes)
	if d == nil || !d.hold || d.reason != ReasonSANNotOnNode {
		t.Fatalf("got %+v, want held %s", d, ReasonSANNotOnNode)
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
