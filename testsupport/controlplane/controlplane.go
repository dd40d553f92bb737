// Package controlplane starts a real kube-apiserver and etcd on loopback for
// keyward's tests and demo: Node,RBAC authorization, the NodeRestriction
// admission plugin, certificates.k8s.io v1 and v1beta1, and x509 client
// certificates for any identity a test needs (admin, the signer's service
// account, nodes).
//
// A ControlPlane must be stopped with Stop; RunMain does that for a test
// binary, also when it is interrupted.
package controlplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Options configure Start. The zero value is usable.
type Options struct {
	// ParentDir is where the work directory is created; empty means the
	// system temp dir.
	ParentDir string
	// KeepLogsIn, when set, is a directory that receives etcd.log and
	// kube-apiserver.log when the control plane stops.
	KeepLogsIn string
	// ExtraAPIServerFlags are appended to kube-apiserver's command line.
	ExtraAPIServerFlags []string
	// StartTimeout bounds the wait for both processes to be ready
	// (default 90s).
	StartTimeout time.Duration
	// KubeletClient gives kube-apiserver a client certificate for kubelets
	// (user kube-apiserver-kubelet-client in system:masters, which kubelet's
	// webhook authorization allows) and makes it dial a Node's InternalIP,
	// so that logs and exec reach a real kubelet (testsupport/node).
	KubeletClient bool
	// Address, when set, is where kube-apiserver listens and what it
	// advertises instead of 127.0.0.1, with SecurePort instead of a free
	// port: the install test (node-tests/install) puts it on the
	// kubernetes Service's ClusterIP (10.0.0.1:443) inside the node's
	// network namespace, so that pods reach the apiserver through the
	// in-cluster configuration with no kube-proxy. Its serving
	// certificate also names the Service's DNS names.
	Address    string
	SecurePort int
	// OnSignal, when set, runs when RunMain is interrupted (SIGINT,
	// SIGTERM), before it stops the control plane: what the tests started
	// on top of it (a node) stops first.
	OnSignal func()
}

// ControlPlane is a running etcd + kube-apiserver pair.
type ControlPlane struct {
	// URL is the apiserver's https endpoint: 127.0.0.1 or Options.Address.
	URL string
	// Dir is the work directory; it is removed by Stop.
	Dir string
	// StartDuration is how long Start took until /readyz answered ok.
	StartDuration time.Duration

	opts      Options
	pki       *pki
	etcd      *process
	apiserver *process
	admin     *rest.Config
	stopOnce  sync.Once
	// etcdURL is etcd's client URL, for its /health after a restart.
	etcdURL string
	// restartMu keeps restarts and Stop from racing on the processes.
	restartMu sync.Mutex
}

// Start runs etcd and kube-apiserver and waits until the apiserver is ready.
// It retries a few times when a start loses a race for its loopback ports.
func Start(ctx context.Context, opts Options) (*ControlPlane, error) {
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 90 * time.Second
	}
	apiserverBin, err := findKubeAPIServer()
	if err != nil {
		return nil, err
	}
	etcdBin, err := findEtcd()
	if err != nil {
		return nil, err
	}
	var lastErr error
	for attempt := 1; attempt <= 3; attempt++ {
		cp, err := start(ctx, opts, apiserverBin, etcdBin)
		if err == nil {
			return cp, nil
		}
		lastErr = err
		if ctx.Err() != nil || !errors.Is(err, errExitedEarly) {
			break
		}
	}
	return nil, lastErr
}

var errExitedEarly = errors.New("exited early")

