package node

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Environment variables the re-executed test binary reads.
const (
	envInside  = "KEYWARD_NODE_NAMESPACES" // set in the child: its work directory
	envNodeIP  = "KEYWARD_NODE_IP"
	envOwner   = "KEYWARD_NODE_OWNER" // set in the child: the outer process's PID
	cgroupBase = "/sys/fs/cgroup"
)

// DefaultNodeIP is the node's address: a /32 on the loopback device of the
// private network namespace, so kubelet has a non-loopback InternalIP that
// no packet can leave the machine by.
const DefaultNodeIP = "10.213.0.2"

// HostPaths are the places outside their configured directories where
// kubelet, containerd and the shims write. Inside the private mount
// namespace a tmpfs covers each top folder below; the host check proves
// that none of these appeared on the host.
var HostPaths = []string{
	"/var/lib/kubelet", "/var/log/containers", "/var/log/pods", "/run/containerd",
	"/var/run/containerd", "/var/lib/cni", "/etc/cni", "/opt/cni", "/usr/libexec/kubernetes",
	"/var/lib/containerd", "/run/nri", "/var/run/nri", "/opt/containerd",
	// kubeadm's kubelet layout and the node agent's default host folders,
	// which the install test writes on the overlay of /etc (OverlayEtc).
	"/etc/kubernetes", "/etc/keyward-node", "/var/lib/keyward-node",
}

// kubeletSysctls are the machine-wide kernel settings kubelet v1.37 sets
// unless protectKernelDefaults (pkg/kubelet/cm, setupKernelTunables), with
// the values it wants. None is per namespace: inside the private mount
// namespace a file holding kubelet's value is bound over each, so kubelet
// (with protectKernelDefaults: true) finds them as it wants and the host's
// stay as they are; the host check compares them before and after.
var kubeletSysctls = map[string]string{
	"vm/overcommit_memory":      "1",
	"vm/panic_on_oom":           "0",
	"kernel/panic":              "10",
	"kernel/panic_on_oops":      "1",
	"kernel/keys/root_maxkeys":  "1000000",
	"kernel/keys/root_maxbytes": "25000000",
}

// tmpfsOver are mounted over in the private mount namespace: every host path
// above lies below one of them (or /etc/cni, which only a misconfigured
// containerd writes and the host check catches).
var tmpfsOver = []string{"/var/lib", "/var/log", "/run", "/usr/libexec", "/opt"}

// EnvSkip, set to 1, skips the real-node tests, saying so (a machine
// without root or with cgroup v2).
const EnvSkip = "KEYWARD_SKIP_NODE_TESTS"

// EnvHold, set to 1, keeps the cluster and node running after the tests
// until SIGINT or SIGTERM (see docs/development.md).
const EnvHold = "KEYWARD_NODE_HOLD"

// Hold reports whether EnvHold asks to keep the node up after the tests.
func Hold() bool { return os.Getenv(EnvHold) == "1" }

// Inside reports whether this process is the test binary re-executed in its
// private namespaces by RunInPrivateNamespaces.
func Inside() bool { return os.Getenv(envInside) != "" }

// WorkDir is the work directory RunInPrivateNamespaces made for the child;
// it is empty outside.
func WorkDir() string { return os.Getenv(envInside) }

// NodeIP is the node's address inside the private network namespace.
func NodeIP() string {
	if ip := os.Getenv(envNodeIP); ip != "" {
		return ip
	}
	return DefaultNodeIP
}

