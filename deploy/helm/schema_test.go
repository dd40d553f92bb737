package helm

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A bad value fails `helm template` (and so `helm install`) with a message
// that names the field. Only the field's name is asserted, not helm's words.
func TestBadValuesFailNamingTheField(t *testing.T) {
	cases := []struct {
		name   string
		values string
		field  string
	}{
		{"a replica count given as text is refused", "signer: {replicas: two}", "/signer/replicas"},
		{"a misspelt key is refused", "signer: {replicaz: 2}", "replicaz"},
		{"an unknown top-level key is refused", "nodeagent: {enabled: false}", "nodeagent"},
		{"an unknown backend type is refused", "signer: {backend: {type: vault}}", "/signer/backend/type"},
		{"an unknown profile is refused", "signer: {signers: [{name: keyward.dev/x, profile: podidentity}]}", "/signer/signers/0/profile"},
		{"a signer name without a path is refused", "signer: {signers: [{name: keyward.dev, profile: podIdentity}]}", "/signer/signers/0/name"},
		{"a signer name with an upper-case domain is refused", "signer: {signers: [{name: Keyward.dev/x, profile: podIdentity}]}", "/signer/signers/0/name"},
		{"softhsm with two replicas is refused", "signer: {replicas: 2, backend: {type: softhsm}}", "/signer/replicas"},
		{"a negative replica count is refused", "approver: {replicas: -1}", "/approver/replicas"},
		{"zero token service replicas are refused", "tokenService: {replicas: 0}", "/tokenService/replicas"},
		{"an unknown key type is refused", "signer: {signers: [{name: keyward.dev/x, profile: podIdentity, allowedKeyTypes: [RSA2048]}]}", "/signer/signers/0/allowedKeyTypes/0"},
		{"a lifetime that is no duration is refused", "signer: {signers: [{name: keyward.dev/x, profile: podIdentity, maxLifetime: 1 day}]}", "/signer/signers/0/maxLifetime"},
		{"no signer names at all are refused", "signer: {signers: []}", "/signer/signers"},
		{"a token service without an issuer is refused", "tokenService: {enabled: true, config: {registries: [{service: r}], rules: [{namespaces: [a], repositories: [b]}]}}", "/tokenService/config/issuer"},
		{"a token service without registries is refused", "tokenService: {enabled: true, config: {issuer: i, rules: [{namespaces: [a], repositories: [b]}]}}", "/tokenService/config/registries"},
		{"an HSM library image without its module path is refused", "signer: {backend: {pkcs11Library: {image: registry.example.com/hsm:1}}}", "signer.backend.pkcs11Library.path"},
		{"a pull policy that is no policy is refused", "image: {pullPolicy: Sometimes}", "/image/pullPolicy"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := filepath.Join(t.TempDir(), "values.yaml")
			if err := os.WriteFile(f, []byte(tc.values+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := helmTemplate(t, f)
			if err == nil {
				t.Fatalf("helm template accepted %q", tc.values)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("the error does not name %s: %v", tc.field, err)
			}
		})
	}
}

// Every sample passes `helm lint --strict` (schema, templates, warnings).
func TestSamplesLint(t *testing.T) {
	for name, file := range samples(t) {
		t.Run(name, func(t *testing.T) {
			out, err := runHelm(t, "lint", "--strict", chartDir(t), "--namespace", namespace, "--kube-version", kubeVersion, "--values", file)
			if err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}