func start(ctx context.Context, opts Options, apiserverBin, etcdBin string) (cp *ControlPlane, err error) {
	began := time.Now()
	dir, err := makeWorkDir(opts.ParentDir)
	if err != nil {
		return nil, err
	}
	cp = &ControlPlane{Dir: dir, opts: opts}
	defer func() {
		if err != nil {
			cp.Stop()
		}
	}()
	cp.pki, err = newPKI()
	if err != nil {
		return cp, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return cp, err
	}
	etcdClient, etcdPeer, apiPort := ports[0], ports[1], ports[2]
	address := "127.0.0.1"
	if opts.Address != "" {
		address = opts.Address
	}
	if opts.SecurePort != 0 {
		apiPort = opts.SecurePort
	}
	ctx, cancel := context.WithTimeout(ctx, opts.StartTimeout)
	defer cancel()

	// etcd
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(etcdClient)
	cp.etcdURL = etcdURL
	peerURL := "http://127.0.0.1:" + strconv.Itoa(etcdPeer)
	cp.etcd, err = startProcess("etcd", etcdBin, []string{
		"--name=keyward-test",
		"--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + etcdURL,
		"--advertise-client-urls=" + etcdURL,
		"--listen-peer-urls=" + peerURL,
		"--initial-advertise-peer-urls=" + peerURL,
		"--initial-cluster=keyward-test=" + peerURL,
		"--log-level=warn",
	}, filepath.Join(dir, "etcd.log"))
	if err != nil {
		return cp, err
	}
	if err := waitHTTP(ctx, cp.etcd, http.DefaultClient, etcdURL+"/health"); err != nil {
		return cp, err
	}

	// kube-apiserver
	certDir := filepath.Join(dir, "pki")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		return cp, err
	}
	hosts := []string{"127.0.0.1", "localhost"}
	if address != "127.0.0.1" {
		hosts = append(hosts, address, "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local")
	}
	serving, err := cp.pki.issue("kube-apiserver", nil, hosts)
	if err != nil {
		return cp, err
	}
	files := map[string][]byte{"ca.crt": cp.pki.caPEM, "serving.crt": serving.CertPEM, "serving.key": serving.KeyPEM}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
			return cp, err
		}
	}
	saKey, saPub, err := writeServiceAccountKeys(certDir)
	if err != nil {
		return cp, err
	}
	cp.URL = "https://" + net.JoinHostPort(address, strconv.Itoa(apiPort))
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + address,
		"--advertise-address=" + address,
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(apiPort),
		"--cert-dir=" + certDir,
		"--tls-cert-file=" + filepath.Join(certDir, "serving.crt"),
		"--tls-private-key-file=" + filepath.Join(certDir, "serving.key"),
		"--client-ca-file=" + filepath.Join(certDir, "ca.crt"),
		"--service-account-issuer=" + cp.URL,
		"--service-account-key-file=" + saPub,
		"--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=Node,RBAC",
		"--enable-admission-plugins=NodeRestriction",
		"--runtime-config=certificates.k8s.io/v1beta1=true",
		"--allow-privileged=true",
		"--enable-priority-and-fairness=false",
		"--profiling=false",
		"--v=1",
	}
	if opts.KubeletClient {
		kc, err := cp.pki.issue("kube-apiserver-kubelet-client", []string{"system:masters"}, nil)
		if err != nil {
			return cp, err
		}
		for name, data := range map[string][]byte{"kubelet-client.crt": kc.CertPEM, "kubelet-client.key": kc.KeyPEM} {
			if err := os.WriteFile(filepath.Join(certDir, name), data, 0o600); err != nil {
				return cp, err
			}
		}
		args = append(args,
			"--kubelet-client-certificate="+filepath.Join(certDir, "kubelet-client.crt"),
			"--kubelet-client-key="+filepath.Join(certDir, "kubelet-client.key"),
			"--kubelet-preferred-address-types=InternalIP")
	}
	args = append(args, opts.ExtraAPIServerFlags...)
	cp.apiserver, err = startProcess("kube-apiserver", apiserverBin, args, filepath.Join(dir, "kube-apiserver.log"))
	if err != nil {
		return cp, err
	}
	admin, err := cp.pki.issue("keyward-test-admin", []string{"system:masters"}, nil)
	if err != nil {
		return cp, err
	}
	cp.admin = cp.restConfig(admin)
	if err := cp.waitAPIServerReady(ctx); err != nil {
		return cp, err
	}
	cp.StartDuration = time.Since(began)
	return cp, nil
}

