package nodetests

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/pemcert"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/node"
	"github.com/keyward/keyward/testsupport/nodeimages"
	"github.com/keyward/keyward/testsupport/softhsm"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// The names keyward serves on the node, one per PodCertificateRequest
// profile, and the kubelet's two.
const (
	keywardNamespace = "keyward"
	// nodeAgentNamespace holds the node agent's ServiceAccount, as shipped
	// (the agent needs Pod Security privileged; keyward's namespace does not).
	nodeAgentNamespace = "keyward-node"
	nodeName           = "keyward-node"
	podIdentity        = "keyward.dev/pod-identity"
	spiffeSigner       = "keyward.dev/spiffe"
	serverSigner       = "keyward.dev/server"
	// meshSigner is rotated by TestCARotationUnderLiveMTLS, daemonSigner
	// by TestNodeAgentThroughARotation.
	meshSigner     = "keyward.dev/mesh"
	daemonSigner   = "keyward.dev/node-daemons"
	kubeletClient  = "kubernetes.io/kube-apiserver-client-kubelet"
	kubeletServing = "kubernetes.io/kubelet-serving"
	// kubeletCertLifetime is short so that the run sees kubelet rotate
	// both certificates (at 70–90% of their life).
	kubeletCertLifetime = 3 * time.Minute
	generation          = "g1"
)

// signerConfig is keyward's SignerConfiguration on the node's cluster: the
// three PCR profiles, the kubelet's two names with serving auto-approval
// for the node's address range. The signer runs the trust publisher.
const signerConfig = `apiVersion: keyward.dev/v1alpha1
kind: SignerConfiguration
kubeClient: {kubeconfig: %q}
metricsAddress: 127.0.0.1:0
healthAddress: 127.0.0.1:0
leaderElection: {namespace: keyward, leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s}
trustPublisher: {enabled: true, kubeletSyncFrequency: 10s}
signers:
- name: keyward.dev/pod-identity
  profile: podIdentity
- name: keyward.dev/spiffe
  profile: spiffe
  spiffe: {trustDomain: cluster.local}
- name: keyward.dev/mesh
  profile: spiffe
  spiffe: {trustDomain: mesh.local}
- name: keyward.dev/server
  profile: server
  unverifiedUserAnnotations: [keyward.dev/dns-names]
  server: {allowedDNSNames: ["{serviceAccount}.{namespace}.svc"]}
- name: keyward.dev/node-daemons
  profile: csr
  maxLifetime: 3m
  csr:
    trustDistribution: ClusterTrustBundle keyward.dev:node-daemons:live
    uris: ["spiffe://cluster.local/node/*"]
    keyUsages: ["digital signature", "client auth"]
  approval:
    groups: ["system:nodes"]
    nodeBound: true
- name: kubernetes.io/kube-apiserver-client-kubelet
  profile: kubeAPIServerClientKubelet
  maxLifetime: %s
- name: kubernetes.io/kubelet-serving
  profile: kubeletServing
  maxLifetime: %s
  approval: {allowedIPRanges: [10.213.0.0/16]}
`

// clusterEnv is the package's cluster: control plane, keyward, the node.
type clusterEnv struct {
	cp          *controlplane.ControlPlane
	admin       kubernetes.Interface
	authorities *authclient.Client
	dir         string
	keyward     string // the keyward binary
	adminKC     string
	signerCfg   string
	token       *softhsm.Token
	images      *nodeimages.Images
	roots       map[string]*x509.Certificate // signer name → its g1 root
	signer      *controlplane.Process
	approver    *controlplane.Process
	registry    *registrySetup
	node        *node.Node
}

var env *clusterEnv

