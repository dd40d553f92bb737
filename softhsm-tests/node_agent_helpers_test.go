package softhsmtests

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/agent"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	authnv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// ---- Bootstrap tokens (KEP-266's bootstrap credentials) ----

// bootstrapExtraGroup is the extra group the test's bootstrap tokens carry
// (kubeadm's is system:bootstrappers:kubeadm:default-node-token).
const bootstrapExtraGroup = "system:bootstrappers:keyward-test"

// bootstrapToken is a bootstrap token: <id>.<secret>.
type bootstrapToken struct{ ID, Secret string }

func (b bootstrapToken) String() string { return b.ID + "." + b.Secret }

// User is the name the apiserver's bootstrap token authenticator gives it.
func (b bootstrapToken) User() string { return "system:bootstrap:" + b.ID }

// randomLowerAlnum returns n characters of [a-z0-9], the bootstrap token
// alphabet.
func randomLowerAlnum(t testing.TB, n int) string {
	t.Helper()
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// newBootstrapToken creates a bootstrap token Secret in kube-system as
// kubeadm does (type bootstrap.kubernetes.io/token, usable for
// authentication, extra group bootstrapExtraGroup, expiring in an hour),
// removed when the test ends. The apiserver runs with
// --enable-bootstrap-token-auth (main_test.go).
func newBootstrapToken(t *testing.T, ctx context.Context) bootstrapToken {
	t.Helper()
	tok := bootstrapToken{ID: randomLowerAlnum(t, 6), Secret: randomLowerAlnum(t, 16)}
	admin := cp.AdminClient()
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + tok.ID, Namespace: metav1.NamespaceSystem},
		Type:       corev1.SecretTypeBootstrapToken,
		StringData: map[string]string{
			"description":                    "keyward node agent test " + t.Name(),
			"token-id":                       tok.ID,
			"token-secret":                   tok.Secret,
			"expiration":                     time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
			"usage-bootstrap-authentication": "true",
			"auth-extra-groups":              bootstrapExtraGroup,
		},
	}
	if _, err := admin.CoreV1().Secrets(metav1.NamespaceSystem).Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating bootstrap token Secret %s: %v", s.Name, err)
	}
	t.Cleanup(func() {
		_ = admin.CoreV1().Secrets(metav1.NamespaceSystem).Delete(context.Background(), s.Name, metav1.DeleteOptions{})
	})
	return tok
}

// bindBootstrappers grants group system:bootstrappers what kubeadm grants
// it (`kubeadm init` phase bootstrap-token): creating CSRs
// (system:node-bootstrapper) and having kubelet client CSRs auto-approved
// (certificatesigningrequests:nodeclient), until the test ends.
func bindBootstrappers(t *testing.T, ctx context.Context) {
	t.Helper()
	admin := cp.AdminClient()
	for _, role := range []string{"system:node-bootstrapper", "system:certificates.k8s.io:certificatesigningrequests:nodeclient"} {
		name := uniqueName(t, "bootstrappers")
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:bootstrappers"}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
}

// tokenConfig is a client config for server (the test apiserver's CA)
// authenticating with tok.
func tokenConfig(server string, tok bootstrapToken) *rest.Config {
	return &rest.Config{Host: server, BearerToken: tok.String(),
		TLSClientConfig: rest.TLSClientConfig{CAData: cp.AdminConfig().CAData}}
}

// writeBootstrapKubeconfig writes the kubeconfig a node is provisioned
// with for TLS bootstrap: server, the cluster CA, the token.
func writeBootstrapKubeconfig(t *testing.T, server string, tok bootstrapToken) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "bootstrap-kubeconfig")
	if err := controlplane.WriteKubeconfig(tokenConfig(server, tok), "tls-bootstrap-token-user", path); err != nil {
		t.Fatal(err)
	}
	return path
}