// RunInPrivateNamespaces re-executes the running test binary with the same
// arguments as PID 1 of new mount, network and PID namespaces, and returns
// its exit code. When that child ends, the kernel kills whatever it left
// running in its PID namespace and drops its mounts and network namespace;
// this function then checks the host for anything else (cgroups, host
// paths, processes, the work directory) and returns 1 with a message naming
// each leftover. It needs root (CAP_SYS_ADMIN).
func RunInPrivateNamespaces() int {
	if os.Getenv(EnvSkip) == "1" {
		fmt.Fprintln(os.Stderr, "node-tests: SKIPPED, every real-node test ("+EnvSkip+"=1)")
		return 0
	}
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "node-tests: the real node needs root (private mount, network and PID namespaces, cgroups, overlay mounts); run as root (CI does), or set "+EnvSkip+"=1 to skip node-tests")
		return 1
	}
	if _, err := os.Stat(filepath.Join(cgroupBase, "cgroup.controllers")); err == nil {
		fmt.Fprintln(os.Stderr, "node-tests: this machine uses cgroup v2 (unified hierarchy); the test node supports cgroup v1 hierarchies only (docs/development.md, \"The real node\"); set "+EnvSkip+"=1 to skip node-tests here")
		return 1
	}
	// A run killed before its own clean-up leaves its cgroups: sweep those
	// whose run is gone (their processes died with its PID namespace); a
	// run still going keeps its own.
	if all, _ := nodeCgroups(hostRoots{}, ""); len(all) > 0 {
		removed := 0
		for _, c := range all {
			if ownerAlive(filepath.Base(c)) {
				continue
			}
			if err := RemoveCgroupTree(c); err != nil {
				fmt.Fprintf(os.Stderr, "node-tests: a killed run left cgroup %s and it cannot be removed: %v\n", c, err)
				return 1
			}
			removed++
		}
		if removed > 0 {
			fmt.Fprintf(os.Stderr, "node-tests: removed %d cgroups a killed earlier run left\n", removed)
		}
	}
	before, err := snapshotHost(hostRoots{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "node-tests: reading the host's state: %v\n", err)
		return 1
	}
	sweepWorkDirs()
	dir, err := os.MkdirTemp("", CgroupRootPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "node-tests: %v\n", err)
		return 1
	}
	exe, err := os.Executable()
	if err != nil {
		os.Remove(dir)
		fmt.Fprintf(os.Stderr, "node-tests: %v\n", err)
		return 1
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// NO_PROXY: kube-apiserver dials kubelet at the node's address, which a
	// proxy from the environment could never reach.
	cmd.Env = append(os.Environ(), envInside+"="+dir, envOwner+"="+strconv.Itoa(os.Getpid()),
		"NO_PROXY="+os.Getenv("NO_PROXY")+",10.213.0.0/16,127.0.0.1,localhost", "no_proxy="+os.Getenv("no_proxy")+",10.213.0.0/16,127.0.0.1,localhost")
	// Pdeathsig: the child dies with this process. (Go's fork sees a
	// parent PID of 0 from inside the new PID namespace and signals itself,
	// which the kernel ignores for a namespace's PID 1.)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWNET | syscall.CLONE_NEWPID,
		Pdeathsig:  syscall.SIGKILL,
	}
	code := 0
	if err := cmd.Start(); err != nil {
		os.Remove(dir)
		fmt.Fprintf(os.Stderr, "node-tests: running in private namespaces: %v\n", err)
		return 1
	}
	// The child, in this process group, gets a terminal's SIGINT itself
	// and cleans up; this process waits for it (then checks the host), and
	// passes on a SIGTERM sent to it alone.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		for s := range sigs {
			if s != os.Interrupt {
				_ = cmd.Process.Signal(syscall.SIGTERM)
			}
		}
	}()
	if Hold() {
		fmt.Fprintf(os.Stderr, "node-tests: the cluster and node run in the namespaces of PID %d, work directory %s\n"+
			"  enter them: nsenter --target %d --net --mount -- %s/bin/keyward --kubeconfig %s/admin.kubeconfig trust status keyward.dev/mesh\n",
			cmd.Process.Pid, dir, cmd.Process.Pid, dir, dir)
	}
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			fmt.Fprintf(os.Stderr, "node-tests: running in private namespaces: %v\n", err)
			return 1
		}
		code = ee.ExitCode()
		if code < 0 {
			code = 1
		}
	}
	if left := checkHost(hostRoots{}, before, dir); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "node-tests: the node left things behind on the host:\n  %s\n", strings.Join(left, "\n  "))
		return 1
	}
	fmt.Fprintf(os.Stderr, "node-tests: host clean after the node (no processes, cgroups, mounts, host paths or work directory left)\n")
	return code
}

