package setup

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "Makefile")); err != nil {
		t.Fatalf("no Makefile two levels up: %v", err)
	}
	return root
}

// writeScript writes an executable shell script into dir.
func writeScript(t *testing.T, dir, name, body string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/bash\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

// Without root and without sudo, install-deps names every missing package
// and fails, instead of a sudo or apt-get error.
func TestInstallDepsWithoutRootOrSudoNamesThePackages(t *testing.T) {
	bin := t.TempDir()
	writeScript(t, bin, "id", "echo 1000\n") // a non-root user; no etcd, softhsm2-util, gcc, openssl or sudo on PATH
	cmd := exec.Command("/bin/bash", filepath.Join(repoRoot(t), "hack/install-deps.sh"))
	cmd.Env = []string{"PATH=" + bin}
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("install-deps: %v, want exit status 1\n%s", err, out)
	}
	want := "deps: missing Debian packages: etcd-server softhsm2 gcc libc6-dev openssl pkg-config libseccomp-dev iproute2; not root and no sudo: as root, run: apt-get install etcd-server softhsm2 gcc libc6-dev openssl pkg-config libseccomp-dev iproute2\n"
	if string(out) != want {
		t.Errorf("install-deps printed\n%q\nwant\n%q", out, want)
	}
}

func TestInstallDepsWithEverythingInstalledChangesNothing(t *testing.T) {
	bin := t.TempDir()
	for _, name := range []string{"etcd", "softhsm2-util", "gcc", "openssl", "ip"} {
		writeScript(t, bin, name, "exit 0\n")
	}
	// pkg-config finds libseccomp.
	writeScript(t, bin, "pkg-config", `[ "$1 $2" = "--exists libseccomp" ]`+"\n")
	writeScript(t, bin, "id", "echo 1000\n")
	writeScript(t, bin, "sudo", "echo sudo was called; exit 1\n")
	cmd := exec.Command("/bin/bash", filepath.Join(repoRoot(t), "hack/install-deps.sh"))
	cmd.Env = []string{"PATH=" + bin}
	out, err := cmd.CombinedOutput()
	if err != nil || string(out) != "deps: etcd, softhsm2, gcc, openssl, libseccomp-dev, pkg-config and iproute2 already installed\n" {
		t.Errorf("install-deps: %v\n%s", err, out)
	}
}

// make tools builds a CLI only when its pinned version's binary is missing.
func TestMakeToolsBuildsOnlyAMissingPin(t *testing.T) {
	root := repoRoot(t)
	cases := []struct {
		name        string
		present     []string
		vars        []string
		wantInstall []string
	}{
		{
			name:        "a fresh checkout builds both",
			wantInstall: []string{"helm.sh/helm/v3/cmd/helm@v3.22.0", "sigs.k8s.io/kustomize/kustomize/v5@v5.8.1"},
		},
		{
			name:    "built pins are not rebuilt",
			present: []string{"helm-v3.22.0", "kustomize-v5.8.1"},
		},
		{
			name:        "a changed pin rebuilds that tool only",
			present:     []string{"helm-v3.22.0", "kustomize-v5.8.1"},
			vars:        []string{"HELM_VERSION=v3.99.0"},
			wantInstall: []string{"helm.sh/helm/v3/cmd/helm@v3.99.0"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tools := filepath.Join(dir, "bin/.tools")
			if err := os.MkdirAll(tools, 0o755); err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.present {
				writeScript(t, tools, f, "")
			}
			// -n prints the recipes without running them; -C runs in dir, so
			// CURDIR (and bin/) is dir's. promtool is built from a module
			// in hack/ that dir lacks: left out here.
			args := append([]string{"-n", "-s", "-C", dir, "-f", filepath.Join(root, "Makefile"), "tools", "PROMTOOL="}, tc.vars...)
			cmd := exec.Command("make", args...)
			// Not the flags of a make that runs this test (make test).
			for _, kv := range os.Environ() {
				if k, _, _ := strings.Cut(kv, "="); k != "MAKEFLAGS" && k != "MFLAGS" && k != "MAKELEVEL" {
					cmd.Env = append(cmd.Env, kv)
				}
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("make %v: %v\n%s", args, err, out)
			}
			var got []string
			for _, line := range strings.Split(string(out), "\n") {
				if _, after, ok := strings.Cut(line, " go install "); ok {
					got = append(got, after)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.wantInstall) {
				t.Errorf("go install %v, want %v\n%s", got, tc.wantInstall, out)
			}
			for _, link := range []string{"ln -sfn .tools/helm-", "ln -sfn .tools/kustomize-"} {
				if !bytes.Contains(out, []byte(link)) {
					t.Errorf("make tools does not link %s…\n%s", link, out)
				}
			}
		})
	}
}

// The kube-apiserver build prints "N/M packages compiled" while it runs.
// A fake go stands in for the real one: its build prints two package
// paths, then waits until the test has seen a progress line (or gives up
// after a minute, and the test fails).
func TestBuildAPIServerPrintsProgressWhileCompiling(t *testing.T) {
	dir := t.TempDir()
	release := filepath.Join(dir, "release")
	writeScript(t, dir, "go", fmt.Sprintf(`case "$1" in
list) printf 'a\nb\nc\n' ;;
build)
  out=; while [ $# -gt 0 ]; do [ "$1" = -o ] && out=$2; shift; done
  echo example.com/a >&2; echo example.com/b >&2
  for i in $(seq 600); do [ -e %q ] && break; sleep 0.1; done
  echo binary > "$out" ;;
esac
`, release))
	out := filepath.Join(dir, "kube-apiserver")
	cmd := exec.Command(filepath.Join(repoRoot(t), "hack/build-apiserver.sh"), out)
	cmd.Env = append(os.Environ(), "GO="+filepath.Join(dir, "go"), "KEYWARD_PROGRESS_INTERVAL=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "kube-apiserver: 2/3 packages compiled, ") {
			if err := os.WriteFile(release, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("build-apiserver.sh: %v\n%s", err, strings.Join(lines, "\n"))
	}
	if _, err := os.Stat(release); err != nil {
		t.Errorf("no progress line N/M packages compiled:\n%s", strings.Join(lines, "\n"))
	}
	if b, err := os.ReadFile(out); err != nil || string(b) != "binary\n" {
		t.Errorf("the binary was not moved into place: %v", err)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "kube-apiserver: built "+out) {
		t.Errorf("last line %q, want the built message", last)
	}
}