func (cp *ControlPlane) waitAPIServerReady(ctx context.Context) error {
	readyClient, err := rest.HTTPClientFor(cp.admin)
	if err != nil {
		return fmt.Errorf("building readiness client: %w", err)
	}
	return waitHTTP(ctx, cp.apiserver, readyClient, cp.URL+"/readyz")
}

// RestartAPIServer stops kube-apiserver (SIGTERM, SIGKILL after 10s) and
// starts it again with the same flags on the same port, and waits until
// its /readyz answers ok (bounded by ctx and Options.StartTimeout). Its
// clients see it go away and come back at the same URL, as in a rolling
// upgrade of a single control-plane node. It returns how long the
// apiserver was away.
func (cp *ControlPlane) RestartAPIServer(ctx context.Context) (time.Duration, error) {
	return cp.restart(ctx, &cp.apiserver, cp.waitAPIServerReady)
}

// RestartEtcd stops etcd (SIGTERM, SIGKILL after 10s) and starts it again
// with the same flags, ports and data directory, so that nothing stored is
// lost; it waits until etcd's /health and then kube-apiserver's /readyz
// answer ok (the apiserver reconnects by itself). It returns how long
// until the apiserver was ready again.
func (cp *ControlPlane) RestartEtcd(ctx context.Context) (time.Duration, error) {
	return cp.restart(ctx, &cp.etcd, func(ctx context.Context) error {
		if err := waitHTTP(ctx, cp.etcd, http.DefaultClient, cp.etcdURL+"/health"); err != nil {
			return err
		}
		return cp.waitAPIServerReady(ctx)
	})
}

// restart restarts *p and waits until ready answers.
func (cp *ControlPlane) restart(ctx context.Context, p **process, ready func(context.Context) error) (time.Duration, error) {
	cp.restartMu.Lock()
	began := time.Now()
	next, err := (*p).restart(10 * time.Second)
	if err == nil {
		*p = next
	}
	// Not held while waiting: a Stop (from a signal handler) meanwhile
	// ends the new process, and the wait returns on its exit.
	cp.restartMu.Unlock()
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, cp.opts.StartTimeout)
	defer cancel()
	if err := ready(ctx); err != nil {
		return 0, fmt.Errorf("after restarting %s: %w", next.name, err)
	}
	return time.Since(began), nil
}

// waitHTTP polls url until it answers 200, the process exits, or ctx ends.
func waitHTTP(ctx context.Context, p *process, client *http.Client, url string) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last string
	for {
		if p.exited() {
			return fmt.Errorf("%w: %w", errExitedEarly, p.exitError())
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s at %s (last answer: %s): %w; last lines of %s:\n%s",
				p.name, url, last, ctx.Err(), p.logPath, tail(p.logPath, 20))
		case <-tick.C:
		}
	}
}

func (cp *ControlPlane) restConfig(kp keyPair) *rest.Config {
	return &rest.Config{
		Host: cp.URL,
		TLSClientConfig: rest.TLSClientConfig{
			CAData:   cp.pki.caPEM,
			CertData: kp.CertPEM,
			KeyData:  kp.KeyPEM,
		},
		QPS:   1000,
		Burst: 2000,
	}
}

// CAFile is the path of the control plane's CA certificate: it signed the
// apiserver's serving certificate and every client certificate the control
// plane issues, and kube-apiserver's --client-ca-file names it.
func (cp *ControlPlane) CAFile() string { return filepath.Join(cp.Dir, "pki", "ca.crt") }

// AdminConfig is a client config for a system:masters user.
func (cp *ControlPlane) AdminConfig() *rest.Config { return rest.CopyConfig(cp.admin) }

// AdminClient is a clientset for a system:masters user.
func (cp *ControlPlane) AdminClient() kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(cp.AdminConfig())
}