// writeNodeKubeconfig writes the node identity's kubeconfig (a client
// certificate for system:node:<node> from the test CA, as kubelet's
// kubeconfig holds) pointing at server.
func writeNodeKubeconfig(t *testing.T, server, node string) string {
	t.Helper()
	cfg, err := cp.NodeConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Host = server
	path := filepath.Join(t.TempDir(), "node-kubeconfig")
	if err := controlplane.WriteKubeconfig(cfg, "system:node:"+node, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// waitAuthenticatesAs waits until cfg authenticates as user (the bootstrap
// token authenticator reads Secrets through an informer, so a new token
// takes a moment) and returns what a SelfSubjectReview says.
func waitAuthenticatesAs(t *testing.T, ctx context.Context, cfg *rest.Config, user string) authnv1.UserInfo {
	t.Helper()
	cs := clientFor(t, cfg, nil)
	var got authnv1.UserInfo
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			last = err
			return false, nil
		}
		got = r.Status.UserInfo
		return got.Username == user, nil
	})
	if err != nil {
		t.Fatalf("never authenticated as %s: %v (last: %+v, %v)", user, err, got, last)
	}
	return got
}

// ---- A TCP proxy in front of the apiserver that can be stopped ----

// tcpProxy forwards TCP connections from Addr to a target. Stop refuses new
// connections and cuts existing ones; Start listens on the same address
// again. Cut also cuts them, but keeps listening and closes each new
// connection at once, counting it (refused), until Restore. TLS goes through
// untouched, so clients verify the apiserver's own certificate (it names
// 127.0.0.1).
type tcpProxy struct {
	t      *testing.T
	target string
	Addr   string

	// accepted counts the connections forwarded, refused those closed
	// while cut.
	accepted, refused atomic.Int32

	mu    sync.Mutex
	ln    net.Listener
	down  bool
	conns map[net.Conn]struct{}
	wg    sync.WaitGroup
}

func startTCPProxy(t *testing.T, target string) *tcpProxy {
	t.Helper()
	p := &tcpProxy{t: t, target: target, Addr: "127.0.0.1:0", conns: map[net.Conn]struct{}{}}
	p.Start()
	t.Cleanup(p.Stop)
	return p
}

// apiProxy is a tcpProxy in front of the test apiserver.
func apiProxy(t *testing.T) *tcpProxy {
	t.Helper()
	return startTCPProxy(t, strings.TrimPrefix(cp.URL, "https://"))
}

// URL is the https URL clients use for the apiserver through the proxy.
func (p *tcpProxy) URL() string { return "https://" + p.Addr }

// Start listens on Addr (again). The port was ours a moment ago; if it is
// briefly unavailable, it tries for a few seconds.
func (p *tcpProxy) Start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		return
	}
	var ln net.Listener
	err := wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		var err error
		ln, err = net.Listen("tcp", p.Addr)
		return err == nil, nil
	})
	if err != nil {
		p.t.Fatalf("proxy listening on %s again: %v", p.Addr, err)
	}
	p.ln, p.Addr = ln, ln.Addr().String()
	p.wg.Add(1)
	go p.accept(ln)
}