// SetUpNamespaces prepares the child's namespaces, as PID 1 of them: mounts
// private, a fresh /proc for the new PID namespace, tmpfs over the host
// folders kubelet and containerd write, loopback up with the node's address.
func SetUpNamespaces() error {
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := syscall.Mount("proc", "/proc", "proc", syscall.MS_NOSUID|syscall.MS_NODEV|syscall.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting /proc for the new PID namespace: %w", err)
	}
	// The work directory (CA keys in SoftHSM, etcd, binaries) lives on a
	// tmpfs that goes with this namespace, however the run ends.
	for _, d := range append([]string{WorkDir()}, tmpfsOver...) {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		if err := syscall.Mount("tmpfs", d, "tmpfs", 0, "mode=755"); err != nil {
			return fmt.Errorf("mounting tmpfs over %s: %w", d, err)
		}
	}
	sysctls := filepath.Join(WorkDir(), "sysctl")
	if err := os.MkdirAll(sysctls, 0o755); err != nil {
		return err
	}
	for name, v := range kubeletSysctls {
		f := filepath.Join(sysctls, strings.ReplaceAll(name, "/", "."))
		if err := os.WriteFile(f, []byte(v+"\n"), 0o444); err != nil {
			return err
		}
		if err := syscall.Mount(f, "/proc/sys/"+name, "", syscall.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding kubelet's %s over the host's: %w", name, err)
		}
	}
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		return fmt.Errorf("ip link set lo up: %v: %s (make deps installs iproute2)", err, out)
	}
	return AddAddress(NodeIP())
}

// OverlayEtc makes /etc writable for this mount namespace only: an
// overlay whose upper layer lives on the work directory's tmpfs, so that a
// test can lay the node out as kubeadm does (/etc/kubernetes/kubelet.conf),
// name hosts in /etc/hosts, and let pods write hostPath folders under /etc,
// while the machine's /etc stays as it was. Call it after SetUpNamespaces.
// Files bind-mounted over /etc's own (a container's /etc/hosts) are hidden
// by the overlay: the namespace sees the underlying copies.
func OverlayEtc() error {
	upper, work := filepath.Join(WorkDir(), "etc-overlay", "upper"), filepath.Join(WorkDir(), "etc-overlay", "work")
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := syscall.Mount("overlay", "/etc", "overlay", 0, "lowerdir=/etc,upperdir="+upper+",workdir="+work); err != nil {
		return fmt.Errorf("mounting an overlay over /etc: %w", err)
	}
	return nil
}

// AddAddress puts another /32 on the namespace's loopback (a ClusterIP,
// a stand-in registry's address).
func AddAddress(ip string) error {
	if out, err := exec.Command("ip", "addr", "add", ip+"/32", "dev", "lo").CombinedOutput(); err != nil {
		return fmt.Errorf("ip addr add %s/32 dev lo: %v: %s (make deps installs iproute2)", ip, err, out)
	}
	return nil
}

// hostRoots lets the leftover check run against a test tree; zero values
// are the real host.
type hostRoots struct {
	proc, cgroup, prefix string
}

func (r hostRoots) procDir() string {
	if r.proc != "" {
		return r.proc
	}
	return "/proc"
}

func (r hostRoots) cgroupDir() string {
	if r.cgroup != "" {
		return r.cgroup
	}
	return cgroupBase
}

// hostState is what the check compares: which host paths existed and which
// cgroups named like the node's existed before the node ran.
type hostState struct {
	paths   map[string]bool
	cgroups map[string]bool
	sysctls map[string]string
}

func snapshotHost(r hostRoots) (hostState, error) {
	s := hostState{paths: map[string]bool{}, cgroups: map[string]bool{}, sysctls: readSysctls(r)}
	for _, p := range HostPaths {
		if _, err := os.Lstat(r.prefix + p); err == nil {
			s.paths[p] = true
		}
	}
	cgs, err := nodeCgroups(r, strconv.Itoa(os.Getpid()))
	if err != nil {
		return s, err
	}
	for _, c := range cgs {
		s.cgroups[c] = true
	}
	return s, nil
}

// nodeCgroups lists the cgroups nodes make (CgroupRootPrefix<owner>-*) in
// every hierarchy: those of the run whose outer process is owner, or of
// every run when owner is empty.
func nodeCgroups(r hostRoots, owner string) ([]string, error) {
	prefix := CgroupRootPrefix
	if owner != "" {
		prefix += owner + "-"
	}
	var out []string
	hier, err := os.ReadDir(r.cgroupDir())
	if err != nil {
		return nil, err
	}
	for _, h := range hier {
		entries, err := os.ReadDir(filepath.Join(r.cgroupDir(), h.Name()))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if e.IsDir() && strings.HasPrefix(e.Name(), prefix) {
				out = append(out, filepath.Join(r.cgroupDir(), h.Name(), e.Name()))
			}
		}
	}
	return out, nil
}

