// Package node runs a real Kubernetes node for keyward's tests: kubelet,
// containerd and runc, built from their Go modules by `make node`, against
// the control plane of testsupport/controlplane.
//
// The node runs inside private namespaces that the test binary enters by
// re-executing itself (RunInPrivateNamespaces, from TestMain): a network
// namespace where the node's address is a /32 on loopback, so no test packet
// can leave the machine; a mount namespace with tmpfs over the host folders
// kubelet and containerd write; a PID namespace whose end kills whatever is
// left. Its pod cgroups live under a cgroup root of its own
// (CgroupRootPrefix), removed by Stop, and the parent checks the host after.
//
// Without Options.PodSubnet there is no CNI network: pods run with
// hostNetwork (the node is NotReady for the network, which does not stop
// hostNetwork pods). The node runs no scheduler: pods name the node in
// spec.nodeName unless the test starts kube-scheduler
// (controlplane.StartScheduler), as node-tests/install does.
package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/keyward/keyward/testsupport/controlplane"
)

// EnvKeepLogs names a directory that receives kubelet.log and
// containerd.log when the node stops (the work directory goes).
const EnvKeepLogs = "KEYWARD_NODE_LOGS"

// CgroupRootPrefix starts the name of the cgroup every hierarchy gets for
// the node's pods (kubelet's cgroupRoot).
const CgroupRootPrefix = "keyward-node-"

// Options configure Start.
type Options struct {
	// Dir is the node's work directory (created if missing). It must not lie
	// on overlayfs for containerd's snapshots; Start mounts a tmpfs for them.
	Dir string
	// Name is the Node's name.
	Name string
	// IP is the node's address (NodeIP() by default).
	IP string
	// Kubeconfig is kubelet's client kubeconfig when it already has a
	// client certificate. With BootstrapKubeconfig set instead (or as
	// well), kubelet writes Kubeconfig itself after TLS bootstrap.
	Kubeconfig string
	// BootstrapKubeconfig is a kubeconfig with a bootstrap token, for
	// kubelet's TLS bootstrap (its client certificate from a CSR).
	BootstrapKubeconfig string
	// CertDir is kubelet's --cert-dir (default Dir/kubelet/pki); the
	// install test uses kubeadm's /var/lib/kubelet/pki, which the chart's
	// node agent mounts by default.
	CertDir string
	// ClientCAFile verifies client certificates presented to kubelet (the
	// apiserver's kubelet client certificate).
	ClientCAFile string
	// ServerTLSBootstrap makes kubelet ask for its serving certificate with
	// a kubernetes.io/kubelet-serving CSR instead of signing its own.
	ServerTLSBootstrap bool
	// SandboxImage is the pause image (pre-loaded with ImageArchives).
	SandboxImage string
	// ImageArchives are image tarballs imported into containerd's k8s.io
	// namespace before kubelet starts.
	ImageArchives []string
	// Registries configure containerd's hosts directory: a registry
	// host[:port] as image references name it.
	Registries map[string]Registry
	// CredentialProviderConfig and CredentialProviderBinDir are kubelet's
	// --image-credential-provider-config and -bin-dir.
	CredentialProviderConfig, CredentialProviderBinDir string
	// KubeletConfig, when set, edits kubelet's configuration (the
	// KubeletConfiguration as a JSON object) before it is written.
	KubeletConfig func(cfg map[string]any)
	// PodSubnet, when set, gives pods a network of their own: containerd
	// runs the CNI plugins `make node` builds (bridge cni0 as the pods'
	// gateway, host-local addresses from PodSubnet, no masquerading: the
	// namespace has nowhere to route to). Unset, only hostNetwork pods run
	// (the node stays NotReady for the network).
	PodSubnet string
	// Verbosity is kubelet's --v (default 2).
	Verbosity int
}

// Registry is how containerd reaches one registry.
type Registry struct {
	// URL is the registry's endpoint, http:// or https://.
	URL string
	// CAFile, when set, is the CA containerd trusts on the connections of
	// this host: the registry's, and its token realm's.
	CAFile string
}

