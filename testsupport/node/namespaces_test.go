package node

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// The host check names each kind of leftover, and nothing on a clean host.
func TestCheckHostNamesEveryLeftover(t *testing.T) {
	root := t.TempDir()
	r := hostRoots{proc: filepath.Join(root, "proc"), cgroup: filepath.Join(root, "cgroup"), prefix: filepath.Join(root, "host")}
	work := filepath.Join(root, "work")
	for _, d := range []string{r.proc, filepath.Join(r.cgroup, "memory"), filepath.Join(r.cgroup, "cpu"), r.prefix + "/var/lib"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Before: an unrelated process, an unrelated cgroup, /var/lib/kubelet
	// already there (a host that runs its own kubelet).
	writeProc(t, r.proc, "100", "/usr/bin/sshd\x00-D\x00")
	writeSysctl(t, r.proc, "vm/overcommit_memory", "0")
	writeSysctl(t, r.proc, "kernel/panic", "0")
	mkdir(t, filepath.Join(r.cgroup, "memory", "system.slice"))
	mkdir(t, r.prefix+"/var/lib/kubelet")
	before, err := snapshotHost(r)
	if err != nil {
		t.Fatal(err)
	}
	if left := checkHost(r, before, work); len(left) != 0 {
		t.Fatalf("clean host: leftovers %q", left)
	}

	// An empty work directory (its contents were on the child's tmpfs) is
	// no leftover.
	mkdir(t, work)
	if left := checkHost(r, before, work); len(left) != 0 {
		t.Fatalf("empty work directory: leftovers %q", left)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Fatalf("empty work directory still there: %v", err)
	}

	// After a run that leaked one of each.
	writeSysctl(t, r.proc, "vm/overcommit_memory", "1")
	writeProc(t, r.proc, "200", "/cache/containerd-shim-runc-v2\x00-address\x00"+work+"/node/containerd/containerd.sock\x00")
	mine := CgroupRootPrefix + strconv.Itoa(os.Getpid()) + "-2"
	mkdir(t, filepath.Join(r.cgroup, "memory", mine, "kubepods"))
	// Another run's (its outer process is PID 1 here): not this run's to
	// report or remove.
	mkdir(t, filepath.Join(r.cgroup, "memory", CgroupRootPrefix+"1-3"))
	mkdir(t, r.prefix+"/run/containerd")
	mkdir(t, work)
	if err := os.WriteFile(filepath.Join(work, "token.pin"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	left := checkHost(r, before, work)
	want := []string{
		"process 200 still running: /cache/containerd-shim-runc-v2 -address " + work,
		"cgroup " + filepath.Join(r.cgroup, "memory", mine),
		"host path /run/containerd (absent before the node ran)",
		"work directory " + work,
		"kernel setting vm/overcommit_memory is 1, was 0",
	}
	got := strings.Join(left, "\n")
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("leftovers %q do not name %q", left, w)
		}
	}
	if strings.Contains(got, "sshd") || strings.Contains(got, "system.slice") || strings.Contains(got, "/var/lib/kubelet") || strings.Contains(got, CgroupRootPrefix+"1-3") {
		t.Errorf("leftovers %q name what was there before", left)
	}
	// The check removes what it can, so the next run starts clean.
	if _, err := os.Stat(filepath.Join(r.cgroup, "memory", mine)); !os.IsNotExist(err) {
		t.Errorf("leaked cgroup still there: %v", err)
	}
	if _, err := os.Stat(work); !os.IsNotExist(err) {
		t.Errorf("work directory still there: %v", err)
	}
}

func writeProc(t *testing.T, proc, pid, cmdline string) {
	t.Helper()
	mkdir(t, filepath.Join(proc, pid))
	if err := os.WriteFile(filepath.Join(proc, pid, "cmdline"), []byte(cmdline), 0o644); err != nil {
		t.Fatal(err)
	}
}

func mkdir(t *testing.T, d string) {
	t.Helper()
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
}

// A killed run's cgroups are swept only when its outer process is gone.
func TestOwnerAlive(t *testing.T) {
	if !ownerAlive(CgroupRootPrefix + strconv.Itoa(os.Getpid()) + "-5") {
		t.Error("this process's cgroup counted as a dead run's")
	}
	if ownerAlive(CgroupRootPrefix+"999999999-5") || ownerAlive(CgroupRootPrefix+"0-5") || ownerAlive(CgroupRootPrefix+"x") {
		t.Error("a cgroup of no live run counted as alive")
	}
}

func writeSysctl(t *testing.T, proc, name, v string) {
	t.Helper()
	p := filepath.Join(proc, "sys", name)
	mkdir(t, filepath.Dir(p))
	if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
