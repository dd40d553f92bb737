package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// KubeVersion is the kube-apiserver version the tests run against. It must
// match KUBE_VERSION in the Makefile and the k8s.io/kubernetes requirement in
// hack/tools/go.mod (TestVersionsAgree checks both).
const KubeVersion = "v1.37.1"

// Environment variables that override where the binaries are found.
const (
	EnvKubeAPIServer         = "KEYWARD_KUBE_APISERVER"
	EnvKubeControllerManager = "KEYWARD_KUBE_CONTROLLER_MANAGER"
	EnvEtcd                  = "KEYWARD_ETCD"
	EnvCacheDir              = "KEYWARD_CACHE_DIR"
)

// ErrBinaryMissing is returned (wrapped) when a control-plane binary cannot be
// found; its message names the make target that provides it.
var ErrBinaryMissing = errors.New("control-plane binary missing")

// CacheDir is the folder that holds the built control-plane binaries for
// KubeVersion: $KEYWARD_CACHE_DIR/controlplane/<version>, by default under
// the user's cache directory (~/.cache/keyward).
func CacheDir() (string, error) {
	root := os.Getenv(EnvCacheDir)
	if root == "" {
		uc, err := os.UserCacheDir()
		if err != nil {
			return "", fmt.Errorf("finding the user cache directory (set %s): %w", EnvCacheDir, err)
		}
		root = filepath.Join(uc, "keyward")
	}
	return filepath.Join(root, "controlplane", KubeVersion), nil
}

// findKubeAPIServer returns the kube-apiserver binary: $KEYWARD_KUBE_APISERVER
// or the one `make controlplane` built into CacheDir.
func findKubeAPIServer() (string, error) {
	if p := os.Getenv(EnvKubeAPIServer); p != "" {
		return checkExecutable(p, EnvKubeAPIServer)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return checkExecutable(filepath.Join(dir, "kube-apiserver"), "make controlplane")
}

// FindKubeControllerManager returns the kube-controller-manager binary:
// $KEYWARD_KUBE_CONTROLLER_MANAGER or the one `make controller-manager`
// built into CacheDir. Only the CSR signing benchmark needs it, so `make
// controlplane` does not build it. A benchmark calls it before its set-up,
// to stop early with the error's remedy.
func FindKubeControllerManager() (string, error) {
	if p := os.Getenv(EnvKubeControllerManager); p != "" {
		return checkExecutable(p, EnvKubeControllerManager)
	}
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return checkExecutable(filepath.Join(dir, "kube-controller-manager"), "make controller-manager")
}

// findEtcd returns the etcd binary: $KEYWARD_ETCD, or etcd on PATH (Debian's
// etcd-server package installs /usr/bin/etcd).
func findEtcd() (string, error) {
	if p := os.Getenv(EnvEtcd); p != "" {
		return checkExecutable(p, EnvEtcd)
	}
	p, err := exec.LookPath("etcd")
	if err != nil {
		return "", fmt.Errorf("%w: etcd is not on PATH: run `make deps` (installs Debian's etcd-server) or set %s", ErrBinaryMissing, EnvEtcd)
	}
	return p, nil
}

// checkExecutable returns path if it is an executable file. remedy is the
// make target that builds a cached binary ("make ...") or the environment
// variable that named path.
func checkExecutable(path, remedy string) (string, error) {
	fi, err := os.Stat(path)
	if err != nil {
		if strings.HasPrefix(remedy, "make ") {
			return "", fmt.Errorf("%w: %s %s not found at %s: run `%s` to build it", ErrBinaryMissing, filepath.Base(path), KubeVersion, path, remedy)
		}
		return "", fmt.Errorf("%w: %s=%s: %v", ErrBinaryMissing, remedy, path, err)
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: %s is not an executable file", ErrBinaryMissing, path)
	}
	return path, nil
}
