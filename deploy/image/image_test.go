package image

import (
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// What the test stamps into the release builds.
const (
	testVersion   = "v0.0.0-imagetest"
	testCommit    = "0123456789abcdef0123456789abcdef01234567"
	testEpoch     = 1700000000
	testBuildDate = "2023-11-14T22:13:20Z" // testEpoch in RFC 3339
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/keyward/keyward\n")) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no keyward go.mod above the test's directory")
		}
		dir = parent
	}
}

func readDockerfile(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "Dockerfile"))
	if err != nil {
		t.Fatalf("reading the Dockerfile: %v", err)
	}
	return b
}

func TestDockerfileMatchesTheContract(t *testing.T) {
	d, err := ParseDockerfile(bytes.NewReader(readDockerfile(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckDockerfile(d); err != nil {
		t.Errorf("the Dockerfile departs from SHIP.md:\n%v", err)
	}
}

// Each check of CheckDockerfile catches the mistake it is there for: the
// real Dockerfile, changed in one place, fails with the matching error.
func TestDockerfileChecksCatchEachMistake(t *testing.T) {
	real := string(readDockerfile(t))
	cases := []struct {
		name     string
		old, new string
		want     error
	}{
		{"a runtime stage on another base is refused", "ARG RUNTIME_IMAGE=" + RuntimeBase, "ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot", ErrBase},
		{"a build stage on another Go image is refused", "ARG GO_IMAGE=" + BuildBase, "ARG GO_IMAGE=golang:1.26-alpine", ErrBase},
		{"a RUN in the runtime stage is refused", "FROM ${RUNTIME_IMAGE} AS runtime\n", "FROM ${RUNTIME_IMAGE} AS runtime\nRUN mkdir /data\n", ErrShellNeeded},
		{"a shell-form ENTRYPOINT is refused", "USER 65532:65532\nENTRYPOINT [\"/usr/local/bin/keyward\"]\n", "USER 65532:65532\nENTRYPOINT /usr/local/bin/keyward\n", ErrShellNeeded},
		{"a shell-form CMD is refused", "ENTRYPOINT [\"/usr/local/bin/keyward\"]\n", "ENTRYPOINT [\"/usr/local/bin/keyward\"]\nCMD signer --config /etc/keyward/config.yaml\n", ErrShellNeeded},
		{"an image running as root is refused", "USER 65532:65532\nENTRYPOINT [\"/usr/local/bin/keyward\"]\n", "USER 0:0\nENTRYPOINT [\"/usr/local/bin/keyward\"]\n", ErrUser},
		{"another entrypoint is refused", "ENTRYPOINT [\"/usr/local/bin/keyward\"]\n", "ENTRYPOINT [\"/keyward\"]\n", ErrEntrypoint},
		{"a build stage calling go build itself is refused", BuildScript, "go build -o /out/keyward ./cmd/keyward", ErrBuild},
		{"a softhsm stage without softhsm2 is refused", "--no-install-recommends softhsm2 ca-certificates", "--no-install-recommends ca-certificates", ErrSoftHSM},
		{"a softhsm config with another token directory is refused", "directories.tokendir = " + TokenDir, "directories.tokendir = /tmp/tokens", ErrSoftHSM},
		{"a stage after runtime, which would become the default target, is refused", "", "\nFROM " + SoftHSMBase + " AS debug\n", ErrStage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changed := real + tc.new
			if tc.old != "" {
				if !strings.Contains(real, tc.old) {
					t.Fatalf("the Dockerfile no longer contains %q: update this case", tc.old)
				}
				changed = strings.Replace(real, tc.old, tc.new, 1)
			}
			d, err := ParseDockerfile(strings.NewReader(changed))
			if err != nil {
				t.Fatal(err)
			}
			if err := CheckDockerfile(d); !errors.Is(err, tc.want) {
				t.Errorf("CheckDockerfile = %v, want %v", err, tc.want)
			}
		})
	}
}

// Each check of CheckLinkage catches what it is there for.
func TestLinkageChecksCatchEachMistake(t *testing.T) {
	good := Linkage{
		Machine:     elf.EM_X86_64,
		Interpreter: "/lib64/ld-linux-x86-64.so.2",
		Needed:      []string{"libc.so.6"},
		Symbols:     []elf.ImportedSymbol{{Name: "dlopen", Version: "GLIBC_2.34"}, {Name: "free", Version: "GLIBC_2.2.5"}},
	}
	if err := CheckLinkage(good); err != nil {
		t.Fatalf("a binary needing only libc is refused: %v", err)
	}
	cases := []struct {
		name   string
		change func(*Linkage)
		want   error
	}{
		{"a library the base lacks is refused", func(l *Linkage) { l.Needed = append(l.Needed, "libssl.so.3") }, ErrLibrary},
		{"another dynamic loader is refused", func(l *Linkage) { l.Interpreter = "/lib/ld-musl-x86_64.so.1" }, ErrLibrary},
		{"a glibc symbol newer than Debian 12's is refused", func(l *Linkage) {
			l.Symbols = append(l.Symbols, elf.ImportedSymbol{Name: "__isoc23_strtol", Version: "GLIBC_2.38"})
		}, ErrGlibc},
		{"a static binary is refused as built without cgo", func(l *Linkage) { l.Interpreter, l.Needed, l.Symbols = "", nil, nil }, ErrNoCgo},
		{"a binary without dlopen is refused as built without PKCS#11", func(l *Linkage) { l.Symbols = l.Symbols[1:] }, ErrNoCgo},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := good
			l.Needed = append([]string(nil), good.Needed...)
			l.Symbols = append([]elf.ImportedSymbol(nil), good.Symbols...)
			tc.change(&l)
			if err := CheckLinkage(l); !errors.Is(err, tc.want) {
				t.Errorf("CheckLinkage = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestDockerignoreKeepsWhatTheBuildNeeds(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot(t), ".dockerignore"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ig, err := ParseDockerignore(f)
	if err != nil {
		t.Fatal(err)
	}
	for path, excluded := range map[string]bool{
		".git/HEAD":                         true,
		"bin/helm":                          true,
		"signer/pcr/controller_test.go":     true,
		"signer/pcr/testdata/leaf.pem":      true,
		"softhsm-tests/foundation_test.go":  true,
		"signer/pcr/controller.go":          false,
		"hack/build-release.sh":             false,
		"deploy/kustomize/base/signer.yaml": false,
		"go.sum":                            false,
	} {
		if got := ig.Excluded(path); got != excluded {
			t.Errorf("Excluded(%q) = %v, want %v", path, got, excluded)
		}
	}
}

var (
	buildDir  string // made and removed by TestMain
	buildOnce sync.Once
	builds    [2]string
	buildErr  error
)

func TestMain(m *testing.M) {
	var err error
	if buildDir, err = os.MkdirTemp("", "keyward-image-test-"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(buildDir)
	os.Exit(code)
}

// releaseBuilds builds keyward twice with hack/build-release.sh, as the
// Dockerfile's build stage does: once from the checkout and once from a copy
// of the Docker build context (the checkout minus .dockerignore) at another
// path. The two must be byte-identical.
func releaseBuilds(t *testing.T) [2]string {
	t.Helper()
	root := repoRoot(t)
	buildOnce.Do(func() {
		dir := buildDir
		f, err := os.Open(filepath.Join(root, ".dockerignore"))
		if err != nil {
			buildErr = err
			return
		}
		ig, err := ParseDockerignore(f)
		f.Close()
		if err != nil {
			buildErr = err
			return
		}
		context := filepath.Join(dir, "context")
		if err := CopyContext(root, context, ig); err != nil {
			buildErr = fmt.Errorf("copying the build context: %w", err)
			return
		}
		defer os.RemoveAll(context)
		for i, src := range []string{root, context} {
			builds[i] = filepath.Join(dir, fmt.Sprintf("keyward-%d", i))
			cmd := exec.Command("./hack/build-release.sh", builds[i])
			cmd.Dir = src
			cmd.Env = append(os.Environ(), "VERSION="+testVersion, "GIT_COMMIT="+testCommit, fmt.Sprintf("SOURCE_DATE_EPOCH=%d", testEpoch))
			start := time.Now()
			out, err := cmd.CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("hack/build-release.sh in %s: %w\n%s", src, err, out)
				return
			}
			t.Logf("built %s from %s in %s", builds[i], src, time.Since(start).Round(time.Second))
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builds
}

func TestReleaseBinaryNeedsOnlyTheRuntimeBase(t *testing.T) {
	bin := releaseBuilds(t)[0]
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l, err := ReadLinkage(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("interpreter %s, DT_NEEDED %v", l.Interpreter, l.Needed)
	if err := CheckLinkage(l); err != nil {
		t.Errorf("the release binary needs more than %s offers:\n%v", RuntimeBase, err)
	}
}

func TestReleaseBinaryReportsTheInjectedVersion(t *testing.T) {
	bin := releaseBuilds(t)[0]
	// As in the distroless image: no shell, no PATH, no HOME, cwd /.
	cmd := exec.Command(bin, "version", "--output", "json")
	cmd.Env = []string{}
	cmd.Dir = "/"
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("keyward version: %v\n%s", err, stderr.Bytes())
	}
	var got struct {
		Version, GitCommit, BuildDate, GoVersion, Platform string
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("decoding %q: %v", out, err)
	}
	if got.Version != testVersion || got.GitCommit != testCommit || got.BuildDate != testBuildDate {
		t.Errorf("keyward version = %+v, want version %s, commit %s, date %s", got, testVersion, testCommit, testBuildDate)
	}
	if got.GoVersion == "" || got.Platform == "" {
		t.Errorf("keyward version = %+v, want the Go version and platform", got)
	}
}

func TestReleaseBuildIsReproducible(t *testing.T) {
	b := releaseBuilds(t)
	one, err := os.ReadFile(b[0])
	if err != nil {
		t.Fatal(err)
	}
	two, err := os.ReadFile(b[1])
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(one, two) {
		t.Errorf("two builds with the same inputs, from the checkout and from the Docker build context at another path, differ (%d and %d bytes)", len(one), len(two))
	}
}
