package rbac

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/config"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

func baseInput() Input {
	return Input{
		Namespace: "keyward",
		Signer: &SignerInput{PCRSigners: []string{"keyward.dev/pod-identity"},
			CSRSigners: []string{"keyward.dev/node-daemons"}, TrustPublisher: true},
		Approver:     &ApproverInput{Signers: []string{"keyward.dev/node-daemons", "kubernetes.io/kubelet-serving"}},
		TokenService: &TokenServiceInput{SignerName: "keyward.dev/registry-token", TrustPublisher: true},
		NodeAgent:    true,
	}
}

func TestRenderIsDeterministicWhateverTheNamesOrder(t *testing.T) {
	a := baseInput()
	b := baseInput()
	b.Approver.Signers = []string{"kubernetes.io/kubelet-serving", "keyward.dev/node-daemons"}
	ya, err := RenderYAML(a)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		yb, err := RenderYAML(b)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(ya, yb) {
			t.Fatalf("renderings differ:\n%s\n---- vs ----\n%s", ya, yb)
		}
	}
}

func TestFromSignerConfigSplitsNamesByProfile(t *testing.T) {
	off := false
	cfg := &config.SignerConfiguration{
		Signers: []config.Signer{
			{Name: "keyward.dev/pod-identity", Profile: config.ProfilePodIdentity},
			{Name: "keyward.dev/mesh", Profile: config.ProfileSPIFFE},
			{Name: "keyward.dev/node-daemons", Profile: config.ProfileCSR, Approval: &config.Approval{Groups: []string{"system:nodes"}}},
			{Name: "keyward.dev/batch", Profile: config.ProfileCSR},
			{Name: "kubernetes.io/kubelet-serving", Profile: config.ProfileKubeletServing, Approval: &config.Approval{}},
			{Name: "kubernetes.io/kube-apiserver-client-kubelet", Profile: config.ProfileKubeAPIServerClientKubelet},
		},
		TrustPublisher: config.TrustPublisher{Enabled: &off},
	}
	got := FromSignerConfig(cfg)
	if want := []string{"keyward.dev/pod-identity", "keyward.dev/mesh"}; !slices.Equal(got.PCRSigners, want) {
		t.Errorf("PCRSigners %v, want %v", got.PCRSigners, want)
	}
	if want := []string{"keyward.dev/node-daemons", "keyward.dev/batch", "kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"}; !slices.Equal(got.CSRSigners, want) {
		t.Errorf("CSRSigners %v, want %v", got.CSRSigners, want)
	}
	if got.TrustPublisher {
		t.Error("TrustPublisher true, want false (disabled in the configuration)")
	}
	if got.LeaseName != SignerName {
		t.Errorf("LeaseName %q, want %q", got.LeaseName, SignerName)
	}
	ap := ApproverFromSignerConfig(cfg)
	if want := []string{"keyward.dev/node-daemons", "kubernetes.io/kubelet-serving", "kubernetes.io/kube-apiserver-client-kubelet"}; !slices.Equal(ap.Signers, want) {
		t.Errorf("approver names %v, want %v (csr names without approval are not its)", ap.Signers, want)
	}
	cfg.Signers[4].Approval = nil
	if ap := ApproverFromSignerConfig(cfg); slices.Contains(ap.Signers, "kubernetes.io/kubelet-serving") {
		t.Errorf("approver names %v include kubernetes.io/kubelet-serving without an approval section (auto-approval of serving CSRs is opt-in)", ap.Signers)
	}
}