func setUp(ctx context.Context, c *controlplane.ControlPlane, kubeletCAFile string) (e *clusterEnv, err error) {
	e = &clusterEnv{cp: c, admin: c.AdminClient(), dir: node.WorkDir(), roots: map[string]*x509.Certificate{}}
	defer func() {
		if err != nil {
			_ = e.tearDown()
		}
	}()
	step := func(what string) func() {
		began := time.Now()
		return func() {
			fmt.Fprintf(os.Stderr, "node-tests: %s (%s)\n", what, time.Since(began).Round(time.Millisecond))
		}
	}

	done := step("built keyward and the images")
	e.keyward = filepath.Join(e.dir, "bin", "keyward")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", e.keyward, "github.com/keyward/keyward/cmd/keyward").CombinedOutput(); err != nil {
		return e, fmt.Errorf("building keyward: %v: %s", err, out)
	}
	if e.images, err = nodeimages.Build(ctx, filepath.Join(e.dir, "images")); err != nil {
		return e, err
	}
	done()

	done = step("keyward installed: RBAC from keyward deploy rbac, CAs from keyward ca init in SoftHSM2")
	hsm, err := softhsm.NewEnv(filepath.Join(e.dir, "softhsm"))
	if err != nil {
		return e, err
	}
	if e.token, err = hsm.NewToken("keyward-node"); err != nil {
		return e, err
	}
	e.adminKC = filepath.Join(e.dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(c.AdminConfig(), "admin", e.adminKC); err != nil {
		return e, err
	}
	signerKC, err := e.serviceAccountKubeconfig("keyward-signer")
	if err != nil {
		return e, err
	}
	approverKC, err := e.serviceAccountKubeconfig("keyward-approver")
	if err != nil {
		return e, err
	}
	e.signerCfg = filepath.Join(e.dir, "signer-config.yaml")
	life := kubeletCertLifetime.String()
	if err := os.WriteFile(e.signerCfg, []byte(fmt.Sprintf(signerConfig, signerKC, life, life)), 0o600); err != nil {
		return e, err
	}
	approverCfg := filepath.Join(e.dir, "approver-config.yaml")
	if err := os.WriteFile(approverCfg, []byte(fmt.Sprintf(signerConfig, approverKC, life, life)), 0o600); err != nil {
		return e, err
	}
	for _, ns := range []string{keywardNamespace, nodeAgentNamespace} {
		if err := controlplane.EnsureNamespace(ctx, e.admin, ns); err != nil {
			return e, err
		}
	}
	rbac, err := e.run(ctx, "deploy", "rbac", "--namespace", keywardNamespace, "--signer-config", e.signerCfg, "--approver",
		"--node-agent", "--node-agent-namespace", nodeAgentNamespace)
	if err != nil {
		return e, err
	}
	if err := controlplane.ApplyManifest(ctx, c.AdminConfig(), []byte(rbac)); err != nil {
		return e, fmt.Errorf("applying keyward deploy rbac's output: %w", err)
	}
	if e.authorities, err = controlplane.InstallAuthorityCRD(ctx, c.AdminConfig()); err != nil {
		return e, err
	}
	// The rotated signer's Authority, made before keyward ca init as an
	// operator's manifest would, with gates short enough for a test.
	for _, s := range []string{meshSigner, daemonSigner} {
		if _, err := e.authorities.Create(ctx, &v1alpha1.Authority{
			ObjectMeta: metav1.ObjectMeta{Name: authorityOf(s)},
			Spec: v1alpha1.AuthoritySpec{SignerName: s, Gates: v1alpha1.Gates{
				CanarySoak: &metav1.Duration{Duration: rotationSoak}, PropagationWindow: &metav1.Duration{Duration: rotationWindow},
			}},
		}, metav1.CreateOptions{}); err != nil {
			return e, err
		}
	}
	for _, s := range []string{podIdentity, spiffeSigner, meshSigner, serverSigner, daemonSigner, kubeletClient, kubeletServing} {
		if e.roots[s], err = e.caInit(ctx, s, generation); err != nil {
			return e, err
		}
	}
	done()

	done = step("kube-apiserver trusts keyward's kubelet CAs (client CA appended, kubelet CA restarted into)")
	// The apiserver reloads --client-ca-file when it changes; the kubelet
	// CA is read at start.
	if err := appendPEM(c.CAFile(), e.roots[kubeletClient]); err != nil {
		return e, err
	}
	if err := os.WriteFile(kubeletCAFile, certPEM(e.roots[kubeletServing]), 0o644); err != nil {
		return e, err
	}
	if _, err := c.RestartAPIServer(ctx); err != nil {
		return e, fmt.Errorf("restarting kube-apiserver into keyward's kubelet CA: %w", err)
	}
	done()

	done = step("keyward signer and approver running")
	if e.signer, err = e.start("signer", "signer", "--config", e.signerCfg, "--pkcs11-module", e.token.ModulePath); err != nil {
		return e, err
	}
	if e.approver, err = e.start("approver", "approver", "--config", approverCfg); err != nil {
		return e, err
	}
	done()

	done = step("registry, token service and kubelet's credential provider configuration ready")
	if e.registry, err = e.setUpRegistry(ctx); err != nil {
		return e, err
	}
	done()

	done = step("node joined with a bootstrap token: client and serving certificates from keyward")
	bootstrapKC, err := e.bootstrapToken(ctx)
	if err != nil {
		return e, err
	}
	e.node, err = node.Start(ctx, node.Options{
		Dir:                      filepath.Join(e.dir, "node"),
		Name:                     nodeName,
		BootstrapKubeconfig:      bootstrapKC,
		Kubeconfig:               filepath.Join(e.dir, "node", "kubelet.kubeconfig"),
		ClientCAFile:             c.CAFile(),
		ServerTLSBootstrap:       true,
		SandboxImage:             e.images.PauseRef,
		ImageArchives:            []string{e.images.PauseArchive, e.images.WorkloadArchive},
		Registries:               e.registry.nodeRegistries(),
		CredentialProviderConfig: e.registry.providerCfg,
		CredentialProviderBinDir: e.registry.providerBin,
		KubeletConfig: func(cfg map[string]any) {
			// kubelet's own resync, which also paces projected volume
			// refreshes; 1m by default.
			cfg["syncFrequency"] = "10s"
		},
	})
	if err != nil {
		return e, err
	}
	if err := e.waitNodeServing(ctx); err != nil {
		return e, err
	}
	done()
	return e, nil
}

