package main

import (
	"slices"
	"strings"
	"testing"
)

// The drawing is checked both ways: an import between rooms the diagram
// lacks, and an arrow no import makes, each fail naming the edge.
func TestDiagramDifferencesAreNamed(t *testing.T) {
	doc := []byte("# x\n\n```mermaid\ngraph TD\n  signer --> kubeclient\n  signer --> trustpublisher\n```\n")
	drawn, err := DrawnEdges(doc)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(drawn, []string{"signer --> kubeclient", "signer --> trustpublisher"}) {
		t.Fatalf("drawn = %v", drawn)
	}
	g := &Graph{Module: "m", Packages: map[string]*Package{
		"m/signer":           {ImportPath: "m/signer", Dir: "signer", Imports: []string{"m/kubeclient", "m/ca", "m/internal/pemcert"}},
		"m/kubeclient":       {ImportPath: "m/kubeclient", Dir: "kubeclient"},
		"m/ca":               {ImportPath: "m/ca", Dir: "ca"},
		"m/internal/pemcert": {ImportPath: "m/internal/pemcert", Dir: "internal/pemcert"},
	}}
	code := RoomEdges(g)
	if !slices.Equal(code, []string{"signer --> ca", "signer --> kubeclient"}) {
		t.Fatalf("room edges = %v (internal/ is not drawn)", code)
	}
	v := strings.Join(CheckDiagram(code, drawn), "\n")
	for _, want := range []string{"lacks signer --> ca", "draws signer --> trustpublisher"} {
		if !strings.Contains(v, want) {
			t.Errorf("violations %q do not say %q", v, want)
		}
	}
	if _, err := DrawnEdges([]byte("no diagram")); err == nil {
		t.Error("a page without a mermaid block is not refused")
	}
}
