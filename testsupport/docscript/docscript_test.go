package docscript

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadsTheBlocks(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "q.md")
	if err := os.WriteFile(doc, []byte("# Q\n\n<!-- quickstart test: not run (a reason) -->\n```sh\nkind create\n```\n\n```sh\nkubectl a\nkubectl b\n```\n\n<!-- quickstart test: helm way only -->\n```sh\nhelm install\n```\n\n<!-- quickstart test: kustomize way only -->\n```sh\nkubectl apply -k\n```\n\n```yaml\n# pod.yaml\nkind: Pod\n```\n\n```yaml\nkind: Other\n```\n\n## Later\n\n```sh\nopenssl x\n```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script, files, err := Quickstart(doc, "helm")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script, "kind create") {
		t.Errorf("the block marked not run is in the script:\n%s", script)
	}
	if !strings.Contains(script, "helm install") || strings.Contains(script, "apply -k") {
		t.Errorf("the helm way's script:\n%s", script)
	}
	if k, _, err := Quickstart(doc, "kustomize"); err != nil || strings.Contains(k, "helm install") || !strings.Contains(k, "apply -k") {
		t.Errorf("the kustomize way's script (%v):\n%s", err, k)
	}
	if _, _, err := Quickstart(doc, "kubectl"); err == nil {
		t.Error("a way no block is marked for was accepted")
	}
	if from, _, err := Read(doc, "", "## Later"); err != nil || strings.Contains(from, "kubectl a") || !strings.Contains(from, "openssl x") {
		t.Errorf("the script from a later line (%v):\n%s", err, from)
	}
	for _, want := range []string{"kubectl a\nkubectl b\n", "openssl x\n"} {
		if !strings.Contains(script, want) {
			t.Errorf("the script lacks %q:\n%s", want, script)
		}
	}
	if len(files) != 1 || files["pod.yaml"] != "# pod.yaml\nkind: Pod\n" {
		t.Errorf("files = %q, want pod.yaml only", files)
	}
	// The guides node-tests/install follows, from where it starts them.
	for _, g := range []struct{ doc, from string }{
		{"production/pkcs11-hsm.md", ""}, {"production/ca-admin.md", ""},
		{"production/softhsm.md", "## Backup and restore"}, {"quickstart.md", "## 5."},
	} {
		if _, _, err := Read(filepath.Join("..", "..", "docs", g.doc), "", g.from); err != nil {
			t.Errorf("docs/%s: %v", g.doc, err)
		}
	}
	for _, way := range []string{"helm", "kustomize"} {
		if _, _, err := Quickstart(filepath.Join("..", "..", "docs", "quickstart.md"), way); err != nil {
			t.Errorf("docs/quickstart.md: %v", err)
		}
	}
}
