package controlplane

import (
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ControllerManagerOptions configure StartControllerManager.
type ControllerManagerOptions struct {
	// Dir receives the kubeconfig and kube-controller-manager.log; it must
	// exist (a test's TempDir).
	Dir string
	// Controllers is --controllers: only these run (at least one).
	Controllers []string
	// QPS and Burst are --kube-api-qps and --kube-api-burst, so that a
	// benchmark can give kube-controller-manager the client limits of the
	// signer it is compared with (its defaults are 20 and 30).
	QPS   float32
	Burst int
	// ExtraFlags are appended to the command line, such as a signer's
	// --cluster-signing-*-cert-file and -key-file.
	ExtraFlags []string
}

// ControllerManager is a kube-controller-manager process started by
// StartControllerManager.
type ControllerManager struct {
	p *process
	// LogPath is its log (klog text, --v=1).
	LogPath string
}

// PID is the process ID of kube-controller-manager.
func (m *ControllerManager) PID() int { return m.p.cmd.Process.Pid }

// StartControllerManager runs kube-controller-manager against the control
// plane as the admin user (system:masters: a benchmark peer, not a model of
// its RBAC), without leader election and without its serving port. It does
// not wait: with no port there is no /healthz to ask, so a caller knows it
// works by what it does.
func (cp *ControlPlane) StartControllerManager(opts ControllerManagerOptions) (*ControllerManager, error) {
	if opts.Dir == "" {
		return nil, errors.New("ControllerManagerOptions.Dir is empty: name a folder for the kubeconfig and the log")
	}
	if len(opts.Controllers) == 0 {
		return nil, errors.New("ControllerManagerOptions.Controllers is empty: name the controllers to run (kube-controller-manager would run its default set)")
	}
	if opts.QPS <= 0 {
		return nil, fmt.Errorf("ControllerManagerOptions.QPS is %v: want a positive --kube-api-qps", opts.QPS)
	}
	if opts.Burst <= 0 {
		return nil, fmt.Errorf("ControllerManagerOptions.Burst is %d: want a positive --kube-api-burst", opts.Burst)
	}
	bin, err := FindKubeControllerManager()
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(opts.Dir, "kube-controller-manager.kubeconfig")
	if err := WriteKubeconfig(cp.AdminConfig(), "kube-controller-manager", kubeconfig); err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(opts.Controllers, ","),
		"--leader-elect=false",
		// 0 turns off serving, and with it the delegated authentication and
		// authorization that would otherwise look for their own kubeconfig.
		"--secure-port=0",
		"--use-service-account-credentials=false",
		"--kube-api-qps=" + strconv.FormatFloat(float64(opts.QPS), 'f', -1, 32),
		"--kube-api-burst=" + strconv.Itoa(opts.Burst),
		// Its default, written out: keyward's client speaks protobuf too
		// (kubeclient), and a comparison must not hinge on a default.
		"--kube-api-content-type=application/vnd.kubernetes.protobuf",
		"--v=1",
	}
	args = append(args, opts.ExtraFlags...)
	logPath := filepath.Join(opts.Dir, "kube-controller-manager.log")
	p, err := startProcess("kube-controller-manager", bin, args, logPath)
	if err != nil {
		return nil, err
	}
	return &ControllerManager{p: p, LogPath: logPath}, nil
}

// Done is closed when the process has ended.
func (m *ControllerManager) Done() <-chan struct{} { return m.p.done }

// Exited is nil while the process runs, else how it ended with its log's
// last lines.
func (m *ControllerManager) Exited() error {
	if m.p.exited() {
		return m.p.exitError()
	}
	return nil
}

// LogTail is the last n lines of its log.
func (m *ControllerManager) LogTail(n int) string { return tail(m.LogPath, n) }

// Stop terminates it (SIGTERM, then SIGKILL after 10s); safe to call twice.
func (m *ControllerManager) Stop() { m.p.stop(10 * time.Second) }
