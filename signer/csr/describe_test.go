package csr_test

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
)

var update = flag.Bool("update", false, "rewrite docs/signers.md from docs/signers-config.yaml")

const (
	docConfig = "../../docs/signers-config.yaml"
	doc       = "../../docs/signers.md"
)

// docs/signers.md is what DescribeSigners says for the example
// configuration; refresh it with make generate.
func TestSignersDocMatchesTheExampleConfig(t *testing.T) {
	cfg, err := config.Load(docConfig)
	if err != nil {
		t.Fatal(err)
	}
	want := csr.DescribeSigners(cfg)
	if *update {
		if err := os.WriteFile(doc, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s differs from what DescribeSigners makes of %s; run make generate", doc, docConfig)
	}
}

// Every signer name the shipped deployment serves is documented.
func TestSignersDocCoversTheShippedDeployment(t *testing.T) {
	shipped, err := config.Load("../../deploy/kustomize/base/signer-config.yaml")
	if err != nil {
		t.Fatalf("deploy/kustomize/base/signer-config.yaml: %v", err)
	}
	cfg, err := config.Load(docConfig)
	if err != nil {
		t.Fatal(err)
	}
	text := csr.DescribeSigners(cfg)
	for _, s := range shipped.Signers {
		if !strings.Contains(text, "## `"+s.Name+"`") {
			t.Errorf("signer name %s of deploy/kustomize/base/signer-config.yaml is not in %s", s.Name, docConfig)
		}
	}
	// Each name has all seven properties.
	if n, want := strings.Count(text, "| CA bit allowed / disallowed |"), len(cfg.Signers); n != want {
		t.Errorf("%d signer names with the CA bit property, want %d", n, want)
	}
}
