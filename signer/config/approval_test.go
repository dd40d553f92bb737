package config_test

import (
	"testing"

	"github.com/keyward/keyward/signer/config"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Approval sections are checked field by field: each error names its path
// and kind, and a valid section passes.
func TestApprovalValidationNamesTheField(t *testing.T) {
	serving := func(a *config.Approval) config.Signer {
		return config.Signer{Name: "kubernetes.io/kubelet-serving", Profile: config.ProfileKubeletServing, Approval: a}
	}
	custom := func(a *config.Approval) config.Signer {
		return config.Signer{Name: "example.com/node-daemons", Profile: config.ProfileCSR,
			CSR: &config.CSRPolicy{TrustDistribution: "ClusterTrustBundle", KeyUsages: []string{"client auth"}}, Approval: a}
	}
	withCSR := func(s config.Signer, change func(*config.CSRPolicy)) config.Signer {
		c := *s.CSR
		change(&c)
		s.CSR = &c
		return s
	}
	cases := []struct {
		name      string
		signer    config.Signer
		wantField string
		wantType  field.ErrorType
	}{
		{"a kubelet serving approval with suffixes and ranges is valid", serving(&config.Approval{
			AllowedDNSSuffixes: []string{"nodes.example.com"}, AllowedIPRanges: []string{"10.0.0.0/8", "fd00::/8"}}), "", ""},
		{"an empty kubelet serving approval is valid", serving(&config.Approval{}), "", ""},
		{"a custom approval naming a group is valid", custom(&config.Approval{Groups: []string{"system:nodes"}}), "", ""},
		{"a range that is not a CIDR is refused", serving(&config.Approval{AllowedIPRanges: []string{"10.0.0.0/8", "10.1.2.3"}}),
			"signers[0].approval.allowedIPRanges[1]", field.ErrorTypeInvalid},
		{"a range with host bits set is refused", serving(&config.Approval{AllowedIPRanges: []string{"10.1.2.3/8"}}),
			"signers[0].approval.allowedIPRanges[0]", field.ErrorTypeInvalid},
		{"a suffix with a leading dot is refused", serving(&config.Approval{AllowedDNSSuffixes: []string{".example.com"}}),
			"signers[0].approval.allowedDNSSuffixes[0]", field.ErrorTypeInvalid},
		{"a wildcard suffix is refused", serving(&config.Approval{AllowedDNSSuffixes: []string{"*.example.com"}}),
			"signers[0].approval.allowedDNSSuffixes[0]", field.ErrorTypeInvalid},
		{"users on a kubelet serving name are refused", serving(&config.Approval{Users: []string{"alice"}}),
			"signers[0].approval.users", field.ErrorTypeForbidden},
		{"groups on the kubelet client name are refused", config.Signer{Name: "kubernetes.io/kube-apiserver-client-kubelet",
			Profile: config.ProfileKubeAPIServerClientKubelet, Approval: &config.Approval{Groups: []string{"system:nodes"}}},
			"signers[0].approval.groups", field.ErrorTypeForbidden},
		{"suffixes on a custom name are refused", custom(&config.Approval{Users: []string{"alice"}, AllowedDNSSuffixes: []string{"example.com"}}),
			"signers[0].approval.allowedDNSSuffixes", field.ErrorTypeForbidden},
		{"a node-bound custom approval is valid", custom(&config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}), "", ""},
		{"a node-bound custom approval whose DNS pattern the node's name fills is valid", withCSR(custom(&config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}),
			func(c *config.CSRPolicy) {
				c.CommonNames, c.DNSNames, c.URIs = []string{"*.daemons.example.com"}, []string{"*.daemons.example.com"}, []string{"spiffe://example.com/node/*"}
			}), "", ""},
		{"a node-bound custom approval with the common name pattern * (no place for the node's name) is refused", withCSR(custom(&config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}),
			func(c *config.CSRPolicy) { c.CommonNames = []string{"*.daemons.example.com", "*"} }),
			"signers[0].csr.commonNames[1]", field.ErrorTypeInvalid},
		{"a node-bound custom approval with an exact DNS name is refused", withCSR(custom(&config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}),
			func(c *config.CSRPolicy) { c.DNSNames = []string{"daemon.example.com"} }),
			"signers[0].csr.dnsNames[0]", field.ErrorTypeInvalid},
		{"a node-bound custom approval with an exact common name is refused", withCSR(custom(&config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}),
			func(c *config.CSRPolicy) { c.CommonNames = []string{"daemon.example.com"} }),
			"signers[0].csr.commonNames[0]", field.ErrorTypeInvalid},
		{"a node-bound custom approval with an exact URI is refused", withCSR(custom(&config.Approval{Groups: []string{"system:nodes"}, NodeBound: true}),
			func(c *config.CSRPolicy) { c.URIs = []string{"spiffe://example.com/daemon"} }),
			"signers[0].csr.uris[0]", field.ErrorTypeInvalid},
		{"nodeBound on a kubelet serving name is refused", serving(&config.Approval{NodeBound: true}),
			"signers[0].approval.nodeBound", field.ErrorTypeForbidden},
		{"a custom approval naming nobody is refused", custom(&config.Approval{}),
			"signers[0].approval.users", field.ErrorTypeRequired},
		{"an empty user name is refused", custom(&config.Approval{Users: []string{""}}),
			"signers[0].approval.users[0]", field.ErrorTypeInvalid},
		{"any approval of kube-apiserver-client is refused", config.Signer{Name: "kubernetes.io/kube-apiserver-client",
			Profile: config.ProfileKubeAPIServerClient, Approval: &config.Approval{}},
			"signers[0].approval", field.ErrorTypeForbidden},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.SignerConfiguration{APIVersion: config.APIVersion, Kind: config.Kind, Signers: []config.Signer{tc.signer}}
			cfg.Default()
			errs := cfg.Validate()
			if tc.wantField == "" {
				if len(errs) > 0 {
					t.Fatalf("refused a valid approval: %v", errs)
				}
				return
			}
			for _, e := range errs {
				if e.Field == tc.wantField && e.Type == tc.wantType {
					return
				}
			}
			t.Fatalf("want a %s error at %s, got %v", tc.wantType, tc.wantField, errs)
		})
	}
}
