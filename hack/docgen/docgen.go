// Package docgen writes keyward's configuration reference
// (docs/configuration.md) from the Go types themselves: field names and
// types by reflection, descriptions from the doc comments in the source
// (go/parser), defaults from the types' own Default methods and from
// +kubebuilder:default markers. The reference therefore cannot drift from
// the code; a field without a doc comment is reported, not skipped.
//
// docgen is a generator, run by `make generate` and checked by `make lint`,
// so it lives in hack/ beside the other build-time programs: it reads the
// configuration types of signer, nodehelper and kubeclient (and its tests
// drive the KMS fakes of testsupport), so it sits above all of them, and
// production code never imports it.
package docgen

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
)

// Module is keyward's module path; only types under it are described field
// by field (others, such as metav1.Duration, are leaves).
const Module = "github.com/keyward/keyward"

// Root is one documented type: a configuration file or a CRD's spec.
type Root struct {
	// Title heads the section, e.g. "SignerConfiguration".
	Title string
	// Intro is the paragraph under the title (Markdown).
	Intro string
	// Prefix is put before every field path, e.g. "spec." for a CRD.
	Prefix string
	// Type is the Go struct type described.
	Type reflect.Type
	// Defaulted, if set, returns a value of Type on which the type's
	// Default method has run, built from a skeleton in which every nested
	// struct pointer is allocated and every list of structs has one item
	// (see Skeleton): its non-zero fields are the defaults.
	Defaulted func(skeleton any) any
}

// Field is one row of the reference.
type Field struct {
	Path    string // JSON path, lists as [], e.g. signers[].csr.keyUsages
	Type    string // the YAML type a user writes
	Default string // empty: none
	// Required: the JSON tag has no omitempty (or the field is marked
	// +required), and the field is not marked +optional.
	Required bool
	Doc      string // the doc comment, markers removed, one paragraph
	GoName   string // Package.Type.Field, for error messages
}

// Generator reads doc comments from the module's source tree.
type Generator struct {
	root string // repository root
	fset *token.FileSet
	docs map[string]map[string]fieldDoc // package import path -> "Type.Field" -> doc
}

type fieldDoc struct {
	text     string
	defaults string // +kubebuilder:default= value
	optional bool   // +optional
	required bool   // +required
}

// New returns a Generator reading sources under the repository root dir.
func New(root string) *Generator {
	return &Generator{root: root, fset: token.NewFileSet(), docs: map[string]map[string]fieldDoc{}}
}

// Fields lists every field reachable from r.Type, depth first in
// declaration order.
func (g *Generator) Fields(r Root) ([]Field, error) {
	var defaults reflect.Value
	if r.Defaulted != nil {
		sk := Skeleton(r.Type)
		defaults = reflect.ValueOf(r.Defaulted(sk.Interface()))
		if defaults.Kind() == reflect.Pointer {
			defaults = defaults.Elem()
		}
	}
	var out []Field
	if err := g.walk(r.Type, strings.TrimSuffix(r.Prefix, "."), defaults, &out, map[reflect.Type]bool{}); err != nil {
		return nil, err
	}
	return out, nil
}

