package controlplane

import (
	"os"
	"time"
)

// Process is a child process started the way the control plane starts etcd
// and kube-apiserver: its output in a log file, in a process group of its
// own that Stop signals whole, and killed if this process dies. The test
// node (testsupport/node) runs kubelet and containerd with it.
type Process struct{ p *process }

// StartProcess runs bin with args, its output in logPath (truncated), with
// this process's environment (less ETCD_* and KUBECONFIG) plus extraEnv.
func StartProcess(name, bin string, args []string, logPath string, extraEnv ...string) (*Process, error) {
	p, err := runProcess(name, bin, args, logPath, os.O_TRUNC, extraEnv...)
	if err != nil {
		return nil, err
	}
	return &Process{p: p}, nil
}

// Stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs
// it. It is safe to call more than once.
func (p *Process) Stop(grace time.Duration) { p.p.stop(grace) }

// Exited reports whether the process has ended.
func (p *Process) Exited() bool { return p.p.exited() }

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.p.done }

// ExitError says how the process ended, with the tail of its log.
func (p *Process) ExitError() error { return p.p.exitError() }

// Pid is the process ID.
func (p *Process) Pid() int { return p.p.cmd.Process.Pid }

// LogPath is the file that receives the process's output.
func (p *Process) LogPath() string { return p.p.logPath }

// Tail returns the last lines of the file at path (a log), or a note saying
// why it could not be read.
func Tail(path string, lines int) string { return tail(path, lines) }

// FreePorts reserves n distinct free loopback ports and releases them; a
// caller can still lose one to a race.
func FreePorts(n int) ([]int, error) { return freePorts(n) }
