package helm

import (
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// README.md's values table names every value of values.yaml (a row for a
// value, or for a map above it such as signer.config), so the table cannot
// fall behind the chart.
func TestReadmeNamesEveryValue(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := readmeValues(string(readme))
	if len(documented) == 0 {
		t.Fatal("README.md has no values table")
	}
	var missing []string
	for _, leaf := range leaves("", values) {
		if !coveredBy(leaf, documented) {
			missing = append(missing, leaf)
		}
	}
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("README.md's values table lacks %s", strings.Join(missing, ", "))
	}
}

// leaves lists the dotted paths of values' non-map entries (and empty maps).
func leaves(prefix string, v any) []string {
	m, ok := v.(map[string]any)
	if !ok || len(m) == 0 {
		return []string{prefix}
	}
	var out []string
	for k, sub := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		out = append(out, leaves(p, sub)...)
	}
	return out
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// readmeValues reads the first cell of each table row: `a.b`, `.c` names
// a.b and a.c.
func readmeValues(readme string) map[string]bool {
	out := map[string]bool{}
	for _, line := range strings.Split(readme, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 {
			continue
		}
		parent := ""
		for _, m := range codeSpan.FindAllStringSubmatch(cells[1], -1) {
			name := m[1]
			if strings.HasPrefix(name, ".") && parent != "" {
				name = parent + name
			} else if i := strings.LastIndex(name, "."); i > 0 {
				parent = name[:i]
			}
			out[name] = true
		}
	}
	return out
}

func coveredBy(leaf string, documented map[string]bool) bool {
	for p := leaf; p != ""; {
		if documented[p] {
			return true
		}
		i := strings.LastIndex(p, ".")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return false
}