func (g *Generator) walk(t reflect.Type, prefix string, def reflect.Value, out *[]Field, seen map[reflect.Type]bool) error {
	if seen[t] {
		return nil
	}
	seen[t] = true
	defer delete(seen, t)
	docs, err := g.packageDocs(t.PkgPath())
	if err != nil {
		return err
	}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(sf.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		var fdef reflect.Value
		if def.IsValid() {
			fdef = def.Field(i)
		}
		if sf.Anonymous && strings.Contains(opts, "inline") {
			if err := g.walk(sf.Type, prefix, fdef, out, seen); err != nil {
				return err
			}
			continue
		}
		if name == "" {
			name = sf.Name
		}
		path := name
		if prefix != "" {
			path = prefix + "." + name
		}
		fd := docs[t.Name()+"."+sf.Name]
		f := Field{
			Path:   path,
			Type:   yamlType(sf.Type),
			Doc:    fd.text,
			GoName: fmt.Sprintf("%s.%s.%s", filepath.Base(t.PkgPath()), t.Name(), sf.Name),
		}
		f.Required = fd.required || !fd.optional && !strings.Contains(opts, "omitempty")
		f.Default = fd.defaults
		if f.Default == "" && fdef.IsValid() {
			f.Default = defaultOf(fdef)
			if sf.Name == "Mode" && f.Default != "" { // file modes read in octal
				f.Default = fmt.Sprintf("0%o", deref(fdef).Int())
			}
		}
		*out = append(*out, f)
		inner, list := describedStruct(sf.Type)
		if inner == nil {
			continue
		}
		sub := path
		var subDef reflect.Value
		if fdef.IsValid() {
			subDef = deref(fdef)
		}
		if list {
			sub += "[]"
			if subDef.IsValid() && subDef.Len() > 0 {
				subDef = deref(subDef.Index(0))
			} else {
				subDef = reflect.Value{}
			}
		}
		if err := g.walk(inner, sub, subDef, out, seen); err != nil {
			return err
		}
	}
	return nil
}

// describedStruct returns the struct type a field's type leads to when the
// struct is one of the module's own (described field by field), and
// whether the field is a list of it.
func describedStruct(t reflect.Type) (reflect.Type, bool) {
	list := false
	if t.Kind() == reflect.Slice {
		list = true
		t = t.Elem()
	}
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || !strings.HasPrefix(t.PkgPath(), Module) {
		return nil, false
	}
	return t, list
}

func deref(v reflect.Value) reflect.Value {
	for v.IsValid() && v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return reflect.Value{}
		}
		v = v.Elem()
	}
	return v
}

// Skeleton returns a new *t in which every pointer to one of the module's
// structs is allocated and every list of them holds one zero item, so that
// a Default method reaches every nested default.
func Skeleton(t reflect.Type) reflect.Value {
	v := reflect.New(t)
	fill(v.Elem())
	return v
}

func fill(v reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		if !t.Field(i).IsExported() {
			continue
		}
		f := v.Field(i)
		inner, list := describedStruct(f.Type())
		if inner == nil {
			continue
		}
		switch {
		case list:
			s := reflect.MakeSlice(f.Type(), 1, 1)
			if e := s.Index(0); e.Kind() == reflect.Pointer {
				e.Set(reflect.New(inner))
				fill(e.Elem())
			} else {
				fill(e)
			}
			f.Set(s)
		case f.Kind() == reflect.Pointer:
			f.Set(reflect.New(inner))
			fill(f.Elem())
		default:
			fill(f)
		}
	}
}

// defaultOf renders a defaulted leaf value; structs of the module are
// described by their own fields and have none.
func defaultOf(v reflect.Value) string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return ""
		}
		v = v.Elem()
	}
	if inner, _ := describedStruct(v.Type()); inner != nil {
		return ""
	}
	if v.IsZero() {
		return ""
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	if d, ok := durationOf(v); ok {
		return d
	}
	switch v.Kind() {
	case reflect.Slice:
		items := make([]string, v.Len())
		for i := range items {
			items[i] = fmt.Sprint(v.Index(i).Interface())
		}
		return "[" + strings.Join(items, ", ") + "]"
	}
	return fmt.Sprint(v.Interface())
}

// durationOf reads a metav1.Duration-like struct (one Duration field).
func durationOf(v reflect.Value) (string, bool) {
	if v.Kind() != reflect.Struct {
		return "", false
	}
	f := v.FieldByName("Duration")
	if !f.IsValid() {
		return "", false
	}
	s, ok := f.Interface().(fmt.Stringer)
	if !ok {
		return "", false
	}
	return s.String(), true
}