// Stop closes the listener (new connections are refused) and every
// forwarded connection, and waits for the forwarding goroutines.
func (p *tcpProxy) Stop() {
	p.mu.Lock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// Cut closes every forwarded connection and, until Restore, each new one
// as soon as it is accepted.
func (p *tcpProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// Restore forwards new connections again after Cut.
func (p *tcpProxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

func (p *tcpProxy) accept(ln net.Listener) {
	defer p.wg.Done()
	for {
		in, err := ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			p.refused.Add(1)
			in.Close()
			continue
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.ln != ln { // stopped meanwhile
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns[in], p.conns[out] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.accepted.Add(1)
		p.wg.Add(2)
		pipe := func(dst, src net.Conn) {
			defer p.wg.Done()
			_, _ = io.Copy(dst, src)
			// One direction ended: end both.
			dst.Close()
			src.Close()
			p.mu.Lock()
			delete(p.conns, dst)
			delete(p.conns, src)
			p.mu.Unlock()
		}
		go pipe(out, in)
		go pipe(in, out)
	}
}

// ---- keyward serving the node agent: signer, approver, trusted CA ----

// nodeKeyward is keyward as a cluster runs it for node agents: the CSR
// signer (CA keys in the run's SoftHSM token) for a node-daemon signer name
// (profile csr, like the demo's keyward.dev/node-daemons) and for
// kubernetes.io/kube-apiserver-client-kubelet, and keyward's approver,
// started separately so a test can hold approval back.
type nodeKeyward struct {
	// DaemonSigner is this test's keyward.dev/<...>-node-daemons name;
	// DaemonRoot its CA.
	DaemonSigner string
	DaemonRoot   *x509.Certificate
	// KubeletRoot is the CA of kubernetes.io/kube-apiserver-client-kubelet,
	// already in the apiserver's --client-ca-file.
	KubeletRoot *x509.Certificate
	// Node is the node the daemon rules allow (CN and DNS names *.<node>).
	Node string

	approverSigners string
	signerConfig    *config.SignerConfiguration
	signer          *runningSigner
}

// startSigner runs keyward's signer for both names (again).
func (k *nodeKeyward) startSigner(t *testing.T) {
	t.Helper()
	k.signer = runSigner(t, k.signerConfig, uniqueName(t, "node-signer"))
}

// stopSigner stops the signer: approved CSRs wait for a certificate.
func (k *nodeKeyward) stopSigner() { k.signer.Stop() }

// daemonName is what a node's daemon certificates are named under:
// CommonName and DNS names <daemon>.<node>.
func (k *nodeKeyward) daemonName(daemon string) string { return daemon + "." + k.Node }

// startNodeKeyward creates Node node, makes both CAs in SoftHSM with
// their Authorities Active, trusts the kubelet client CA for client
// certificates, lets nodes request CSRs and renew their own client
// certificate (kubeadm's grants), and runs the signer. The approver is
// not started: see startApprover.
func startNodeKeyward(t *testing.T, ctx context.Context, node string) *nodeKeyward {
	t.Helper()
	if _, err := controlplane.EnsureNode(ctx, cp.AdminClient(), node); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{})
	})
	k := &nodeKeyward{DaemonSigner: "keyward.dev/" + uniqueName(t, "nd"), Node: node}
	kubeletClient := certv1.KubeAPIServerClientKubeletSignerName
	grantSigner(t, ctx, kubeletClient, "sign")
	k.KubeletRoot = kubeletSignerCA(t, kubeletClient, "kubelet-client-ca")
	k.DaemonRoot = kubeletSignerCA(t, k.DaemonSigner, "node-daemons-ca")
	trustClientRoot(t, k.KubeletRoot)
	letNodesRequest(t, ctx)
	selfNodeClient(t, ctx)

	pattern := "*." + node
	usages := []string{string(certv1.UsageDigitalSignature), string(certv1.UsageClientAuth)}
	daemons := config.Signer{Name: k.DaemonSigner, Profile: config.ProfileCSR, CSR: &config.CSRPolicy{
		TrustDistribution: "ClusterTrustBundle " + strings.ReplaceAll(k.DaemonSigner, "/", ":") + ":live",
		CommonNames:       []string{pattern}, DNSNames: []string{pattern}, KeyUsages: usages,
	}}
	k.signerConfig = baseConfig(t, daemons, config.Signer{Name: kubeletClient, Profile: config.ProfileKubeAPIServerClientKubelet})
	k.startSigner(t)
	k.approverSigners = fmt.Sprintf(`- {name: %s, profile: %s}
- name: %s
  profile: csr
  csr: {trustDistribution: %q, commonNames: [%q], dnsNames: [%q], keyUsages: [%s]}
  approval: {groups: [system:nodes]}
`, kubeletClient, config.ProfileKubeAPIServerClientKubelet, k.DaemonSigner, daemons.CSR.TrustDistribution, pattern, pattern, strings.Join(usages, ", "))
	installApproverRBAC(t, ctx)
	return k
}

// startApprover runs keyward's approver (its shipped service account and
// RBAC) for both names until the test ends. The test approves nothing
// itself.
func (k *nodeKeyward) startApprover(t *testing.T) {
	t.Helper()
	startApprover(t, k.approverSigners)
}

// selfNodeClient binds the bootstrap policy's selfnodeclient ClusterRole to
// system:nodes (kubeadm's node-autoapprove-certificate-rotation), so
// keyward's approver approves a node renewing its own client certificate.
func selfNodeClient(t *testing.T, ctx context.Context) {
	t.Helper()
	name := uniqueName(t, "node-autoapprove-certificate-rotation")
	admin := cp.AdminClient()
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: "system:nodes"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// trustClientRoot adds root to the apiserver's --client-ca-file (which it
// reloads when the file changes) until the test ends. trustClientCA adds a
// wait for a certificate to be accepted; the node agent tests prove
// acceptance by what the agent does.
func trustClientRoot(t *testing.T, root *x509.Certificate) {
	t.Helper()
	path := filepath.Join(cp.Dir, "pki", "ca.crt")
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(bytes.Clone(orig), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})...), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, orig, 0o600); err != nil {
			t.Errorf("restoring the apiserver's client CA file: %v", err)
		}
	})
}

