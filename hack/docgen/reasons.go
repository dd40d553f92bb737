package docgen

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Reason is a reason string keyward writes, found in its source.
type Reason struct {
	Value string // e.g. "RateLimited"
	Where string // e.g. "signer/pcr: ReasonRateLimited"
}

// Reasons finds, in the non-test Go files under each dir (relative to the
// repository root), every string constant named Reason… or Event… whose
// value is a literal, and every literal logged as a "reason" key/value
// pair (…, "reason", "NotGranted", …). Constants defined as another
// constant (the rotation gates) are not included: docs/rotation.md has them.
func Reasons(root string, dirs ...string) ([]Reason, error) {
	fset := token.NewFileSet()
	var out []Reason
	for _, d := range dirs {
		err := filepath.WalkDir(filepath.Join(root, d), func(path string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return nil
			}
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return fmt.Errorf("parsing %s: %w", path, err)
			}
			rel, _ := filepath.Rel(root, filepath.Dir(path))
			ast.Inspect(f, func(n ast.Node) bool {
				switch x := n.(type) {
				case *ast.ValueSpec:
					for i, name := range x.Names {
						if i >= len(x.Values) || !(strings.HasPrefix(name.Name, "Reason") || strings.HasPrefix(name.Name, "Event")) {
							continue
						}
						if v, ok := stringLit(x.Values[i]); ok {
							out = append(out, Reason{Value: v, Where: rel + ": " + name.Name})
						}
					}
				case *ast.CallExpr:
					for i := 0; i+1 < len(x.Args); i++ {
						if k, ok := stringLit(x.Args[i]); ok && k == "reason" {
							if v, ok := stringLit(x.Args[i+1]); ok {
								out = append(out, Reason{Value: v, Where: rel + ": logged reason"})
							}
						}
					}
				}
				return true
			})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Value+out[i].Where < out[j].Value+out[j].Where })
	return out, nil
}

func stringLit(e ast.Expr) (string, bool) {
	bl, ok := e.(*ast.BasicLit)
	if !ok || bl.Kind != token.STRING {
		return "", false
	}
	v, err := strconv.Unquote(bl.Value)
	return v, err == nil
}

var headingRE = regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`)

// Anchors returns the GitHub anchor of each Markdown heading in doc, in
// order (lowercased, punctuation other than '-' and '_' dropped, spaces to
// '-'; a repeated anchor gets -1, -2, …).
func Anchors(doc string) []string {
	seen := map[string]int{}
	var out []string
	inFence := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
			continue
		}
		m := headingRE.FindStringSubmatch(line)
		if inFence || m == nil {
			continue
		}
		a := anchor(m[1])
		if n := seen[a]; n > 0 {
			seen[a] = n + 1
			a = fmt.Sprintf("%s-%d", a, n)
		} else {
			seen[a] = 1
		}
		out = append(out, a)
	}
	return out
}

func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}
