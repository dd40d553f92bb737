// Command importcheck enforces keyward's import rules, the way Kubernetes'
// import-boss enforces .import-restrictions files: each room keeps its rules
// in an importrules.yaml beside its code, so that a newcomer reads them next
// to the package. `make lint` runs it from the module root.
//
// A rule file holds a list of rules; each applies to every package in the
// file's directory and below:
//
//	rules:
//	- name: backends-no-kubernetes        # printed on a violation
//	  why: the key contract and the backends know nothing about Kubernetes
//	  forbid: ["k8s.io/...", "sigs.k8s.io/..."]
//	  except: []                          # packages the rule does not apply to
//	  transitive: true                    # also through other packages
//
// A pattern whose first element has no dot is relative to the module
// ("signer/..." is github.com/keyward/keyward/signer and below; "..." alone
// is the whole module); "x/..." matches x and everything below it. Only the
// packages' non-test files count: tests may reach anything. A violation
// prints the rule's name, why, and the import chain, and exits 1.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// RuleFile is the name of a room's rule file.
const RuleFile = "importrules.yaml"

// Rule forbids imports for the packages under Dir.
type Rule struct {
	Name       string   `json:"name"`
	Why        string   `json:"why"`
	Forbid     []string `json:"forbid"`
	Except     []string `json:"except,omitempty"`
	Transitive bool     `json:"transitive,omitempty"`
	// Dir is the module-relative directory of the rule file ("" at the root).
	Dir string `json:"-"`
}

// Package is one node of the import graph.
type Package struct {
	ImportPath string
	// Dir is module-relative for the module's packages, "" for others.
	Dir     string
	Imports []string
}

// Graph is the module's packages and everything they import.
type Graph struct {
	Module   string
	Packages map[string]*Package
}

func main() {
	v, summary, err := run()
	if err != nil {
		fmt.Fprintln(os.Stderr, "importcheck:", err)
		os.Exit(2)
	}
	if len(v) > 0 {
		for _, x := range v {
			fmt.Fprintln(os.Stderr, x)
		}
		fmt.Fprintf(os.Stderr, "importcheck: %d violation(s); the rules are in the %s files, the drawing in %s\n", len(v), RuleFile, DiagramFile)
		os.Exit(1)
	}
	fmt.Println(summary)
}

// run checks the rules and the diagram from the module root.
func run() (violations []string, summary string, err error) {
	graph, err := loadGraph(".")
	if err != nil {
		return nil, "", err
	}
	rules, err := loadRules(".", graph.Module)
	if err != nil {
		return nil, "", err
	}
	doc, err := os.ReadFile(DiagramFile)
	if err != nil {
		return nil, "", err
	}
	drawn, err := DrawnEdges(doc)
	if err != nil {
		return nil, "", err
	}
	v := append(Check(graph, rules), CheckDiagram(RoomEdges(graph), drawn)...)
	return v, fmt.Sprintf("importcheck: %d rules hold for %d packages, and %s draws the rooms as they are", len(rules), countModule(graph), DiagramFile), nil
}

func countModule(g *Graph) int {
	n := 0
	for _, p := range g.Packages {
		if p.Dir != "" || p.ImportPath == g.Module {
			n++
		}
	}
	return n
}

// loadGraph runs `go list -deps -json ./...` in root.
func loadGraph(root string) (*Graph, error) {
	mod, err := exec.Command("go", "list", "-m").Output()
	if err != nil {
		return nil, fmt.Errorf("go list -m: %w", err)
	}
	cmd := exec.Command("go", "list", "-deps", "-json=ImportPath,Dir,Imports,Module", "./...")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list -deps: %w\n%s", err, stderr.String())
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, err
	}
	g := &Graph{Module: strings.TrimSpace(string(mod)), Packages: map[string]*Package{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p struct {
			ImportPath, Dir string
			Imports         []string
			Module          *struct{ Path string }
		}
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("reading go list: %w", err)
		}
		n := &Package{ImportPath: p.ImportPath, Imports: p.Imports}
		if p.Module != nil && p.Module.Path == g.Module {
			if rel, err := filepath.Rel(abs, p.Dir); err == nil {
				n.Dir = filepath.ToSlash(rel)
			}
		}
		g.Packages[p.ImportPath] = n
	}
	return g, nil
}

// loadRules reads every importrules.yaml under root.
func loadRules(root, module string) ([]Rule, error) {
	var rules []Rule
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != RuleFile {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(root, filepath.Dir(path))
		rs, err := ParseRules(b, filepath.ToSlash(dir))
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		rules = append(rules, rs...)
		return nil
	})
	return rules, err
}

// ParseRules reads one rule file found in the module-relative dir.
func ParseRules(b []byte, dir string) ([]Rule, error) {
	var f struct {
		Rules []Rule `json:"rules"`
	}
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		return nil, err
	}
	if dir == "." {
		dir = ""
	}
	for i := range f.Rules {
		r := &f.Rules[i]
		if r.Name == "" || len(r.Forbid) == 0 {
			return nil, fmt.Errorf("rule %d: a rule needs a name and at least one forbid pattern", i)
		}
		r.Dir = dir
	}
	return f.Rules, nil
}

// match reports whether importPath matches pattern (module-relative when
// its first element has no dot).
func match(module, pattern, importPath string) bool {
	first, _, _ := strings.Cut(pattern, "/")
	if pattern == "..." {
		pattern = module + "/..."
	} else if !strings.Contains(first, ".") {
		pattern = module + "/" + pattern
	}
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		return importPath == base || strings.HasPrefix(importPath, base+"/")
	}
	return importPath == pattern
}

func matchAny(module string, patterns []string, importPath string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return match(module, p, importPath) })
}

// applies reports whether r covers the package in module-relative dir.
func (r Rule) applies(dir string) bool {
	return r.Dir == "" || dir == r.Dir || strings.HasPrefix(dir, r.Dir+"/")
}

// Check returns one message per package and rule it breaks.
func Check(g *Graph, rules []Rule) []string {
	var out []string
	paths := make([]string, 0, len(g.Packages))
	for p := range g.Packages {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, path := range paths {
		p := g.Packages[path]
		if p.Dir == "" && path != g.Module {
			continue // not the module's
		}
		for _, r := range rules {
			if !r.applies(p.Dir) || matchAny(g.Module, r.Except, path) {
				continue
			}
			if chain := r.find(g, p); chain != nil {
				out = append(out, fmt.Sprintf("import rule %s (%s/%s) broken: %s\n  why: %s",
					r.Name, orDot(r.Dir), RuleFile, strings.Join(chain, " -> "), r.Why))
			}
		}
	}
	return out
}

func orDot(s string) string {
	if s == "" {
		return "."
	}
	return s
}

// find returns the shortest import chain from p to a package r forbids, or
// nil: direct imports only unless r is transitive.
func (r Rule) find(g *Graph, p *Package) []string {
	type item struct {
		path  string
		chain []string
	}
	seen := map[string]bool{p.ImportPath: true}
	queue := []item{{p.ImportPath, []string{p.ImportPath}}}
	for len(queue) > 0 {
		it := queue[0]
		queue = queue[1:]
		n := g.Packages[it.path]
		if n == nil {
			continue
		}
		for _, imp := range n.Imports {
			if seen[imp] {
				continue
			}
			seen[imp] = true
			chain := append(slices.Clone(it.chain), imp)
			if matchAny(g.Module, r.Forbid, imp) {
				return chain
			}
			if r.Transitive {
				queue = append(queue, item{imp, chain})
			}
		}
	}
	return nil
}
