package image

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// One version string everywhere: the VERSION file is what make release
// stamps into the binaries and the image tag and gives the chart as
// version and appVersion; the checked-in chart, the kustomize overlays,
// the examples and every image reference in the docs say the same (the
// image tag has no "v": VERSION, or VERSION-softhsm for the SoftHSM2
// variant).
func TestOneVersionEverywhere(t *testing.T) {
	root := repoRoot(t)
	read := func(rel string) string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	version := strings.TrimSpace(read("VERSION"))
	if !regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$`).MatchString(version) {
		t.Fatalf("VERSION %q is not a semantic version without a v (the chart needs one)", version)
	}
	var chart struct {
		Version    string `json:"version"`
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(read("deploy/helm/keyward/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	if chart.Version != version || chart.AppVersion != version {
		t.Errorf("Chart.yaml version %q appVersion %q, VERSION %q", chart.Version, chart.AppVersion, version)
	}
	newTag := regexp.MustCompile(`(?m)^\s*newTag:\s*"?([^"\s]+)"?`)
	overlays, _ := filepath.Glob(filepath.Join(root, "deploy/kustomize/overlays/*/kustomization.yaml"))
	if len(overlays) == 0 {
		t.Fatal("no overlays found")
	}
	for _, o := range overlays {
		b, _ := os.ReadFile(o)
		tags := newTag.FindAllStringSubmatch(string(b), -1)
		if len(tags) == 0 {
			t.Errorf("%s pins no newTag: it would deploy whatever the base names", o)
		}
		softhsm := filepath.Base(filepath.Dir(o)) == "softhsm"
		for _, m := range tags {
			if m[1] != version && !(softhsm && m[1] == version+"-softhsm") {
				t.Errorf("%s: newTag %s, VERSION %s (the -softhsm variant only in the softhsm overlay)", o, m[1], version)
			}
		}
	}
	// Every reference to keyward's image in docs, examples and manifests.
	ref := regexp.MustCompile(`ghcr\.io/keyward/keyward:([^\s"'\x60)$]+)`)
	placeholder := regexp.MustCompile(`^(VERSION|<version>|…)(-softhsm)?[.,;:]?$`)
	// Every helm install/upgrade of the released chart names its version.
	chartRef := regexp.MustCompile(`oci://ghcr\.io/keyward/charts/keyward\b`)
	chartVersion := regexp.MustCompile(`--version[= ]+([^\s\x60\\]+)`)
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			switch rel {
			case ".git", "bin", "dist", "docs/bench":
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(p) {
		case ".md", ".yaml", ".yml", ".txt", ".tpl":
		default:
			if d.Name() != "Dockerfile" {
				return nil
			}
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		for _, m := range ref.FindAllStringSubmatch(string(b), -1) {
			if placeholder.MatchString(m[1]) {
				continue // VERSION, <version>-softhsm, … in prose
			}
			if m[1] != version && m[1] != version+"-softhsm" {
				t.Errorf("%s: %s, VERSION %s", rel, m[0], version)
			}
		}
		// The command a chart reference is in: up to a blank line or the
		// end of its code block.
		for _, loc := range chartRef.FindAllStringIndex(string(b), -1) {
			cmd := string(b[loc[0]:])
			for _, end := range []string{"\n\n", "```"} {
				if i := strings.Index(cmd, end); i >= 0 {
					cmd = cmd[:i]
				}
			}
			m := chartVersion.FindStringSubmatch(cmd)
			switch {
			case m == nil:
				t.Errorf("%s: %q names no --version (helm would take the newest chart, not VERSION %s)", rel, cmd, version)
			case m[1] != version && !placeholder.MatchString(m[1]):
				t.Errorf("%s: %s, VERSION %s", rel, m[0], version)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
