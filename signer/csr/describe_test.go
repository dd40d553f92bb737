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

// A signer name with signers[].intermediate on says, in its chain
// property, that the chain carries the replica's in-memory intermediate.
func TestSignersDocNamesTheInMemoryIntermediate(t *testing.T) {
	cfg, err := config.Parse([]byte(`apiVersion: keyward.dev/v1alpha1
kind: SignerConfiguration
signers:
- name: keyward.dev/pods
  profile: podIdentity
  maxLifetime: 1h
  intermediate: {enabled: true}
- name: keyward.dev/daemons
  profile: csr
  maxLifetime: 1h
  intermediate: {enabled: true, validity: 3h}
  csr: {trustDistribution: x, keyUsages: [client auth]}
`))
	if err != nil {
		t.Fatal(err)
	}
	text := csr.DescribeSigners(cfg)
	if n := strings.Count(text, "in-memory intermediate (signers[].intermediate: pathLen 0, at most "); n != 2 {
		t.Errorf("%d chain properties name the in-memory intermediate, want 2:\n%s", n, text)
	}
	if !strings.Contains(text, "at most 7h0m0s, renewed 1h0m0s before its end") || !strings.Contains(text, "at most 3h0m0s") {
		t.Errorf("the intermediate's validity is not stated:\n%s", text)
	}
}
