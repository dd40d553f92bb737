package install

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/keyward/keyward/deploy/image"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// notRun marks the fenced block after it as one the quickstart test skips,
// with the reason: <!-- quickstart test: not run (REASON) -->.
var notRun = regexp.MustCompile(`^<!-- quickstart test: not run \(.+\) -->$`)

// onlyWay marks the block after it as one of the alternatives, run only
// when the test follows that way: <!-- quickstart test: helm way only -->.
var onlyWay = regexp.MustCompile(`^<!-- quickstart test: ([a-z]+) way only -->$`)

// fileBlock is a yaml block that names its file in its first line
// ("# demo-pod.yaml"): the reader saves it under that name.
var fileBlock = regexp.MustCompile(`^# ([A-Za-z0-9._-]+\.ya?ml)$`)

// quickstartScript reads the quickstart the way a user following way
// ("helm" or "kustomize") does: its sh blocks, in order, are the script
// (each one as written, none skipped but those marked not run or marked
// for the other way); its yaml blocks that name a file are the files the
// script uses.
func quickstartScript(path, way string) (string, map[string]string, error) {
	return docScript(path, way, "")
}

// docScript is quickstartScript for any guide: way "" when the guide has
// no alternatives; from, when set, is the heading line where the script
// starts (a later section of a guide).
func docScript(path, way, from string) (string, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	var script strings.Builder
	files := map[string]string{}
	var (
		in, skip bool
		lang     string
		block    []string
		prev     string
		blocks   int
		ways     = map[string]bool{}
	)
	started := from == ""
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := sc.Text()
		if !started {
			started = strings.HasPrefix(text, from)
			continue
		}
		if t := strings.TrimSpace(text); strings.HasPrefix(t, "```") && !strings.HasPrefix(text, "```") {
			return "", nil, fmt.Errorf("%s:%d: an indented fence: the quickstart test reads only fences at the line's start", path, line)
		}
		if !in && slices.Contains([]string{"```bash", "```shell", "```console", "```sh-session"}, strings.TrimSpace(text)) {
			return "", nil, fmt.Errorf("%s:%d: %s: tag shell commands sh, the quickstart test runs those", path, line, strings.TrimSpace(text))
		}
		switch {
		case !in && strings.HasPrefix(text, "```"):
			in, lang, block = true, strings.TrimPrefix(text, "```"), nil
			p := strings.TrimSpace(prev)
			skip = notRun.MatchString(p)
			if m := onlyWay.FindStringSubmatch(p); m != nil {
				skip = m[1] != way
				ways[m[1]] = true
			}
		case in && text == "```":
			in = false
			switch {
			case skip:
			case lang == "sh":
				blocks++
				fmt.Fprintf(&script, "# %s, block ending on line %d\n%s\n", filepath.Base(path), line, strings.Join(block, "\n"))
			case lang == "yaml" && len(block) > 0 && fileBlock.MatchString(block[0]):
				files[fileBlock.FindStringSubmatch(block[0])[1]] = strings.Join(block, "\n") + "\n"
			}
		case in:
			block = append(block, text)
		}
		if strings.TrimSpace(text) != "" {
			prev = text
		}
	}
	if err := sc.Err(); err != nil {
		return "", nil, err
	}
	if in {
		return "", nil, fmt.Errorf("%s: a fenced block is not closed", path)
	}
	if blocks == 0 {
		return "", nil, fmt.Errorf("%s: no sh block to run", path)
	}
	if !started {
		return "", nil, fmt.Errorf("%s: no heading %q", path, from)
	}
	if way != "" && !ways[way] {
		return "", nil, fmt.Errorf("%s: no block is marked for the %s way (<!-- quickstart test: %s way only -->)", path, way, way)
	}
	return script.String(), files, nil
}

