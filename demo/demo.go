// Package demo is `keyward demo`: keyward's whole life cycle on this
// machine (kube-apiserver + etcd, a SoftHSM2 token, the signer, a pod
// certificate, a node daemon's CSR, the registry credentials, a canary-then-
// live CA rotation), for a person to watch. cmd/keyward/app only parses its
// flags and calls Run.
//
// It is the one deliberate exception to "production code never imports
// testsupport": it runs the tests' control plane (testsupport/controlplane),
// SoftHSM2 tokens (testsupport/softhsm) and throwaway serving certificates
// (testsupport/servingcert). Nothing else outside tests imports demo but
// the command layer.
package demo

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"github.com/keyward/keyward/internal/pemcert"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/deploy/rbac"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/softhsm"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// demoSigner is the signer name the demo issues for; demoGeneration is its
// CA generation.
const (
	demoSigner     = "keyward.dev/demo"
	demoGeneration = "demo-1"
)

// Options are the demo's settings and what it needs from the command layer,
// which it cannot import (nothing imports cmd).
type Options struct {
	// Dir is the directory for kubeconfigs and the SoftHSM token; empty: a
	// new temp dir, removed on exit.
	Dir string
	// Once stops after the rotation instead of waiting for ctx.
	Once bool
	// RegistryBinary is Distribution's registry (bin/registry, `make
	// registry`); empty: "registry" beside the keyward binary, else on PATH.
	RegistryBinary string
	// Plugin runs `keyward credential-provider` (its first element is the
	// executable); empty: this executable.
	Plugin []string
	// BeforeStop, with Once, is called after the rotation while every
	// component still runs (tests read what the demo left in the cluster,
	// its logs and metrics).
	BeforeStop func(ctx context.Context, r Running) error
	// CLI runs `keyward ARGS` in-process, its output and errors written to
	// out, as an operator types it; the demo shows each command it runs.
	CLI func(ctx context.Context, out io.Writer, args []string) error
	// ExitCode is the keyward process exit code for a CLI error.
	ExitCode func(error) int
	// SignerCompanions and TokenServiceCompanions are what the signer and
	// the token service run beside them while they lead (the trust
	// publisher), as `keyward signer` and `keyward token-service` wire them.
	SignerCompanions       func(*config.SignerConfiguration) []signer.Companion
	TokenServiceCompanions func(*tsconfig.TokenServiceConfiguration) []signer.Companion
}

// Running is what BeforeStop may look at.
type Running struct {
	// Dir holds the components' logs (*.log); ControlPlaneDir etcd's and
	// kube-apiserver's.
	Dir, ControlPlaneDir string
	Token                *softhsm.Token
	// Secrets are the credentials the demo obtained, by what they are.
	Secrets *Secrets
}

// Secrets records credentials the demo obtains (service-account and
// registry tokens) so that a test can look for them where they must not
// be. A nil *Secrets records nothing.
type Secrets struct {
	mu     sync.Mutex
	byName map[string]string
}

func (s *Secrets) add(what, secret string) {
	if s == nil || secret == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byName == nil {
		s.byName = map[string]string{}
	}
	s.byName[what] = secret
}

// All returns a copy of what was recorded.
func (s *Secrets) All() map[string]string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byName)
}

