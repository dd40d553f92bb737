package config_test

import (
	"os"
	"testing"

	"github.com/keyward/keyward/internal/strictyaml"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
	"github.com/keyward/keyward/signer/profile"
)

// FuzzSignerConfigParse: Parse (what `keyward signer --config` loads)
// never panics; a configuration it accepts validates again, each signer
// name builds its profile (PodCertificateRequests) or CSR policy, and the
// configuration survives a round trip through YAML unchanged (defaulting
// is idempotent, nothing is lost or reinterpreted).
// make fuzz runs it with -fuzzminimizetime 2s: minimizing an input as big
// as the example file otherwise takes the whole default minute.
func FuzzSignerConfigParse(f *testing.F) {
	full, err := os.ReadFile("testdata/full.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(full)
	f.Add([]byte(csrBase))
	f.Add([]byte("apiVersion: keyward.dev/v1alpha1\nkind: SignerConfiguration\nsigners:\n- name: keyward.dev/pod-identity\n  profile: podIdentity\n"))
	f.Add([]byte(csrBase + "  approval:\n    allowedDNSSuffixes: [nodes.example.com]\n    allowedIPRanges: [10.0.0.0/8, fd00::/8]\n"))
	f.Add([]byte("apiVersion: keyward.dev/v1alpha1\nkind: SignerConfiguration\nsigners:\n- name: keyward.dev/s\n  profile: server\n  ca: {}\n"))
	f.Add([]byte("apiVersion: keyward.dev/v1alpha1\nkind: SignerConfiguration\n---\nworkers: 2\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("an empty error")
			}
			return
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("accepted configuration does not validate again: %v", errs)
		}
		for _, s := range cfg.Signers {
			if config.IsCSRProfile(s.Profile) {
				if _, err := csr.NewPolicy(s); err != nil {
					t.Fatalf("accepted signer %s has no CSR policy: %v", s.Name, err)
				}
			} else if _, err := profile.New(s); err != nil {
				t.Fatalf("accepted signer %s has no profile: %v", s.Name, err)
			}
		}
		if err := strictyaml.RoundTrip(cfg, config.Parse); err != nil {
			t.Fatal(err)
		}
	})
}
