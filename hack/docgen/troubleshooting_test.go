package docgen

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

func readDoc(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestTroubleshootingHasEveryReason: alerts and users link to
// docs/troubleshooting.md#<reason lowercased>, so each reason keyward
// writes must have its heading.
func TestTroubleshootingHasEveryReason(t *testing.T) {
	reasons, err := Reasons(repoRoot, "signer", "trustpublisher")
	if err != nil {
		t.Fatal(err)
	}
	if len(reasons) < 30 {
		t.Fatalf("found only %d reasons in the source: the parser misses them", len(reasons))
	}
	anchors := Anchors(readDoc(t, "troubleshooting.md"))
	for _, r := range reasons {
		if !slices.Contains(anchors, anchor(r.Value)) {
			t.Errorf("docs/troubleshooting.md has no heading %q (%s)", "### "+r.Value, r.Where)
		}
	}
}

var localLinkRE = regexp.MustCompile(`\]\(#([^)]+)\)`)

func TestTroubleshootingLinksResolve(t *testing.T) {
	doc := readDoc(t, "troubleshooting.md")
	anchors := Anchors(doc)
	for _, m := range localLinkRE.FindAllStringSubmatch(doc, -1) {
		if !slices.Contains(anchors, m[1]) {
			t.Errorf("link to #%s: no such heading", m[1])
		}
	}
}

func TestReasonsFindsConstantsAndLoggedReasons(t *testing.T) {
	reasons, err := Reasons(repoRoot, "signer/tokenservice", "signer/pcr")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"PodGone", "NotGranted", "PermissionMissing", "InvalidProofOfPossession"} {
		if !slices.ContainsFunc(reasons, func(r Reason) bool { return r.Value == want }) {
			t.Errorf("Reasons did not find %q", want)
		}
	}
}

func TestAnchorsFollowGitHub(t *testing.T) {
	got := Anchors("# A b\n```\n# not a heading\n```\n## Missing sign or attest grant\n### A b\n#### Authority conditions (trust publisher)\n")
	want := []string{"a-b", "missing-sign-or-attest-grant", "a-b-1", "authority-conditions-trust-publisher"}
	if !slices.Equal(got, want) {
		t.Errorf("Anchors = %v, want %v", got, want)
	}
}

// The docs this package owns link to files and headings that exist.
var mdLinkRE = regexp.MustCompile(`\]\(([^)\s]+)\)`)

func TestOwnDocsLinksResolve(t *testing.T) {
	own := []string{"README.md", "quickstart.md", "troubleshooting.md", "production/softhsm.md",
		"production/pkcs11-hsm.md", "production/gcp-kms.md", "production/aws-kms.md"}
	for _, name := range own {
		doc := readDoc(t, name)
		for _, m := range mdLinkRE.FindAllStringSubmatch(doc, -1) {
			target := m[1]
			if strings.Contains(target, "://") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := filepath.Join(repoRoot, "docs", filepath.Dir(name), file)
			if file == "" {
				path = filepath.Join(repoRoot, "docs", name)
			}
			body, err := os.ReadFile(path)
			if err != nil {
				t.Errorf("docs/%s links to %s: %v", name, target, err)
				continue
			}
			if frag != "" && !slices.Contains(Anchors(string(body)), frag) {
				t.Errorf("docs/%s links to %s: no heading #%s there", name, target, frag)
			}
		}
	}
}

// Every alert of the monitoring rules has its heading: runbook_url is
// docs/troubleshooting.md#<alert in lower case>.
func TestTroubleshootingHasEveryAlert(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "observability", "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	alerts := regexp.MustCompile(`(?m)^\s*-?\s*alert:\s*(\S+)\s*$`).FindAllStringSubmatch(string(data), -1)
	if len(alerts) == 0 {
		t.Fatal("no alerts found in deploy/observability/rules.yaml")
	}
	anchors := Anchors(readDoc(t, "troubleshooting.md"))
	for _, a := range alerts {
		if !slices.Contains(anchors, strings.ToLower(a[1])) {
			t.Errorf("docs/troubleshooting.md has no heading %q", "### "+a[1])
		}
	}
}