// Run runs the demo until ctx ends (with o.Once, until the rotation is
// done), then removes everything it made.
func Run(ctx context.Context, out io.Writer, o Options) error {
	registryBin, plugin, err := demoBinaries(o)
	if err != nil {
		return err
	}
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "keyward-demo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(d)
		dir = d
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}

	hsm, err := softhsm.NewEnv(filepath.Join(dir, "softhsm"))
	if err != nil {
		return err
	}
	token, err := hsm.NewToken("keyward-demo")
	if err != nil {
		return err
	}

	fmt.Fprintln(out, "starting kube-apiserver and etcd ...")
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		return fmt.Errorf("starting control plane: %w", err)
	}
	defer cp.Stop()
	if err := controlplane.EnsureNamespace(ctx, cp.AdminClient(), rbac.DefaultNamespace); err != nil {
		return err
	}
	manifest, err := demoRBAC()
	if err != nil {
		return err
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		return fmt.Errorf("applying the demo's RBAC: %w", err)
	}

	admin := filepath.Join(dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", admin); err != nil {
		return err
	}
	signerCfg, err := cp.ServiceAccountConfig("keyward", "keyward-signer")
	if err != nil {
		return err
	}
	signerKubeconfig := filepath.Join(dir, "signer.kubeconfig")
	if err := controlplane.WriteKubeconfig(signerCfg, "keyward-signer", signerKubeconfig); err != nil {
		return err
	}

	fmt.Fprintf(out, `
control plane ready in %s at %s
  admin (system:masters):        export KUBECONFIG=%s
  signer (keyward/keyward-signer, shipped RBAC only): %s
SoftHSM2 token ready
  SOFTHSM2_CONF=%s
  module %s, token label %q, PIN in %s
`, cp.StartDuration.Round(time.Millisecond), cp.URL, admin, signerKubeconfig,
		hsm.ConfPath, token.ModulePath, token.Label, token.PINFile)

	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()

	// The CA lives in the cluster, in the signer name's Authority, created
	// empty with the demo's compressed gates as an operator's manifest
	// would; `keyward ca init` adds its first generation (Active, as the
	// first one is) with a key it creates inside the token, never to leave.
	authorities, err := controlplane.InstallAuthorityCRD(ctx, cp.AdminConfig())
	if err != nil {
		return err
	}
	if _, err := authorities.Create(ctx, &v1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: demoAuthority},
		Spec: v1alpha1.AuthoritySpec{SignerName: demoSigner, Gates: v1alpha1.Gates{
			CanarySoak:        &metav1.Duration{Duration: demoCanarySoak},
			PropagationWindow: &metav1.Duration{Duration: demoPropagationWindow},
		}},
	}, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating Authority %s: %w", demoAuthority, err)
	}
	fmt.Fprintf(out, "Authority %s (keyward.dev/v1alpha1) for %s created with gates canarySoak %s, propagationWindow %s (defaults 1h, 5m)\n",
		demoAuthority, demoSigner, demoCanarySoak, demoPropagationWindow)
	cli := demoCLI{out: out, kubeconfig: admin, module: token.ModulePath, execute: o.CLI, exitCode: o.ExitCode}
	caKeyURI := demoKeyURI(token, "demo-ca-1")
	if err := cli.caInit(ctx, demoGeneration, caKeyURI); err != nil {
		return err
	}
	auth, err := authorities.Get(ctx, demoAuthority)
	if err != nil {
		return fmt.Errorf("reading Authority %s: %w", demoAuthority, err)
	}
	first := generationOf(auth, demoGeneration)
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), []byte(first.CertificatePEM), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "CA key created in SoftHSM (non-extractable) by keyward ca init: %s\n", first.KeyURI)
	// The custom CSR signer name node daemons ask has its own CA.
	if err := cli.caInitDaemons(ctx, demoKeyURI(token, "demo-daemons-ca-1")); err != nil {
		return err
	}

	// The signer, as `keyward signer --config` would run it.
	off := false
	cfg := &config.SignerConfiguration{
		APIVersion: config.APIVersion, Kind: config.Kind,
		KubeClient:     config.KubeClient{Kubeconfig: signerKubeconfig},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		LeaderElection: config.LeaderElection{Enabled: &off},
		Signers:        []config.Signer{{Name: demoSigner, Profile: config.ProfilePodIdentity}, demoDaemonSignerConfig()},
	}
	cfg.Default()
	on := true
	cfg.TrustPublisher.Enabled = &on
	if errs := cfg.Validate(); len(errs) > 0 {
		return errs.ToAggregate()
	}
	logFile, err := os.Create(filepath.Join(dir, "signer.log"))
	if err != nil {
		return err
	}
	defer logFile.Close()
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile)))
	signerCtx, stopSigner := context.WithCancel(klog.NewContext(ctx, logger))
	signerDone := make(chan error, 1)
	addrs := make(chan [2]string, 1)
	go func() {
		// v1, as a Kubernetes 1.37 cluster serves by default (the demo's
		// control plane also serves the deprecated v1beta1, which discovery
		// would choose to see both key forms).
		signerDone <- signer.Run(signerCtx, signer.Options{Config: cfg, Backends: reg, PodCertificateVersion: pcr.V1,
			AlsoLead: o.SignerCompanions(cfg),
			Ready:    func(m, h string) { addrs <- [2]string{m, h} }})
	}()
	defer func() { stopSigner(); <-signerDone }()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-signerDone:
		return fmt.Errorf("signer: %w", err)
	}
	fmt.Fprintf(out, "signer running for %s with the trust publisher: metrics http://%s/metrics, health http://%s/readyz, log %s\n", demoSigner, a[0], a[1], logFile.Name())
	stopApprover, err := startDemoApprover(ctx, out, cp, cfg, dir)
	if err != nil {
		return err
	}
	defer stopApprover()
	if _, err := waitObserved(ctx, authorities, map[string]v1alpha1.Phase{demoGeneration: v1alpha1.PhaseActive}); err != nil {
		return err
	}
	fmt.Fprintf(out, "trust publisher: generation %s observed Active (bootstrap: the signer reported its key ready)\n", demoGeneration)
	if err := waitDaemonsActive(ctx, authorities); err != nil {
		return err
	}
	fmt.Fprintf(out, "trust publisher: generation %s of %s observed Active\n", demoDaemonGeneration, demoDaemonSigner)

	// Play kubelet: a pod on a node mounts a podCertificate volume; the node
	// generates a key and asks for the pod's certificate.
	w, err := controlplane.CreateWorkload(ctx, cp.AdminClient(), controlplane.Workload{
		Namespace: "demo", Node: "demo-node", ServiceAccount: "demo-app", Pod: "demo-app", SignerNames: []string{demoSigner},
	})
	if err != nil {
		return err
	}
	nodeCfg, err := cp.NodeConfig("demo-node")
	if err != nil {
		return err
	}
	node, err := kubernetes.NewForConfig(nodeCfg)
	if err != nil {
		return err
	}
	chain, err := requestPodCertificate(ctx, out, node, w)
	if err != nil {
		return err
	}
	DescribeChain(out, chain)
	daemonChain, err := requestDaemonCertificate(ctx, out, cp)
	if err != nil {
		return err
	}
	DescribeChain(out, daemonChain)

	var secrets *Secrets
	if o.BeforeStop != nil {
		secrets = &Secrets{}
	}
	stopRegistry, err := runRegistryDemo(ctx, demoRegistryEnv{
		out: out, dir: dir, cp: cp, cli: cli, authorities: authorities, token: token, backends: reg, node: node,
		registryBinary: registryBin, plugin: plugin, secrets: secrets, companions: o.TokenServiceCompanions,
	})
	defer stopRegistry()
	if err != nil {
		return err
	}

	// The node helper's trust projection on two nodes, one following the
	// canary bundle, the other live, as a Node label chooses.
	trustFiles, stopTrust, err := startDemoTrust(klog.NewContext(ctx, logger), out, cp, dir)
	if err != nil {
		return err
	}
	defer stopTrust()
	fmt.Fprintln(out)

	r := &demoRotation{out: out, cli: cli, authorities: authorities, node: node, events: cp.AdminClient(), workload: w, token: token, trust: trustFiles}
	if err := r.run(ctx, chain[0]); err != nil {
		return err
	}

	if o.Once {
		if o.BeforeStop != nil {
			if err := o.BeforeStop(ctx, Running{Dir: dir, ControlPlaneDir: cp.Dir, Token: token, Secrets: secrets}); err != nil {
				return err
			}
		}
		fmt.Fprintln(out, "--once: stopping")
		return nil
	}
	fmt.Fprintln(out, "press Ctrl-C to stop and remove everything")
	<-ctx.Done()
	fmt.Fprintln(out, "stopping ...")
	return nil
}

