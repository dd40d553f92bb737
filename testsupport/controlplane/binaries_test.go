package controlplane

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The version this package looks for, the one the Makefile builds, and the
// one hack/tools pins must be the same, or tests would run a stale binary.
func TestVersionsAgree(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^KUBE_VERSION\s*:=\s*(\S+)`).FindSubmatch(mk)
	if m == nil || string(m[1]) != KubeVersion {
		t.Errorf("Makefile KUBE_VERSION = %q, want %q", m, KubeVersion)
	}
	gomod, err := os.ReadFile("../../hack/tools/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(gomod), "k8s.io/kubernetes "+KubeVersion) {
		t.Errorf("hack/tools/go.mod does not require k8s.io/kubernetes %s", KubeVersion)
	}
	staging := "v0" + strings.TrimPrefix(KubeVersion, "v1")
	for _, line := range regexp.MustCompile(`(?m)^\s*k8s\.io/\S+ => k8s\.io/\S+ (\S+)$`).FindAllStringSubmatch(string(gomod), -1) {
		if line[1] != staging {
			t.Errorf("hack/tools/go.mod: %q, want staging version %s", strings.TrimSpace(line[0]), staging)
		}
	}
}

func TestMissingAPIServerNamesTheMakeTarget(t *testing.T) {
	t.Setenv(EnvKubeAPIServer, "")
	t.Setenv(EnvCacheDir, t.TempDir())
	_, err := findKubeAPIServer()
	if !errors.Is(err, ErrBinaryMissing) {
		t.Fatalf("got %v, want ErrBinaryMissing", err)
	}
	if !strings.Contains(err.Error(), "make controlplane") {
		t.Errorf("error %q does not name `make controlplane`", err)
	}
}

func TestMissingControllerManagerNamesTheMakeTarget(t *testing.T) {
	t.Setenv(EnvKubeControllerManager, "")
	t.Setenv(EnvCacheDir, t.TempDir())
	_, err := FindKubeControllerManager()
	if !errors.Is(err, ErrBinaryMissing) {
		t.Fatalf("got %v, want ErrBinaryMissing", err)
	}
	if !strings.Contains(err.Error(), "kube-controller-manager "+KubeVersion) || !strings.Contains(err.Error(), "make controller-manager") {
		t.Errorf("error %q does not name kube-controller-manager %s and `make controller-manager`", err, KubeVersion)
	}
}

func TestMissingEtcdNamesTheRemedy(t *testing.T) {
	t.Setenv(EnvEtcd, "")
	t.Setenv("PATH", t.TempDir())
	_, err := findEtcd()
	if !errors.Is(err, ErrBinaryMissing) || !strings.Contains(err.Error(), "make deps") {
		t.Fatalf("got %v, want ErrBinaryMissing naming `make deps`", err)
	}
}

func TestStaleWorkDirsAreSwept(t *testing.T) {
	parent := t.TempDir()
	dead := filepath.Join(parent, workDirPrefix+"dead")
	live := filepath.Join(parent, workDirPrefix+"live")
	for dir, pid := range map[string]string{dead: "2147483646", live: "1"} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(pid), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dir, err := makeWorkDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("work dir of a dead process survived: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("work dir of a live process was removed: %v", err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("new work dir missing: %v", err)
	}
}

// Options that would start a kube-controller-manager running its default
// controllers, or at its default client limits, are refused before any
// process starts, naming the field.
func TestStartControllerManagerNamesTheMissingOption(t *testing.T) {
	// No binary anywhere, so that an option let through fails otherwise.
	t.Setenv(EnvKubeControllerManager, "")
	t.Setenv(EnvCacheDir, t.TempDir())
	cp := &ControlPlane{}
	full := ControllerManagerOptions{Dir: t.TempDir(), Controllers: []string{"csrsigning"}, QPS: 1, Burst: 1}
	for field, opts := range map[string]ControllerManagerOptions{
		"Dir":         {Controllers: full.Controllers, QPS: 1, Burst: 1},
		"Controllers": {Dir: full.Dir, QPS: 1, Burst: 1},
		"QPS":         {Dir: full.Dir, Controllers: full.Controllers, Burst: 1},
		"Burst":       {Dir: full.Dir, Controllers: full.Controllers, QPS: 1},
	} {
		_, err := cp.StartControllerManager(opts)
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("without %s: error %v, want one naming %s", field, err, field)
		}
	}
	// The full options get as far as looking for the binary.
	if _, err := cp.StartControllerManager(full); !errors.Is(err, ErrBinaryMissing) {
		t.Errorf("with every option set and no binary: %v, want ErrBinaryMissing", err)
	}
}