// yamlType names the type a user writes in YAML.
func yamlType(t reflect.Type) string {
	switch t.String() {
	case "v1.Duration":
		return "duration"
	case "v1.Time":
		return "timestamp"
	case "v1.LabelSelector":
		return "label selector"
	case "v1.Condition":
		return "condition"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return yamlType(t.Elem())
	case reflect.Slice:
		return "list of " + yamlType(t.Elem())
	case reflect.Map:
		return "map of " + yamlType(t.Key()) + " to " + yamlType(t.Elem())
	case reflect.String:
		return "string"
	case reflect.Bool:
		return "boolean"
	case reflect.Int, reflect.Int32, reflect.Int64:
		return "integer"
	case reflect.Float32, reflect.Float64:
		return "number"
	case reflect.Struct:
		return "object"
	}
	return t.String()
}

// packageDocs parses the package at import path p (under Module) once and
// indexes each struct field's doc comment.
func (g *Generator) packageDocs(p string) (map[string]fieldDoc, error) {
	if d, ok := g.docs[p]; ok {
		return d, nil
	}
	d := map[string]fieldDoc{}
	g.docs[p] = d
	if !strings.HasPrefix(p, Module) {
		return d, nil
	}
	dir := filepath.Join(g.root, strings.TrimPrefix(strings.TrimPrefix(p, Module), "/"))
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("reading the source of %s: %w", p, err)
	}
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		file, err := parser.ParseFile(g.fset, filepath.Join(dir, e.Name()), nil, parser.ParseComments)
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %w", e.Name(), err)
		}
		{
			ast.Inspect(file, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return true
				}
				for _, f := range st.Fields.List {
					fd := parseDoc(f.Doc, f.Comment)
					for _, n := range f.Names {
						d[ts.Name.Name+"."+n.Name] = fd
					}
					if len(f.Names) == 0 { // embedded
						d[ts.Name.Name+"."+embeddedName(f.Type)] = fd
					}
				}
				return true
			})
		}
	}
	return d, nil
}

func embeddedName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// parseDoc joins a field's doc and line comments into one paragraph,
// dropping +marker lines but keeping a +kubebuilder:default value.
func parseDoc(groups ...*ast.CommentGroup) fieldDoc {
	var fd fieldDoc
	var words []string
	for _, cg := range groups {
		if cg == nil {
			continue
		}
		for _, line := range strings.Split(cg.Text(), "\n") {
			line = strings.TrimSpace(line)
			if strings.HasPrefix(line, "+") {
				if v, ok := strings.CutPrefix(line, "+kubebuilder:default="); ok {
					fd.defaults = strings.Trim(v, `"`)
				}
				fd.optional = fd.optional || line == "+optional"
				fd.required = fd.required || line == "+required"
				continue
			}
			if line != "" {
				words = append(words, line)
			}
		}
	}
	fd.text = strings.Join(words, " ")
	return fd
}

// Undocumented lists the fields of roots that have no doc comment.
func (g *Generator) Undocumented(roots []Root) ([]string, error) {
	var missing []string
	for _, r := range roots {
		fields, err := g.Fields(r)
		if err != nil {
			return nil, err
		}
		for _, f := range fields {
			if f.Doc == "" {
				missing = append(missing, f.GoName+" ("+r.Title+" "+f.Path+")")
			}
		}
	}
	sort.Strings(missing)
	return missing, nil
}

// Render writes the whole reference as Markdown.
func (g *Generator) Render(header string, roots []Root) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header)
	for _, r := range roots {
		fields, err := g.Fields(r)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(&b, "\n## %s\n\n%s\n\n", r.Title, strings.TrimSpace(r.Intro))
		b.WriteString("| Field | Type | Required | Default | Description |\n|---|---|---|---|---|\n")
		for _, f := range fields {
			def := ""
			if f.Default != "" {
				def = "`" + cell(f.Default) + "`"
			}
			req := ""
			if f.Required {
				req = "yes"
			}
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s | %s |\n", f.Path, f.Type, req, def, cell(f.Doc))
		}
	}
	return b.Bytes(), nil
}

func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}
