package controlplane

import (
	"errors"
	"path/filepath"
	"time"
)

// FindKubeScheduler returns the kube-scheduler `make node` built into
// CacheDir.
func FindKubeScheduler() (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return checkExecutable(filepath.Join(dir, "kube-scheduler"), "make node")
}

// FindKubectl returns the kubectl `make node` built into CacheDir (the
// install test runs docs/quickstart.md's commands with it).
func FindKubectl() (string, error) {
	dir, err := CacheDir()
	if err != nil {
		return "", err
	}
	return checkExecutable(filepath.Join(dir, "kubectl"), "make node")
}

// Scheduler is a kube-scheduler process started by StartScheduler.
type Scheduler struct {
	p *process
	// LogPath is its log (klog text, --v=1).
	LogPath string
}

// StartScheduler runs kube-scheduler against the control plane as the
// admin user, without leader election and without its serving port, logging
// into dir. It does not wait: pods that get a node show it works.
func (cp *ControlPlane) StartScheduler(dir string) (*Scheduler, error) {
	if dir == "" {
		return nil, errors.New("StartScheduler: dir is empty: name a folder for the kubeconfig and the log")
	}
	bin, err := FindKubeScheduler()
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kube-scheduler.kubeconfig")
	if err := WriteKubeconfig(cp.AdminConfig(), "kube-scheduler", kubeconfig); err != nil {
		return nil, err
	}
	logPath := filepath.Join(dir, "kube-scheduler.log")
	p, err := startProcess("kube-scheduler", bin, []string{
		"--kubeconfig=" + kubeconfig,
		"--leader-elect=false",
		// 0 turns off serving, and with it the delegated authentication
		// and authorization that would look for their own kubeconfig.
		"--secure-port=0",
		"--v=1",
	}, logPath)
	if err != nil {
		return nil, err
	}
	return &Scheduler{p: p, LogPath: logPath}, nil
}

// Exited is nil while the process runs, else how it ended with its log's
// last lines.
func (s *Scheduler) Exited() error {
	if s.p.exited() {
		return s.p.exitError()
	}
	return nil
}

// Stop terminates it (SIGTERM, then SIGKILL after 10s); safe to call twice.
func (s *Scheduler) Stop() { s.p.stop(10 * time.Second) }