// ---- Metrics ----

// eventually polls cond until it holds (10 s at most: it covers the moment
// between a file write and the metric or status update that follows it,
// not a timing claim) and otherwise fails with cond's last description.
func eventually(t *testing.T, ctx context.Context, cond func() (bool, string)) {
	t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		var ok bool
		ok, last = cond()
		return ok, nil
	})
	if err != nil {
		t.Error(last)
	}
}

// metricValue scrapes http://addr/metrics and sums the samples of name
// whose labels include every label="value" in labels (0 if none).
func metricValue(t *testing.T, addr, name string, labels ...string) float64 {
	t.Helper()
	v, err := scrapeMetric(addr, name, labels...)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func scrapeMetric(addr, name string, labels ...string) (float64, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, fmt.Errorf("scraping %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("scraping %s: %s", addr, resp.Status)
	}
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // another metric with this prefix
		}
		i := strings.LastIndexByte(rest, ' ')
		series := rest[:i]
		match := true
		for _, l := range labels {
			if !strings.Contains(series, l) {
				match = false
			}
		}
		if !match {
			continue
		}
		v, err := strconv.ParseFloat(rest[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return 0, err
	}
	return sum, nil
}

// The test infrastructure itself: a bootstrap token Secret authenticates
// as system:bootstrap:<id> in system:bootstrappers and its extra group,
// through the proxy; a stopped proxy refuses connections and cuts open
// ones, and a restarted one serves on the same address.
func TestNodeAgentTestInfrastructure(t *testing.T) {
	ctx := testContext(t)
	tok := newBootstrapToken(t, ctx)
	p := apiProxy(t)
	cfg := tokenConfig(p.URL(), tok)
	u := waitAuthenticatesAs(t, ctx, cfg, tok.User())
	for _, g := range []string{"system:bootstrappers", bootstrapExtraGroup, "system:authenticated"} {
		if !slices.Contains(u.Groups, g) {
			t.Errorf("bootstrap token user %s in groups %v, want %s among them", u.Username, u.Groups, g)
		}
	}
	kc, err := clientcmd.BuildConfigFromFlags("", writeBootstrapKubeconfig(t, p.URL(), tok))
	if err != nil {
		t.Fatal(err)
	}
	waitAuthenticatesAs(t, ctx, kc, tok.User())

	// An open connection (HTTP/2, kept alive) is cut by Stop; a new one
	// is refused.
	addr := p.Addr
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p.Stop()
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatalf("connecting to a stopped proxy succeeded")
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection through the stopped proxy is still open (read: %v)", err)
	}
	p.Start()
	if p.Addr != addr {
		t.Fatalf("restarted proxy on %s, want %s", p.Addr, addr)
	}
	waitAuthenticatesAs(t, ctx, cfg, tok.User())
}