// decodeStrict decodes every document of y strictly into its typed object.
func decodeStrict(t *testing.T, y []byte) map[string][]rbacv1.PolicyRule {
	t.Helper()
	rules := map[string][]rbacv1.PolicyRule{}
	for _, doc := range strings.Split(string(y), "\n---\n") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("decoding %q: %v", doc, err)
		}
		switch meta.Kind {
		case "ServiceAccount":
			var sa corev1.ServiceAccount
			if err := yaml.UnmarshalStrict([]byte(doc), &sa); err != nil {
				t.Fatalf("strict decoding:\n%s\n%v", doc, err)
			}
		case "ClusterRole":
			var cr rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict([]byte(doc), &cr); err != nil {
				t.Fatalf("strict decoding:\n%s\n%v", doc, err)
			}
			rules[cr.Name] = cr.Rules
		case "Role":
			var r rbacv1.Role
			if err := yaml.UnmarshalStrict([]byte(doc), &r); err != nil {
				t.Fatalf("strict decoding:\n%s\n%v", doc, err)
			}
			rules[r.Namespace+"/"+r.Name] = r.Rules
		case "ClusterRoleBinding":
			var b rbacv1.ClusterRoleBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
				t.Fatalf("strict decoding:\n%s\n%v", doc, err)
			}
		case "RoleBinding":
			var b rbacv1.RoleBinding
			if err := yaml.UnmarshalStrict([]byte(doc), &b); err != nil {
				t.Fatalf("strict decoding:\n%s\n%v", doc, err)
			}
		default:
			t.Fatalf("unexpected document kind %q:\n%s", meta.Kind, doc)
		}
	}
	return rules
}

func TestRenderedYAMLParsesStrictlyAndMatchesRender(t *testing.T) {
	in := baseInput()
	y, err := RenderYAML(in)
	if err != nil {
		t.Fatal(err)
	}
	rules := decodeStrict(t, y)
	objs, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if cr, ok := o.(*rbacv1.ClusterRole); ok && !slices.EqualFunc(cr.Rules, rules[cr.Name], policyRuleEqual) {
			t.Errorf("ClusterRole %s: YAML rules %v, Render's %v", cr.Name, rules[cr.Name], cr.Rules)
		}
	}
}

func policyRuleEqual(a, b rbacv1.PolicyRule) bool {
	return slices.Equal(a.APIGroups, b.APIGroups) && slices.Equal(a.Resources, b.Resources) &&
		slices.Equal(a.ResourceNames, b.ResourceNames) && slices.Equal(a.Verbs, b.Verbs)
}

func TestEveryRuleCarriesAComment(t *testing.T) {
	y, err := RenderYAML(baseInput())
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(y), "\n")
	for i, line := range lines {
		if strings.HasPrefix(line, "- apiGroups:") && !strings.HasPrefix(lines[i-1], "#") {
			t.Errorf("line %d: rule without a comment above it", i+1)
		}
	}
}

func TestRenderGrantsNothingOnSecretsNorWildcards(t *testing.T) {
	in := baseInput()
	in.Signer.BootstrapAuthorities = true
	objs, err := Render(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		var rules []rbacv1.PolicyRule
		switch v := o.(type) {
		case *rbacv1.ClusterRole:
			rules = v.Rules
		case *rbacv1.Role:
			rules = v.Rules
		}
		for _, r := range rules {
			for _, s := range slices.Concat(r.Resources, r.ResourceNames, r.Verbs, r.APIGroups) {
				if s == "secrets" || strings.Contains(s, "*") {
					t.Errorf("rule %v holds %q", r, s)
				}
			}
		}
	}
}

func TestRenderRefusesInvalidInput(t *testing.T) {
	cases := []struct {
		name string
		in   Input
	}{
		{"a wildcard signer name is refused", Input{Namespace: "keyward", Signer: &SignerInput{PCRSigners: []string{"keyward.dev/*"}}}},
		{"an empty namespace is refused", Input{Signer: &SignerInput{PCRSigners: []string{"keyward.dev/a"}}}},
		{"a signer without names is refused", Input{Namespace: "keyward", Signer: &SignerInput{}}},
		{"a token service without a signer name is refused", Input{Namespace: "keyward", TokenService: &TokenServiceInput{}}},
		{"an input with no component is refused (it would render nothing and look like success)", Input{Namespace: "keyward"}},
		{"an approver without names is refused (approve without resourceNames is approve on every name)", Input{Namespace: "keyward", Approver: &ApproverInput{}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Render(tc.in); !errors.Is(err, ErrInvalidInput) {
				t.Fatalf("Render: %v, want ErrInvalidInput", err)
			}
		})
	}
}

func TestCSRVerbsOnlyWithCSRNames(t *testing.T) {
	in := Input{Namespace: "keyward", Signer: &SignerInput{PCRSigners: []string{"keyward.dev/pod-identity"}}}
	y, err := RenderYAML(in)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(y, []byte("certificatesigningrequests")) {
		t.Errorf("a PCR-only signer got CSR rules:\n%s", y)
	}
}
