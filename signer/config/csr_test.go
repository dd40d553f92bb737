package config_test

import (
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/config"
)

const csrBase = `apiVersion: keyward.dev/v1alpha1
kind: SignerConfiguration
signers:
- name: keyward.dev/pod-identity
  profile: podIdentity
- name: example.com/node-daemons
  profile: csr
  csr:
    trustDistribution: ClusterTrustBundle example.com:node-daemons:live
    commonNames: ["*.nodes.example.com"]
    organizations: [example]
    dnsNames: ["*.nodes.example.com"]
    ipRanges: [10.0.0.0/8]
    uris: ["spiffe://example.com/*"]
    keyUsages: [digital signature, client auth]
- name: kubernetes.io/kubelet-serving
  profile: kubeletServing
`

func TestCSRPolicyLoads(t *testing.T) {
	cfg, err := config.Parse([]byte(csrBase))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Signers[1].CSR; p == nil || len(p.KeyUsages) != 2 {
		t.Fatalf("csr policy = %+v", p)
	}
}

// Every bad CSRPolicy field is refused with its path.
func TestBadCSRPoliciesNameTheField(t *testing.T) {
	cases := []struct {
		name      string
		from, to  string
		wantField string
	}{
		{"an empty trust distribution", "trustDistribution: ClusterTrustBundle example.com:node-daemons:live", "trustDistribution: ' '", "signers[1].csr.trustDistribution"},
		{"a CN pattern with a wildcard inside", `commonNames: ["*.nodes.example.com"]`, `commonNames: ["a.*.example.com"]`, "signers[1].csr.commonNames[0]"},
		{"a DNS pattern of any name", `dnsNames: ["*.nodes.example.com"]`, `dnsNames: ["*"]`, "signers[1].csr.dnsNames[0]"},
		{"an IP range that is no CIDR", "ipRanges: [10.0.0.0/8]", "ipRanges: [10.0.0.0]", "signers[1].csr.ipRanges[0]"},
		{"a URI pattern with a wildcard inside", `uris: ["spiffe://example.com/*"]`, `uris: ["spiffe://*/x"]`, "signers[1].csr.uris[0]"},
		{"a URI pattern whose star does not follow a slash", `uris: ["spiffe://example.com/*"]`, `uris: ["spiffe://example.com*"]`, "signers[1].csr.uris[0]"},
		{"an unknown usage", "keyUsages: [digital signature, client auth]", "keyUsages: [digital signature, clientauth]", "signers[1].csr.keyUsages[1]"},
		{"a CA usage", "keyUsages: [digital signature, client auth]", "keyUsages: [cert sign, client auth]", "signers[1].csr.keyUsages[0]"},
		{"no usages", "keyUsages: [digital signature, client auth]", "keyUsages: []", "signers[1].csr.keyUsages"},
		{"an empty organization", "organizations: [example]", "organizations: ['']", "signers[1].csr.organizations[0]"},
		{"a csr block on a kubernetes.io profile", "  profile: kubeletServing\n", "  profile: kubeletServing\n  csr: {trustDistribution: x, keyUsages: [client auth]}\n", "signers[2].csr"},
		{"a kubernetes.io profile under another name", "- name: kubernetes.io/kubelet-serving", "- name: kubernetes.io/kube-apiserver-client", "signers[2].name"},
		{"a csr profile without its rules", "  profile: csr\n  csr:\n", "  profile: csr\n  csrx:\n", "signers[1]"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.Contains(csrBase, tc.from) {
				t.Fatalf("fixture lacks %q", tc.from)
			}
			checkRefused(t, strings.Replace(csrBase, tc.from, tc.to, 1), tc.wantField)
		})
	}
}
