package main

import (
	"os"
	"strings"
	"testing"
)

const module = "example.com/m"

// A synthetic graph with one deliberately wrong import per rule kind fails
// with a message naming the rule, its file and the whole import chain.
func TestAWrongImportFailsNamingTheRuleAndTheChain(t *testing.T) {
	g := &Graph{Module: module, Packages: map[string]*Package{
		module + "/backends/file":     {ImportPath: module + "/backends/file", Dir: "backends/file", Imports: []string{module + "/internal/helper"}},
		module + "/internal/helper":   {ImportPath: module + "/internal/helper", Dir: "internal/helper", Imports: []string{"k8s.io/client-go/kubernetes"}},
		"k8s.io/client-go/kubernetes": {ImportPath: "k8s.io/client-go/kubernetes"},
		module + "/signer":            {ImportPath: module + "/signer", Dir: "signer", Imports: []string{module + "/testsupport/fake"}},
		module + "/testsupport/fake":  {ImportPath: module + "/testsupport/fake", Dir: "testsupport/fake"},
		module + "/demo":              {ImportPath: module + "/demo", Dir: "demo", Imports: []string{module + "/testsupport/fake"}},
	}}
	backends, err := ParseRules([]byte(`rules:
- name: backends-no-kubernetes
  why: backends know no Kubernetes
  forbid: ["k8s.io/..."]
  transitive: true
`), "backends")
	if err != nil {
		t.Fatal(err)
	}
	root, err := ParseRules([]byte(`rules:
- name: production-never-imports-testsupport
  why: testsupport is for tests
  forbid: ["testsupport/..."]
  except: ["testsupport/...", "demo"]
`), ".")
	if err != nil {
		t.Fatal(err)
	}
	got := Check(g, append(backends, root...))
	want := []string{
		"import rule backends-no-kubernetes (backends/importrules.yaml) broken: example.com/m/backends/file -> example.com/m/internal/helper -> k8s.io/client-go/kubernetes\n  why: backends know no Kubernetes",
		"import rule production-never-imports-testsupport (./importrules.yaml) broken: example.com/m/signer -> example.com/m/testsupport/fake\n  why: testsupport is for tests",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A rule that is not transitive looks at direct imports only.
func TestADirectRuleIgnoresIndirectImports(t *testing.T) {
	g := &Graph{Module: module, Packages: map[string]*Package{
		module + "/a": {ImportPath: module + "/a", Dir: "a", Imports: []string{module + "/b"}},
		module + "/b": {ImportPath: module + "/b", Dir: "b", Imports: []string{module + "/cmd/x"}},
	}}
	rules, err := ParseRules([]byte("rules:\n- {name: nothing-imports-cmd, why: w, forbid: [\"cmd/...\"]}\n"), ".")
	if err != nil {
		t.Fatal(err)
	}
	got := Check(g, rules)
	if len(got) != 1 || !strings.Contains(got[0], "example.com/m/b -> example.com/m/cmd/x") {
		t.Fatalf("got %q, want only b's direct import", got)
	}
}

// A rule file with an unknown field or without forbid patterns is refused.
func TestABadRuleFileIsRefused(t *testing.T) {
	for _, f := range []string{"rules:\n- {name: x, forbid: [a], forbids: [b]}\n", "rules:\n- {name: x}\n"} {
		if _, err := ParseRules([]byte(f), "."); err == nil {
			t.Errorf("%q accepted", f)
		}
	}
}

// keyward's own rules hold for keyward's own tree.
func TestKeywardsRulesHold(t *testing.T) {
	if err := os.Chdir("../.."); err != nil {
		t.Fatal(err)
	}
	g, err := loadGraph(".")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := loadRules(".", g.Module)
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) < 12 {
		t.Fatalf("found %d rules, want the rooms' rule files", len(rules))
	}
	for _, v := range Check(g, rules) {
		t.Error(v)
	}
}
