package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one child (etcd or kube-apiserver) with its output in a log file.
type process struct {
	name    string
	bin     string
	args    []string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	waitErr error
}

func startProcess(name, bin string, args []string, logPath string) (*process, error) {
	return runProcess(name, bin, args, logPath, os.O_TRUNC)
}

// restart stops p (SIGTERM, then SIGKILL after grace) and starts the same
// binary with the same arguments, its output appended to the same log so
// that both lives can be read in order.
func (p *process) restart(grace time.Duration) (*process, error) {
	p.stop(grace)
	return runProcess(p.name, p.bin, p.args, p.logPath, os.O_APPEND)
}

func runProcess(name, bin string, args []string, logPath string, mode int, extraEnv ...string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|mode, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(childEnv(), extraEnv...)
	// Own process group so that stop signals every descendant; Pdeathsig so
	// that the child dies with us even when this process is killed outright.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, bin: bin, args: args, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// childEnv is our environment without variables that would change how etcd
// or kube-apiserver behave behind our back.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "ETCD_") || strings.HasPrefix(kv, "KUBECONFIG=") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, waits up to grace, then SIGKILLs.
func (p *process) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	pgid := -p.cmd.Process.Pid
	_ = syscall.Kill(pgid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(pgid, syscall.SIGKILL)
		<-p.done
	}
	// Reap anything left in the group (kube-apiserver starts no children, but
	// be certain nothing outlives the control plane).
	_ = syscall.Kill(pgid, syscall.SIGKILL)
}

// exitError describes how the process ended, with the tail of its log.
func (p *process) exitError() error {
	return fmt.Errorf("%s exited early (%v); last lines of %s:\n%s", p.name, p.waitErr, p.logPath, tail(p.logPath, 20))
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	all := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return string(bytes.Join(all, []byte("\n")))
}

// freePorts reserves n distinct free loopback ports. They are released
// before use, so a start can still race another process; Start retries.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Work directories are named with this prefix and hold an owner file with the
// PID of the process that made them, so that a later start can remove the
// directories of runs that were killed before they could clean up.
const (
	workDirPrefix = "keyward-controlplane-"
	ownerFile     = "owner.pid"
)

func makeWorkDir(parent string) (string, error) {
	if parent == "" {
		parent = os.TempDir()
	}
	sweepStaleWorkDirs(parent)
	dir, err := os.MkdirTemp(parent, workDirPrefix)
	if err != nil {
		return "", fmt.Errorf("creating control-plane work dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("writing owner file: %w", err)
	}
	return dir, nil
}

// sweepStaleWorkDirs removes work dirs whose owning process no longer exists.
func sweepStaleWorkDirs(parent string) {
	matches, _ := filepath.Glob(filepath.Join(parent, workDirPrefix+"*"))
	for _, dir := range matches {
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		os.RemoveAll(dir)
	}
}

func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
