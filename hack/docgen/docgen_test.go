package docgen

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/keyward/keyward/hack/docgen/sampletypes"
)

var update = flag.Bool("update", false, "rewrite docs/configuration.md from the Go types")

const repoRoot = "../.."

func TestConfigurationDocIsCurrent(t *testing.T) {
	got, err := New(repoRoot).Render(Header, Roots())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(repoRoot, "docs", "configuration.md")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/configuration.md is stale: run make generate")
	}
}

func TestEveryConfigurationFieldHasADoc(t *testing.T) {
	missing, err := New(repoRoot).Undocumented(Roots())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range missing {
		t.Errorf("field without a doc comment: %s", m)
	}
}

func TestFieldsWalksNestedTypesWithDocsAndDefaults(t *testing.T) {
	root := Root{
		Title: "sample",
		Type:  reflect.TypeFor[sampletypes.Sample](),
		Defaulted: func(sk any) any {
			s := sk.(*sampletypes.Sample)
			m := int32(0o640)
			s.Inner.Mode = &m
			s.Items[0].Mode = &m
			s.Name = "x"
			return s
		},
	}
	fields, err := New(repoRoot).Fields(root)
	if err != nil {
		t.Fatal(err)
	}
	want := []Field{
		{Path: "name", Type: "string", Required: true, Default: "x", Doc: "Name is documented.", GoName: "sampletypes.Sample.Name"},
		{Path: "bare", Type: "integer", GoName: "sampletypes.Sample.Bare"},
		{Path: "inner", Type: "object", Doc: "Inner is a nested struct.", GoName: "sampletypes.Sample.Inner"},
		{Path: "inner.mode", Type: "integer", Default: "0640", Doc: "file mode", GoName: "sampletypes.Inner.Mode"},
		{Path: "inner.wait", Type: "string", Default: "5m0s", Doc: "Wait is a marker default.", GoName: "sampletypes.Inner.Wait"},
		{Path: "items", Type: "list of object", Doc: "Items are listed.", GoName: "sampletypes.Sample.Items"},
		{Path: "items[].mode", Type: "integer", Default: "0640", Doc: "file mode", GoName: "sampletypes.Inner.Mode"},
		{Path: "items[].wait", Type: "string", Default: "5m0s", Doc: "Wait is a marker default.", GoName: "sampletypes.Inner.Wait"},
	}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields:\n got %+v\nwant %+v", fields, want)
	}
}