// demoBinaries finds the registry binary and the command that runs the
// credential provider plugin, before anything starts.
func demoBinaries(o Options) (registryBin string, plugin []string, err error) {
	plugin = o.Plugin
	exe, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("finding the keyward executable: %w", err)
	}
	if len(plugin) == 0 {
		plugin = []string{exe}
	}
	registryBin = o.RegistryBinary
	if registryBin == "" {
		registryBin = filepath.Join(filepath.Dir(exe), "registry")
		if _, err := os.Stat(registryBin); err != nil {
			if registryBin, err = exec.LookPath("registry"); err != nil {
				return "", nil, errors.New("the demo needs CNCF Distribution's registry: run `make registry` (builds bin/registry beside bin/keyward) or pass --registry-binary")
			}
		}
	}
	if _, err := os.Stat(registryBin); err != nil {
		return "", nil, fmt.Errorf("--registry-binary: %w", err)
	}
	return registryBin, plugin, nil
}

// requestPodCertificate plays the node: it generates a key and creates a
// PodCertificateRequest for w's pod, waits for the signer's answer and
// returns the issued chain, leaf first.
func requestPodCertificate(ctx context.Context, out io.Writer, node kubernetes.Interface, w *controlplane.WorkloadObjects) ([]*x509.Certificate, error) {
	subjectKey, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		return nil, err
	}
	req, err := nodehelper.NewPodCertificateRequest(nodehelper.PodRef{
		Namespace: w.Pod.Namespace, Name: w.Pod.Name, UID: w.Pod.UID,
		ServiceAccountName: w.ServiceAccount.Name, ServiceAccountUID: w.ServiceAccount.UID,
		NodeName: w.Node.Name, NodeUID: w.Node.UID,
	}, demoSigner, subjectKey, nodehelper.PodCertificateOptions{})
	if err != nil {
		return nil, err
	}
	began := time.Now()
	created, err := node.CertificatesV1().PodCertificateRequests(req.Namespace).Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("node creating PodCertificateRequest: %w", err)
	}
	waitCtx, cancelWait := context.WithTimeout(ctx, time.Minute)
	defer cancelWait()
	done, err := nodehelper.WaitForTerminal(waitCtx, node, created)
	if err != nil {
		return nil, err
	}
	latency := time.Since(began)
	c := done.Status.Conditions[0]
	if c.Type != "Issued" {
		return nil, fmt.Errorf("PodCertificateRequest %s/%s: %s (%s): %s", done.Namespace, done.Name, c.Type, c.Reason, c.Message)
	}
	chain, err := pemcert.Parse([]byte(done.Status.CertificateChain))
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "\nPodCertificateRequest %s/%s for pod %s/%s on node %s: Issued in %s (create → Issued seen by the node)\n",
		done.Namespace, done.Name, w.Pod.Namespace, w.Pod.Name, w.Node.Name, latency.Round(time.Millisecond))
	fmt.Fprintf(out, "  notBefore %s, beginRefreshAt %s, notAfter %s\n",
		done.Status.NotBefore.UTC().Format(time.RFC3339), done.Status.BeginRefreshAt.UTC().Format(time.RFC3339), done.Status.NotAfter.UTC().Format(time.RFC3339))
	return chain, nil
}

// demoRBAC renders the RBAC (deploy/rbac) for exactly the signer names the
// demo configures: the signer's and approver's, and the token service's.
func demoRBAC() ([]byte, error) {
	cfg := &config.SignerConfiguration{Signers: []config.Signer{{Name: demoSigner, Profile: config.ProfilePodIdentity}, demoDaemonSignerConfig()}}
	s, a := rbac.FromSignerConfig(cfg), rbac.ApproverFromSignerConfig(cfg)
	return rbac.RenderYAML(rbac.Input{Namespace: rbac.DefaultNamespace, Signer: &s, Approver: &a,
		TokenService:   &rbac.TokenServiceInput{SignerName: demoTokenSigner, TrustPublisher: true},
		AuthorityNames: map[string]string{demoSigner: demoAuthority, demoTokenSigner: demoTokenAuthority}})
}