// ---- Running the agent ----

// kubeconfigLine is the configuration line naming the node identity's
// kubeconfig.
func kubeconfigLine(path string) string { return fmt.Sprintf("kubeconfig: %q", path) }

// writeAgentConfig writes a NodeAgentConfiguration for node with its state
// in stateDir, metrics and health on free ports, quick retries (the tests
// must not wait out the default 2s..5m backoff), and sections (YAML
// top-level entries such as "kubeconfig: ..." or "credentials: ...").
func writeAgentConfig(t *testing.T, node, stateDir string, sections ...string) string {
	t.Helper()
	data := fmt.Sprintf(`apiVersion: keyward.dev/v1alpha1
kind: NodeAgentConfiguration
nodeName: %s
stateDir: %q
metricsAddress: 127.0.0.1:0
healthAddress: 127.0.0.1:0
renewal: {retryInitial: 100ms, retryMax: 1s}
%s
`, node, stateDir, strings.Join(sections, "\n"))
	path := filepath.Join(t.TempDir(), "agent.yaml")
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// newStateDir is a state directory that does not exist yet: the agent
// creates it (0700), as on a fresh node.
func newStateDir(t *testing.T) string { return filepath.Join(t.TempDir(), "state") }

// testAgent is `keyward node agent --config FILE` run in this process.
type testAgent struct {
	agent           *agent.Agent
	metrics, health string
	cancel          context.CancelFunc
	done            chan error
	logPath         string
	stopOnce        sync.Once
}

// startAgent loads the configuration file as the command does, runs the
// agent until the test ends (or stop), and waits until it listens. Its log
// (verbosity 4) is printed if the test fails.
func startAgent(t *testing.T, cfgPath string) *testAgent {
	t.Helper()
	cfg, err := agent.Load(cfgPath)
	if err != nil {
		t.Fatalf("loading the agent configuration: %v", err)
	}
	addrs := make(chan [2]string, 1)
	a, err := agent.New(agent.Options{Config: cfg, Ready: func(m, h string) {
		select {
		case addrs <- [2]string{m, h}:
		default:
		}
	}})
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	ta := &testAgent{agent: a, done: make(chan error, 1), logPath: filepath.Join(t.TempDir(), "agent.log")}
	logFile, err := os.Create(ta.logPath)
	if err != nil {
		t.Fatal(err)
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(4)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	ta.cancel = cancel
	go func() { ta.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		ta.stop(t)
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(ta.logPath)
			t.Logf("agent log %s:\n%s", ta.logPath, b)
		}
	})
	select {
	case a := <-addrs:
		ta.metrics, ta.health = a[0], a[1]
	case err := <-ta.done:
		ta.done <- err
		t.Fatalf("agent stopped before listening: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("agent not listening after 30s")
	}
	return ta
}

// stop cancels Run (a kill, as far as the agent's state on disk goes: it
// gets no chance to finish what it was doing) and waits for it; Run must
// return nil.
func (ta *testAgent) stop(t *testing.T) {
	t.Helper()
	ta.stopOnce.Do(func() {
		ta.cancel()
		select {
		case err := <-ta.done:
			if err != nil {
				t.Errorf("agent Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("agent did not stop within 30s of its context ending")
		}
	})
}

// status is the agent's status of credential name (zero if it has none).
func (ta *testAgent) status(t *testing.T, name string) agent.CredentialStatus {
	t.Helper()
	for _, s := range ta.agent.Status() {
		if s.Name == name {
			return s
		}
	}
	return agent.CredentialStatus{}
}

// ---- Reading what the agent wrote ----

// parsedBundle is a key and its chain (leaf first) as read from disk.
type parsedBundle struct {
	key              crypto.Signer
	keyPEM, chainPEM []byte
	chain            []*x509.Certificate
}

func (b *parsedBundle) leaf() *x509.Certificate { return b.chain[0] }

// matches reports whether the key is the leaf's.
func (b *parsedBundle) matches() bool { return publicKeysEqual(b.key.Public(), b.leaf().PublicKey) }

func publicKeysEqual(a, b crypto.PublicKey) bool {
	e, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && e.Equal(b)
}

// parseBundleData parses a KEP-4317 credential bundle strictly: one PKCS#8
// PRIVATE KEY block first, then at least one CERTIFICATE, nothing else.
func parseBundleData(data []byte) (*parsedBundle, error) {
	b := &parsedBundle{}
	rest := data
	for i := 0; ; i++ {
		var block *pem.Block
		start := rest
		block, rest = pem.Decode(rest)
		if block == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				return nil, fmt.Errorf("data after the last PEM block: %q", rest)
			}
			break
		}
		raw := start[:len(start)-len(rest)]
		switch {
		case i == 0 && block.Type == "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing the bundle's key: %w", err)
			}
			signer, ok := k.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("a %T key", k)
			}
			b.key, b.keyPEM = signer, raw
		case i > 0 && block.Type == "CERTIFICATE":
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parsing certificate %d: %w", i, err)
			}
			b.chain = append(b.chain, c)
			b.chainPEM = append(b.chainPEM, raw...)
		default:
			return nil, fmt.Errorf("block %d is %s: want PRIVATE KEY first, then CERTIFICATE blocks", i, block.Type)
		}
	}
	if b.key == nil || len(b.chain) == 0 {
		return nil, fmt.Errorf("want a PRIVATE KEY and a chain, got %d certificates", len(b.chain))
	}
	return b, nil
}