// Node is a running kubelet + containerd.
type Node struct {
	Name, IP, Dir string
	// KubeletLog and ContainerdLog are the processes' log files.
	KubeletLog, ContainerdLog string

	bins       Binaries
	socket     string
	cgroupRoot string
	cgroups    []string
	containerd *controlplane.Process
	kubelet    *controlplane.Process
}

// Start runs containerd, imports the images, and starts kubelet. It returns
// once kubelet runs; whether it has registered its Node (a bootstrap needs
// its CSR approved first) is the caller's to wait for.
func Start(ctx context.Context, o Options) (n *Node, err error) {
	if !Inside() {
		return nil, errors.New("testsupport/node: Start runs only inside the private namespaces (call RunInPrivateNamespaces from TestMain)")
	}
	bins, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	if o.IP == "" {
		o.IP = NodeIP()
	}
	if o.Verbosity == 0 {
		o.Verbosity = 2
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	n = &Node{Name: o.Name, IP: o.IP, Dir: o.Dir, bins: bins,
		KubeletLog: filepath.Join(o.Dir, "kubelet.log"), ContainerdLog: filepath.Join(o.Dir, "containerd.log")}
	defer func() {
		if err != nil {
			_ = n.Stop()
		}
	}()
	if err := n.startContainerd(ctx, o); err != nil {
		return n, err
	}
	for _, a := range o.ImageArchives {
		if out, err := n.Ctr(ctx, "images", "import", "--platform", "linux/"+goarch(), a); err != nil {
			return n, fmt.Errorf("ctr images import %s: %v: %s", a, err, out)
		}
	}
	if err := n.makeCgroupRoot(); err != nil {
		return n, err
	}
	if err := n.startKubelet(o); err != nil {
		return n, err
	}
	return n, nil
}

func (n *Node) startContainerd(ctx context.Context, o Options) error {
	cdir := filepath.Join(n.Dir, "containerd")
	if err := os.MkdirAll(cdir, 0o755); err != nil {
		return err
	}
	// overlayfs cannot take its upper layers from an overlayfs (the
	// machine's root often is one): the snapshots live on a tmpfs, which
	// goes with the mount namespace if Stop never runs.
	if err := syscall.Mount("tmpfs", cdir, "tmpfs", 0, "mode=755"); err != nil {
		return fmt.Errorf("mounting tmpfs for containerd's root: %w", err)
	}
	n.socket = filepath.Join(cdir, "containerd.sock")
	certsD := filepath.Join(cdir, "certs.d")
	for host, r := range o.Registries {
		d := filepath.Join(certsD, host)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", r.URL, r.URL)
		if r.CAFile != "" {
			hosts += fmt.Sprintf("  ca = %q\n", r.CAFile)
		}
		if err := os.WriteFile(filepath.Join(d, "hosts.toml"), []byte(hosts), 0o644); err != nil {
			return err
		}
	}
	cniBin, cniConf := filepath.Join(cdir, "cni-bin"), filepath.Join(cdir, "cni-conf")
	if o.PodSubnet != "" {
		var err error
		if cniBin, err = FindCNIPlugins(); err != nil {
			return err
		}
		if err := os.MkdirAll(cniConf, 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(cniConf, "10-keyward-node.conflist"), []byte(fmt.Sprintf(cniConfList, o.PodSubnet)), 0o644); err != nil {
			return err
		}
	}
	cfg := fmt.Sprintf(containerdConfig, filepath.Join(cdir, "root"), filepath.Join(cdir, "state"), n.socket, n.socket+".ttrpc",
		o.SandboxImage, certsD, n.bins.Runc, cniBin, cniConf)
	cfgPath := filepath.Join(n.Dir, "containerd.toml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return err
	}
	p, err := controlplane.StartProcess("containerd", n.bins.Containerd, []string{"--config", cfgPath, "--log-level", "info"},
		n.ContainerdLog, "PATH="+filepath.Dir(n.bins.Shim)+":"+os.Getenv("PATH"))
	if err != nil {
		return err
	}
	n.containerd = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		if out, err := n.Ctr(ctx, "version"); err == nil {
			return nil
		} else if p.Exited() {
			return p.ExitError()
		} else if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("containerd did not answer on %s within 30s: %v: %s; last lines of %s:\n%s", n.socket, err, out, n.ContainerdLog, controlplane.Tail(n.ContainerdLog, 20))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// cniConfList is the pods' network: a bridge that is their gateway,
// addresses from the subnet, a default route through the bridge.
const cniConfList = `{
  "cniVersion": "1.0.0",
  "name": "keyward-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}}
  ]
}
`

// containerdConfig: root, state, grpc and ttrpc sockets, sandbox image,
// registry hosts dir, runc, CNI bin and conf dirs. NRI is off (it would open
// /var/run/nri); OOM score adjustments are limited to containerd's own,
// since the machine's root may lack CAP_SYS_RESOURCE (runc fails with
// "can't get final child's PID from pipe: EOF" otherwise).
const containerdConfig = `version = 3
root = %q
state = %q
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = %q

[ttrpc]
  address = %q

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = %q
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = %q

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [%q]
    conf_dir = %q

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
`

// Ctr runs containerd's ctr against this node's containerd in the k8s.io
// namespace (the one kubelet's CRI uses).
func (n *Node) Ctr(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return exec.CommandContext(ctx, n.bins.Ctr, append([]string{"--address", n.socket, "--namespace", "k8s.io"}, args...)...).CombinedOutput()
}

// makeCgroupRoot creates kubelet's cgroupRoot in every hierarchy; kubelet
// refuses a root that does not exist. A cpuset cgroup takes its CPUs and
// memory nodes from the parent, or no task could join it.
func (n *Node) makeCgroupRoot() error {
	n.cgroupRoot = "/" + CgroupRootPrefix + cgroupOwner() + "-" + fmt.Sprint(time.Now().UnixNano()%1e9)
	hier, err := os.ReadDir(cgroupBase)
	if err != nil {
		return err
	}
	for _, h := range hier {
		base := filepath.Join(cgroupBase, h.Name())
		if fi, err := os.Lstat(base); err != nil || !fi.IsDir() {
			continue // cpu,cpuacct style symlinks
		}
		d := base + n.cgroupRoot
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("creating the node's cgroup %s: %w", d, err)
		}
		n.cgroups = append(n.cgroups, d)
		if h.Name() == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(base, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("copying %s into %s: %w", f, d, err)
				}
			}
		}
	}
	return nil
}