// UserConfig issues a client certificate for user in groups and returns a
// client config that authenticates with it.
func (cp *ControlPlane) UserConfig(user string, groups ...string) (*rest.Config, error) {
	kp, err := cp.pki.issue(user, groups, nil)
	if err != nil {
		return nil, err
	}
	return cp.restConfig(kp), nil
}

// NodeConfig is a client config for the node identity system:node:<name>,
// the identity NodeRestriction and the Node authorizer judge.
func (cp *ControlPlane) NodeConfig(nodeName string) (*rest.Config, error) {
	return cp.UserConfig("system:node:"+nodeName, "system:nodes", "system:authenticated")
}

// ServiceAccountConfig is a client config that authenticates as the service
// account namespace/name, so RBAC bindings to that service account (such as
// the ones shipped in deploy/) apply to it unchanged.
func (cp *ControlPlane) ServiceAccountConfig(namespace, name string) (*rest.Config, error) {
	return cp.UserConfig("system:serviceaccount:"+namespace+":"+name,
		"system:serviceaccounts", "system:serviceaccounts:"+namespace, "system:authenticated")
}

// PIDs returns the process IDs of kube-apiserver and etcd as they run now
// (a restart changes them), e.g. to read their CPU time from /proc.
func (cp *ControlPlane) PIDs() (apiserver, etcd int) {
	cp.restartMu.Lock()
	defer cp.restartMu.Unlock()
	return cp.apiserver.cmd.Process.Pid, cp.etcd.cmd.Process.Pid
}

// Stop terminates kube-apiserver and etcd and removes the work directory. It
// is safe to call more than once and from a signal handler.
func (cp *ControlPlane) Stop() {
	cp.stopOnce.Do(func() {
		cp.restartMu.Lock()
		defer cp.restartMu.Unlock()
		cp.apiserver.stop(10 * time.Second)
		cp.etcd.stop(10 * time.Second)
		if cp.opts.KeepLogsIn != "" {
			_ = os.MkdirAll(cp.opts.KeepLogsIn, 0o755)
			for _, name := range []string{"etcd.log", "kube-apiserver.log"} {
				if b, err := os.ReadFile(filepath.Join(cp.Dir, name)); err == nil {
					_ = os.WriteFile(filepath.Join(cp.opts.KeepLogsIn, name), b, 0o644)
				}
			}
		}
		os.RemoveAll(cp.Dir)
	})
}

// Runner is what RunMain needs of a *testing.M.
type Runner interface{ Run() int }

// RunMain starts a control plane, hands it to setup, runs m and stops the
// control plane, also when SIGINT or SIGTERM arrives mid-run. It returns the
// exit code for os.Exit; a setup error skips m and returns 1. Call it from
// TestMain.
func RunMain(m Runner, opts Options, setup func(*ControlPlane) error) int {
	if opts.KeepLogsIn == "" {
		opts.KeepLogsIn = os.Getenv("KEYWARD_CONTROLPLANE_LOGS")
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	var mu sync.Mutex
	var running *ControlPlane
	finished := make(chan struct{})
	defer close(finished)
	go func() {
		select {
		case s := <-sigs:
			cancel() // a Start under way gives up and cleans up after itself
			mu.Lock()
			cp := running
			mu.Unlock()
			if cp != nil {
				if opts.OnSignal != nil {
					opts.OnSignal()
				}
				fmt.Fprintf(os.Stderr, "%v: stopping control plane\n", s)
				cp.Stop()
				os.Exit(130)
			}
		case <-finished:
		}
	}()

	cp, err := Start(ctx, opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "starting control plane: %v\n", err)
		return 1
	}
	mu.Lock()
	running = cp
	mu.Unlock()
	defer cp.Stop()
	if ctx.Err() != nil { // interrupted just as Start returned
		return 130
	}
	fmt.Fprintf(os.Stderr, "control plane %s ready in %s\n", cp.URL, cp.StartDuration.Round(time.Millisecond))
	if err := setup(cp); err != nil {
		fmt.Fprintf(os.Stderr, "setting up control plane: %v\n", err)
		return 1
	}
	return m.Run()
}
