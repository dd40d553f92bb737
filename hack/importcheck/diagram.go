package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// DiagramFile is the page whose mermaid diagram draws the rooms.
const DiagramFile = "docs/architecture.md"

// undrawn rooms: internal/ (leaf helpers every room may use), hack/
// (build-time generators and checks) and softhsm-tests/ (tests only).
var undrawn = []string{"internal", "hack", "softhsm-tests"}

// RoomEdges are the imports between top-level rooms of the module's
// non-test files, as "from --> to", leaving out the undrawn rooms.
func RoomEdges(g *Graph) []string {
	room := func(p *Package) string {
		if p.Dir == "" {
			return ""
		}
		return strings.SplitN(p.Dir, "/", 2)[0]
	}
	set := map[string]bool{}
	for _, p := range g.Packages {
		from := room(p)
		if from == "" || slices.Contains(undrawn, from) {
			continue
		}
		for _, imp := range p.Imports {
			q := g.Packages[imp]
			if q == nil {
				continue
			}
			to := room(q)
			if to == "" || to == from || slices.Contains(undrawn, to) {
				continue
			}
			set[from+" --> "+to] = true
		}
	}
	var out []string
	for e := range set {
		out = append(out, e)
	}
	slices.Sort(out)
	return out
}

var edgeLine = regexp.MustCompile(`^\s*([A-Za-z0-9_-]+)\s*-->\s*([A-Za-z0-9_-]+)\s*$`)

// DrawnEdges are the "a --> b" lines of the first mermaid block of doc.
func DrawnEdges(doc []byte) ([]string, error) {
	s := string(doc)
	start := strings.Index(s, "```mermaid\n")
	if start < 0 {
		return nil, fmt.Errorf("%s has no ```mermaid block", DiagramFile)
	}
	body := s[start+len("```mermaid\n"):]
	end := strings.Index(body, "```")
	if end < 0 {
		return nil, fmt.Errorf("%s: the mermaid block does not end", DiagramFile)
	}
	var out []string
	for _, line := range strings.Split(body[:end], "\n") {
		if m := edgeLine.FindStringSubmatch(line); m != nil {
			out = append(out, m[1]+" --> "+m[2])
		}
	}
	slices.Sort(out)
	return out, nil
}

// CheckDiagram names every import between rooms the diagram lacks, and
// every arrow it draws that no import makes.
func CheckDiagram(code, drawn []string) []string {
	var out []string
	for _, e := range code {
		if !slices.Contains(drawn, e) {
			out = append(out, fmt.Sprintf("%s: the diagram lacks %s, which the code imports (draw it, or remove the import)", DiagramFile, e))
		}
	}
	for _, e := range drawn {
		if !slices.Contains(code, e) {
			out = append(out, fmt.Sprintf("%s: the diagram draws %s, which no non-test file imports (remove the arrow)", DiagramFile, e))
		}
	}
	return out
}