func TestQuickstartScriptReadsTheBlocks(t *testing.T) {
	doc := filepath.Join(t.TempDir(), "q.md")
	if err := os.WriteFile(doc, []byte("# Q\n\n<!-- quickstart test: not run (a reason) -->\n```sh\nkind create\n```\n\n```sh\nkubectl a\nkubectl b\n```\n\n<!-- quickstart test: helm way only -->\n```sh\nhelm install\n```\n\n<!-- quickstart test: kustomize way only -->\n```sh\nkubectl apply -k\n```\n\n```yaml\n# pod.yaml\nkind: Pod\n```\n\n```yaml\nkind: Other\n```\n\n## Later\n\n```sh\nopenssl x\n```\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	script, files, err := quickstartScript(doc, "helm")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(script, "kind create") {
		t.Errorf("the block marked not run is in the script:\n%s", script)
	}
	if !strings.Contains(script, "helm install") || strings.Contains(script, "apply -k") {
		t.Errorf("the helm way's script:\n%s", script)
	}
	if k, _, err := quickstartScript(doc, "kustomize"); err != nil || strings.Contains(k, "helm install") || !strings.Contains(k, "apply -k") {
		t.Errorf("the kustomize way's script (%v):\n%s", err, k)
	}
	if _, _, err := quickstartScript(doc, "kubectl"); err == nil {
		t.Error("a way no block is marked for was accepted")
	}
	if from, _, err := docScript(doc, "", "## Later"); err != nil || strings.Contains(from, "kubectl a") || !strings.Contains(from, "openssl x") {
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
	for _, way := range []string{"helm", "kustomize"} {
		if _, _, err := quickstartScript(filepath.Join("..", "..", "docs", "quickstart.md"), way); err != nil {
			t.Errorf("docs/quickstart.md: %v", err)
		}
	}
}

// debCache is the folder of this architecture's cached Debian packages
// (deploy/image.FetchDebs): debs/bookworm-ARCH in the cache root that
// holds controlplane.CacheDir.
func debCache() (string, error) {
	cp, err := controlplane.CacheDir() // <root>/controlplane/<version>
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(filepath.Dir(cp)), "debs", "bookworm-"+runtime.GOARCH), nil
}

// cachedDebs returns the cached .deb files of packages (fetching any that
// is missing, which needs apt and the network: outside the namespaces).
func cachedDebs(packages []string) ([]string, error) {
	dir, err := debCache()
	if err != nil {
		return nil, err
	}
	return image.FetchDebs(dir, runtime.GOARCH, packages)
}

// fetchDebs fills the cache with every package the run's images need.
func fetchDebs() error {
	for _, pkgs := range [][]string{image.Packages("softhsm"), {"busybox-static"}} {
		if _, err := cachedDebs(pkgs); err != nil {
			return err
		}
	}
	return nil
}

// busyboxArchive makes the demo pod's image from Debian's busybox-static
// (its files, plus /bin/sleep, cat, sh, cp, tar and gzip as links to busybox: the commands of the guides' pods and of the HSM client image) and
// writes it as an archive named busyboxRef.
func (c *cluster) busyboxArchive() (string, error) {
	debs, err := cachedDebs([]string{"busybox-static"})
	if err != nil {
		return "", err
	}
	if len(debs) != 1 {
		return "", fmt.Errorf("busybox-static: %d packages, want 1", len(debs))
	}
	data, err := exec.Command("dpkg-deb", "--fsys-tarfile", debs[0]).Output()
	if err != nil {
		return "", fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", debs[0], err)
	}
	var links bytes.Buffer
	tw := tar.NewWriter(&links)
	for _, l := range []string{"sleep", "cat", "sh", "cp", "tar", "gzip"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/" + l, Linkname: "busybox", Mode: 0o777, ModTime: time.Unix(0, 0)}); err != nil {
			return "", err
		}
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	img := v1.Image(empty.Image)
	for _, layer := range [][]byte{data, links.Bytes()} {
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer)), nil })
		if err != nil {
			return "", err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return "", err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/bin:/usr/bin"}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	tag, err := name.NewTag(busyboxRef)
	if err != nil {
		return "", err
	}
	archive := filepath.Join(c.dir, "images", "busybox.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		return "", errors.Join(fmt.Errorf("writing %s", archive), err)
	}
	return archive, nil
}