// run runs the keyward CLI as the admin and returns its stdout.
func (e *clusterEnv) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, e.keyward, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+e.adminKC)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("keyward %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// start runs a long-lived keyward command as a process.
func (e *clusterEnv) start(name string, args ...string) (*controlplane.Process, error) {
	p, err := controlplane.StartProcess("keyward "+name, e.keyward, args, filepath.Join(e.dir, name+".log"))
	if err != nil {
		return nil, err
	}
	select {
	case <-p.Done():
		return nil, p.ExitError()
	case <-time.After(time.Second):
	}
	return p, nil
}

// keyURI names a key in the run's SoftHSM2 token.
func (e *clusterEnv) keyURI(object string) string {
	return "pkcs11:token=" + e.token.Label + ";object=" + object + "?module-path=" + e.token.ModulePath + "&pin-source=file:" + e.token.PINFile
}

// caInit runs keyward ca init for signerName's generation gen, a key
// created in the token, and returns the root it made.
// leafMax, when set, is the longest leaf (--max-leaf-lifetime) for a signer
// name the signer's configuration does not serve (the token service's).
func (e *clusterEnv) caInit(ctx context.Context, signerName, gen string, leafMax ...string) (*x509.Certificate, error) {
	object := strings.NewReplacer("/", "-", ".", "-").Replace(signerName) + "-" + gen
	leaf := []string{"--config", e.signerCfg}
	if len(leafMax) > 0 {
		leaf = []string{"--max-leaf-lifetime", leafMax[0]}
	}
	if _, err := e.run(ctx, append([]string{"ca", "init", "--signer", signerName, "--generation", gen, "--key-uri", e.keyURI(object),
		"--create-key", "--pkcs11-module", e.token.ModulePath, "--lifetime", "720h"}, leaf...)...); err != nil {
		return nil, err
	}
	list, err := e.authorities.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	for _, a := range list.Items {
		if a.Spec.SignerName != signerName {
			continue
		}
		for _, g := range a.Spec.Generations {
			if g.Name == gen {
				return parseCert([]byte(g.CertificatePEM))
			}
		}
	}
	return nil, fmt.Errorf("keyward ca init %s %s: no such generation in any Authority after it", signerName, gen)
}

// serviceAccountKubeconfig writes a kubeconfig for keyward/<sa>.
func (e *clusterEnv) serviceAccountKubeconfig(sa string) (string, error) {
	cfg, err := e.cp.ServiceAccountConfig(keywardNamespace, sa)
	if err != nil {
		return "", err
	}
	path := filepath.Join(e.dir, sa+".kubeconfig")
	return path, controlplane.WriteKubeconfig(cfg, sa, path)
}

// bootstrapToken makes a bootstrap token as kubeadm does (its Secret, the
// bindings that let system:bootstrappers ask for node client certificates
// and nodes renew their own) and writes kubelet's bootstrap kubeconfig.
func (e *clusterEnv) bootstrapToken(ctx context.Context) (string, error) {
	const id, secret = "kwnode", "0123456789abcdef"
	if _, err := e.admin.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "bootstrap-token-" + id},
		Type:       "bootstrap.kubernetes.io/token",
		StringData: map[string]string{
			"token-id": id, "token-secret": secret, "usage-bootstrap-authentication": "true",
			"expiration": time.Now().Add(time.Hour).UTC().Format(time.RFC3339),
		},
	}, metav1.CreateOptions{}); err != nil {
		return "", err
	}
	for name, b := range map[string]struct{ role, group string }{
		"kubeadm:kubelet-bootstrap":                     {"system:node-bootstrapper", "system:bootstrappers"},
		"kubeadm:node-autoapprove-bootstrap":            {"system:certificates.k8s.io:certificatesigningrequests:nodeclient", "system:bootstrappers"},
		"kubeadm:node-autoapprove-certificate-rotation": {"system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", "system:nodes"},
	} {
		if _, err := e.admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: b.group}},
		}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", err
		}
	}
	ca, err := os.ReadFile(e.cp.CAFile())
	if err != nil {
		return "", err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["keyward"] = &clientcmdapi.Cluster{Server: e.cp.URL, CertificateAuthorityData: ca}
	kc.AuthInfos["bootstrap"] = &clientcmdapi.AuthInfo{Token: id + "." + secret}
	kc.Contexts["bootstrap"] = &clientcmdapi.Context{Cluster: "keyward", AuthInfo: "bootstrap"}
	kc.CurrentContext = "bootstrap"
	path := filepath.Join(e.dir, "bootstrap.kubeconfig")
	return path, clientcmd.WriteToFile(*kc, path)
}