// checkHost names everything the node left on the host: a process whose
// command line, working directory or environment mentions the work
// directory, a node cgroup that was not there before, a host path that
// appeared, or the work directory itself.
func checkHost(r hostRoots, before hostState, workDir string) []string {
	var left []string
	// Processes: the PID namespace's end kills its members; anything
	// else that names the work directory escaped it.
	deadline := time.Now().Add(5 * time.Second)
	for {
		left = left[:0]
		procs, _ := os.ReadDir(r.procDir())
		for _, p := range procs {
			pid := p.Name()
			if pid == "" || pid[0] < '0' || pid[0] > '9' || pid == fmt.Sprint(os.Getpid()) {
				continue
			}
			if mentions(filepath.Join(r.procDir(), pid), workDir) {
				cmdline, _ := os.ReadFile(filepath.Join(r.procDir(), pid, "cmdline"))
				left = append(left, fmt.Sprintf("process %s still running: %s", pid, strings.ReplaceAll(strings.TrimRight(string(cmdline), "\x00"), "\x00", " ")))
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	cgs, err := nodeCgroups(r, strconv.Itoa(os.Getpid()))
	if err != nil {
		left = append(left, "cannot list cgroups: "+err.Error())
	}
	for _, c := range cgs {
		if !before.cgroups[c] {
			left = append(left, "cgroup "+c)
			_ = RemoveCgroupTree(c) // reported, and gone for the next run
		}
	}
	for name, v := range readSysctls(r) {
		if was := before.sysctls[name]; v != was {
			left = append(left, fmt.Sprintf("kernel setting %s is %s, was %s", name, v, was))
		}
	}
	for _, p := range HostPaths {
		if before.paths[p] {
			continue
		}
		if _, err := os.Lstat(r.prefix + p); err == nil {
			left = append(left, "host path "+p+" (absent before the node ran)")
		}
	}
	// The child's tmpfs held the work directory's contents; on the host it
	// is an empty directory, removed here. Anything in it escaped.
	if workDir != "" {
		if err := os.Remove(workDir); err != nil && !os.IsNotExist(err) {
			left = append(left, "work directory "+workDir+" ("+err.Error()+")")
			_ = os.RemoveAll(workDir)
		}
	}
	return left
}

// mentions reports whether the process at procPath names dir in its
// command line, working directory or environment.
func mentions(procPath, dir string) bool {
	if dir == "" {
		return false
	}
	for _, f := range []string{"cmdline", "environ"} {
		if b, err := os.ReadFile(filepath.Join(procPath, f)); err == nil && strings.Contains(string(b), dir) {
			return true
		}
	}
	if cwd, err := os.Readlink(filepath.Join(procPath, "cwd")); err == nil && strings.HasPrefix(cwd, dir) {
		return true
	}
	return false
}

// RemoveCgroupTree removes the cgroup directory dir and every cgroup below
// it, deepest first. The cgroups must hold no processes.
func RemoveCgroupTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	for _, e := range entries {
		if e.IsDir() {
			if err := RemoveCgroupTree(filepath.Join(dir, e.Name())); err != nil {
				return err
			}
		}
	}
	var err2 error
	for i := 0; i < 50; i++ { // a cgroup whose last process just died can be busy for a moment
		if err2 = syscall.Rmdir(dir); err2 == nil || errors.Is(err2, syscall.ENOENT) {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("removing cgroup %s: %w", dir, err2)
}

// cgroupOwner is the outer PID a node cgroup's name carries, for the
// child's Start; "0" outside a run.
func cgroupOwner() string {
	if o := os.Getenv(envOwner); o != "" {
		return o
	}
	return "0"
}

// ownerAlive reports whether the run that named a node cgroup
// (CgroupRootPrefix<pid>-<n>) still has its outer process.
func ownerAlive(name string) bool {
	pid, err := strconv.Atoi(strings.SplitN(strings.TrimPrefix(name, CgroupRootPrefix), "-", 2)[0])
	if err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// readSysctls reads the host's value of each setting kubelet would change.
func readSysctls(r hostRoots) map[string]string {
	out := map[string]string{}
	for name := range kubeletSysctls {
		b, err := os.ReadFile(filepath.Join(r.procDir(), "sys", name))
		if err != nil {
			continue // not on this kernel
		}
		out[name] = strings.TrimSpace(string(b))
	}
	return out
}

// sweepWorkDirs removes the (empty) work directories of runs whose outer
// process is gone: a run killed outright leaves its directory, whose
// contents were on the tmpfs of its mount namespace.
func sweepWorkDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), CgroupRootPrefix+"*-*"))
	for _, d := range dirs {
		if !ownerAlive(filepath.Base(d)) {
			_ = os.Remove(d)
		}
	}
}