// sameCredential reports whether a and b hold the same key and chain.
func sameCredential(a, b *parsedBundle) bool {
	return publicKeysEqual(a.key.Public(), b.key.Public()) &&
		slices.EqualFunc(a.chain, b.chain, func(x, y *x509.Certificate) bool { return x.Equal(y) })
}

// waitFile waits until path parses as a bundle whose leaf is not prev
// (nil: any) and returns it. A file that exists but does not parse, or
// whose key is not its leaf's, fails the test at once: writes are atomic.
func waitFile(t *testing.T, ctx context.Context, what string, path func() string, prev *x509.Certificate) *parsedBundle {
	t.Helper()
	var got *parsedBundle
	var bad error
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		p := path()
		if p == "" {
			return false, nil
		}
		data, err := os.ReadFile(p)
		if os.IsNotExist(err) {
			return false, nil
		}
		if err != nil {
			bad = err
			return false, err
		}
		b, err := parseBundleData(data)
		if err != nil {
			bad = fmt.Errorf("%s: %w", p, err)
			return false, bad
		}
		if !b.matches() {
			bad = fmt.Errorf("%s: the key does not match the leaf", p)
			return false, bad
		}
		got = b
		return prev == nil || !prev.Equal(b.leaf()), nil
	})
	if err != nil {
		if bad != nil {
			t.Fatalf("%s: %v", what, bad)
		}
		t.Fatalf("%s never appeared (%v)", what, err)
	}
	return got
}

// waitBundle waits for the output bundle in dir with a leaf other than
// prev.
func waitBundle(t *testing.T, ctx context.Context, dir string, prev *x509.Certificate) *parsedBundle {
	t.Helper()
	what := "the credential bundle in " + dir
	if prev != nil {
		what = "a renewed " + what
	}
	return waitFile(t, ctx, what, func() string { return filepath.Join(dir, bundleFile) }, prev)
}