// waitNodeServing waits until the Node is registered and its kubelet
// serving CSR is issued, naming what is missing when it gives up.
func (e *clusterEnv) waitNodeServing(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := e.node.KubeletExited(); err != nil {
			return false, err
		}
		if _, err := e.admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); err != nil {
			last = "Node " + nodeName + ": " + err.Error()
			return false, nil
		}
		csrs, err := e.admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		for _, c := range csrs.Items {
			if c.Spec.SignerName == kubeletServing && len(c.Status.Certificate) > 0 {
				return true, nil
			}
		}
		last = fmt.Sprintf("no issued %s CSR among %d", kubeletServing, len(csrs.Items))
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("node %s did not join with keyward's certificates: %v (%s); kubelet log %s:\n%s",
			nodeName, err, last, e.node.KubeletLog, controlplane.Tail(e.node.KubeletLog, 30))
	}
	return nil
}

// tearDown stops the node, then keyward, and checks that nothing the node
// ran is left in this PID namespace.
func (e *clusterEnv) tearDown() error {
	var errs []error
	began := time.Now()
	if e.node != nil {
		if err := e.node.Stop(); err != nil {
			errs = append(errs, err)
		}
		fmt.Fprintf(os.Stderr, "node-tests: node stopped (%s)\n", time.Since(began).Round(time.Millisecond))
	}
	if e.registry != nil {
		e.registry.stop()
	}
	for _, p := range []*controlplane.Process{e.signer, e.approver} {
		if p != nil {
			p.Stop(10 * time.Second)
		}
	}
	if left := strayProcesses(e); len(left) > 0 {
		errs = append(errs, fmt.Errorf("processes left after the node stopped: %s", strings.Join(left, "; ")))
	}
	return errors.Join(errs...)
}

// strayProcesses lists this PID namespace's processes other than this one
// and the control plane's (which RunMain stops next). Zombies are left out:
// they are exited processes whose parent, this PID 1, has not reaped them.
func strayProcesses(e *clusterEnv) []string {
	apiserver, etcd := e.cp.PIDs()
	var left []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		var pid int
		if _, err := fmt.Sscan(p.Name(), &pid); err != nil || pid == os.Getpid() || pid == apiserver || pid == etcd {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", p.Name(), "stat"))
		if err != nil || bytes.Contains(stat, []byte(") Z ")) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", p.Name(), "cmdline"))
		left = append(left, fmt.Sprintf("%d %s", pid, strings.ReplaceAll(strings.TrimRight(string(cmd), "\x00"), "\x00", " ")))
	}
	return left
}

// parseCert is the first certificate of a PEM list (a generation's
// certificatePEM).
func parseCert(b []byte) (*x509.Certificate, error) {
	certs, err := pemcert.Parse(b)
	if err != nil {
		return nil, err
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return certs[0], nil
}

func certPEM(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func appendPEM(path string, c *x509.Certificate) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write(certPEM(c)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// testContext is a context for one test, bounded by timeout.
func testContext(t *testing.T, timeout time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	return ctx
}

// fingerprint is the hex SHA-256 of a DER certificate, as the workload
// prints roots.
func fingerprint(der []byte) string {
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:])
}