func (n *Node) startKubelet(o Options) error {
	kdir := filepath.Join(n.Dir, "kubelet")
	certDir := o.CertDir
	if certDir == "" {
		certDir = filepath.Join(kdir, "pki")
	}
	for _, d := range []string{kdir, certDir, filepath.Join(n.Dir, "pod-logs"), filepath.Join(n.Dir, "volume-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	cfg := map[string]any{
		"apiVersion": "kubelet.config.k8s.io/v1beta1",
		"kind":       "KubeletConfiguration",
		"address":    n.IP,
		"port":       10250,
		// 0 turns the read-only port and the healthz endpoint off.
		"readOnlyPort": 0,
		"healthzPort":  0,
		"authentication": map[string]any{
			"anonymous": map[string]any{"enabled": false},
			"webhook":   map[string]any{"enabled": true},
			"x509":      map[string]any{"clientCAFile": o.ClientCAFile},
		},
		"authorization":            map[string]any{"mode": "Webhook"},
		"cgroupDriver":             "cgroupfs",
		"cgroupRoot":               n.cgroupRoot,
		"cgroupsPerQOS":            true,
		"failCgroupV1":             false,
		"failSwapOn":               false,
		"containerRuntimeEndpoint": "unix://" + n.socket,
		"podLogsDir":               filepath.Join(n.Dir, "pod-logs"),
		"volumePluginDir":          filepath.Join(n.Dir, "volume-plugins"),
		"evictionHard": map[string]string{
			"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%",
		},
		"imageGCHighThresholdPercent":   100,
		"imageGCLowThresholdPercent":    99,
		"oomScoreAdj":                   0,
		"serverTLSBootstrap":            o.ServerTLSBootstrap,
		"rotateCertificates":            o.BootstrapKubeconfig != "",
		"resolvConf":                    "",
		"clusterDomain":                 "cluster.local",
		"registerNode":                  true,
		"localStorageCapacityIsolation": false,
		// Check, never write, the machine-wide kernel settings; the
		// namespace shows kubelet the values it wants (SetUpNamespaces).
		"protectKernelDefaults": true,
	}
	if o.KubeletConfig != nil {
		o.KubeletConfig(cfg)
	}
	b, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	cfgPath := filepath.Join(n.Dir, "kubelet-config.json")
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return err
	}
	args := []string{
		"--config=" + cfgPath,
		"--root-dir=" + kdir,
		"--cert-dir=" + certDir,
		"--hostname-override=" + n.Name,
		"--node-ip=" + n.IP,
		"--kubeconfig=" + o.Kubeconfig,
		fmt.Sprintf("--v=%d", o.Verbosity),
	}
	if o.BootstrapKubeconfig != "" {
		args = append(args, "--bootstrap-kubeconfig="+o.BootstrapKubeconfig)
	}
	if o.CredentialProviderConfig != "" {
		args = append(args, "--image-credential-provider-config="+o.CredentialProviderConfig,
			"--image-credential-provider-bin-dir="+o.CredentialProviderBinDir)
	}
	p, err := controlplane.StartProcess("kubelet", n.bins.Kubelet, args, n.KubeletLog)
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// KubeletExited reports whether kubelet has ended, with the tail of its log.
func (n *Node) KubeletExited() error {
	if n.kubelet != nil && n.kubelet.Exited() {
		return n.kubelet.ExitError()
	}
	return nil
}

// Stop stops kubelet and containerd, kills the containers and their shims,
// unmounts and removes the node's cgroups and work directory. It returns an error naming
// whatever it could not remove.
func (n *Node) Stop() error {
	var errs []error
	began := time.Now()
	phase := func(what string) {
		if os.Getenv("KEYWARD_NODE_DEBUG") != "" {
			fmt.Fprintf(os.Stderr, "node: %s after %s\n", what, time.Since(began).Round(time.Millisecond))
		}
	}
	if n.kubelet != nil {
		n.kubelet.Stop(10 * time.Second)
	}
	phase("kubelet stopped")
	// containerd leaves its shims and their containers running when it
	// stops (by design, for upgrades): they go through the node's cgroups
	// and the shims' command lines below.
	if n.containerd != nil {
		n.containerd.Stop(10 * time.Second)
	}
	phase("containerd stopped")
	// Whatever still runs in the node's cgroups (a container whose shim
	// died) is killed through them.
	for _, c := range n.cgroups {
		killCgroupTree(c)
	}
	killShims(n.socket)
	phase("processes killed")
	for _, c := range n.cgroups {
		if err := RemoveCgroupTree(c); err != nil {
			errs = append(errs, err)
		}
	}
	phase("cgroups removed")
	if keep := os.Getenv(EnvKeepLogs); keep != "" {
		_ = os.MkdirAll(keep, 0o755)
		for _, f := range []string{n.KubeletLog, n.ContainerdLog} {
			if b, err := os.ReadFile(f); err == nil {
				_ = os.WriteFile(filepath.Join(keep, filepath.Base(f)), b, 0o644)
			}
		}
	}
	// kubelet's volume mounts (projected volumes are tmpfs) and
	// containerd's, deepest first, then the node's own.
	for _, m := range mountsUnder(n.Dir) {
		if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", m, err))
		}
	}
	if err := os.RemoveAll(n.Dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) []string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil || dir == "" {
		return nil
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		// Field 5 is the mount point, with spaces and the like octal-escaped.
		mp := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	sort.Slice(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

// killCgroupTree SIGKILLs every process in the cgroup dir and below.
func killCgroupTree(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, f := range strings.Fields(string(b)) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

// killShims SIGKILLs containerd shims started for this node's containerd
// (their command line names its socket).
func killShims(socket string) {
	if socket == "" {
		return
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		b, err := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), "containerd-shim") || !strings.Contains(string(b), socket) {
			continue
		}
		var pid int
		if _, err := fmt.Sscan(p.Name(), &pid); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