// waitStoredPair waits for the pair store's <name>-current.pem (anywhere
// under stateDir) with a leaf other than prev.
func waitStoredPair(t *testing.T, ctx context.Context, stateDir, name string, prev *x509.Certificate) *parsedBundle {
	t.Helper()
	return waitFile(t, ctx, name+"-current.pem under "+stateDir, func() string { return findFile(stateDir, name+"-current.pem") }, prev)
}

// findFile returns the first path under dir whose base name is name, or "".
func findFile(dir, name string) string {
	var found string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == name && found == "" {
			found = path
		}
		return nil
	})
	return found
}

// checkAtomicLayout checks kubelet's atomic-writer layout in dir: ..data is
// a symlink to a ..<timestamp> directory beside it, and each name is a
// symlink to ..data/<name>.
func checkAtomicLayout(t *testing.T, dir string, names ...string) {
	t.Helper()
	target, err := os.Readlink(filepath.Join(dir, "..data"))
	if err != nil {
		t.Fatalf("%s/..data: %v", dir, err)
	}
	if !strings.HasPrefix(target, "..") || strings.ContainsRune(target, '/') {
		t.Errorf("..data -> %q, want a ..<timestamp> directory beside it", target)
	}
	if st, err := os.Lstat(filepath.Join(dir, target)); err != nil || !st.IsDir() {
		t.Errorf("..data's target %s is not a directory (%v)", target, err)
	}
	for _, name := range names {
		got, err := os.Readlink(filepath.Join(dir, name))
		if err != nil || got != filepath.Join("..data", name) {
			t.Errorf("%s -> %q (%v), want a symlink to ..data/%s", name, got, err, name)
		}
	}
}

// waitLinked waits until every name in dir resolves.
func waitLinked(t *testing.T, ctx context.Context, dir string, names ...string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		for _, n := range names {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%v in %s never all resolved: %v", names, dir, err)
	}
}

// fileMode is the permission bits of the file path resolves to.
func fileMode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Mode().Perm()
}

// checkPairStore checks the certstore layout for name under stateDir:
// <name>-current.pem is a symlink to <name>-<timestamp>.pem in the same
// directory (0700), the pair file is 0600 and a bundle; it returns the
// pair.
func checkPairStore(t *testing.T, stateDir, name string) *parsedBundle {
	t.Helper()
	current := findFile(stateDir, name+"-current.pem")
	if current == "" {
		t.Fatalf("no %s-current.pem under %s", name, stateDir)
	}
	target, err := os.Readlink(current)
	if err != nil {
		t.Fatalf("%s is not a symlink: %v", current, err)
	}
	if !regexp.MustCompile(`^` + regexp.QuoteMeta(name) + `-\d{4}-\d\d-\d\d-\d\d-\d\d-\d\d.*\.pem$`).MatchString(target) {
		t.Errorf("%s -> %q, want %s-<2006-01-02-15-04-05>.pem in the same directory", current, target, name)
	}
	if m := fileMode(t, current); m != 0o600 {
		t.Errorf("%s mode %v, want 0600", target, m)
	}
	if m := fileMode(t, filepath.Dir(current)); m != 0o700 {
		t.Errorf("pair store directory %s mode %v, want 0700", filepath.Dir(current), m)
	}
	data, err := os.ReadFile(current)
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseBundleData(data)
	if err != nil {
		t.Fatalf("%s: %v", target, err)
	}
	return b
}

// parseCSRRequest parses a CSR's spec.request.
func parseCSRRequest(t *testing.T, c certv1.CertificateSigningRequest) *x509.CertificateRequest {
	t.Helper()
	block, _ := pem.Decode(c.Spec.Request)
	if block == nil {
		t.Fatalf("CSR %s: spec.request is not PEM", c.Name)
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		t.Fatalf("CSR %s: %v", c.Name, err)
	}
	return req
}
