package config_test

import (
	"os"
	"testing"

	"github.com/keyward/keyward/internal/strictyaml"
	"github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
)

// FuzzConfigParse: Parse never panics; a configuration it accepts
// compiles into a policy, validates again, and survives a round trip
// through YAML unchanged (defaulting is idempotent, nothing is lost).
// Run it with -fuzzminimizetime 2s: minimizing a new input as big as the
// example file otherwise takes the whole default minute.
func FuzzConfigParse(f *testing.F) {
	example, err := os.ReadFile(exampleFile)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(example)
	f.Add([]byte(minimal))
	f.Add([]byte(minimal + "tokenLifetime: 1h\nkeyIdentifier: kid\nreviewCacheTTL: 0s\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := config.Parse(data)
		if err != nil {
			return
		}
		if _, err := policy.New(cfg); err != nil {
			t.Fatalf("accepted configuration does not compile: %v", err)
		}
		if errs := cfg.Validate(); len(errs) > 0 {
			t.Fatalf("accepted configuration does not validate again: %v", errs)
		}
		if err := strictyaml.RoundTrip(cfg, config.Parse); err != nil {
			t.Fatal(err)
		}
	})
}
