package app

// The demo files (demo*.go) are the one deliberate exception to "production
// code never imports testsupport": the demo runs the tests' control plane and
// SoftHSM2 tokens for a person to watch. They are to leave cmd/ for a package
// of their own.

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
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/deploy/rbac"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/softhsm"
	"github.com/spf13/cobra"
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

type demoOptions struct {
	dir  string
	once bool
	// registryBinary is Distribution's registry (bin/registry, `make
	// registry`); empty: "registry" beside the keyward binary, else on PATH.
	registryBinary string
	// plugin runs `keyward credential-provider` (its first element is the
	// executable); empty: this executable.
	plugin []string
	// beforeStop, with once, is called after the rotation while every
	// component still runs (tests read what the demo left in the cluster,
	// its logs and metrics).
	beforeStop func(ctx context.Context, r demoRunning) error
}

// demoRunning is what beforeStop may look at.
type demoRunning struct {
	// dir holds the components' logs (*.log); controlPlaneDir etcd's and
	// kube-apiserver's.
	dir, controlPlaneDir string
	token                *softhsm.Token
	// secrets are the credentials the demo obtained, by what they are.
	secrets *demoSecrets
}

// demoSecrets records credentials the demo obtains (service-account and
// registry tokens) so that a test can look for them where they must not
// be. A nil *demoSecrets records nothing.
type demoSecrets struct {
	mu     sync.Mutex
	byName map[string]string
}

func (s *demoSecrets) add(what, secret string) {
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

// all returns a copy of what was recorded.
func (s *demoSecrets) all() map[string]string {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byName)
}

func newDemoCommand() *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run keyward's whole life cycle locally: kube-apiserver + etcd, SoftHSM2, signer, a pod certificate, a CA rotation",
		Long: `demo starts a kube-apiserver and etcd on loopback (Node,RBAC authorization,
NodeRestriction admission) and applies keyward's RBAC; makes a SoftHSM2 token;
creates the CA generation demo-1 with keyward ca init (its key in the token);
runs the signer and its trust publisher under its own service account;
creates a pod with a podCertificate volume and, playing its node, requests
the pod's certificate; prints the issued chain and how long it took. A node
daemon then asks keyward.dev/node-daemons (a custom CSR signer name with its
own CA in the token) for a client certificate with a CertificateSigningRequest;
keyward approver, running beside the signer under its own service account,
approves it, and the demo prints its decision and the issued chain.

Then it rotates the CA canary-then-live to demo-2 with gates compressed to
seconds, running keyward ca init and keyward trust promote, activate, retire
and finish as an operator would, and prints at each phase the canary and
live ClusterTrustBundles as kubelet selects them, whether the pod's
certificates from before and after activation verify against live, and the
trust files the node helper's projection (keyward node trust) keeps on two
nodes, one labelled keyward.dev/trust-bundle=canary, the other live: the
canary node's file gains the new root first. The
LeavesValid gate cannot be compressed (a pod certificate lives at least 1h):
the demo shows retire refused by it, then forces it with a reason.

Everything keeps running until Ctrl-C (with --once it stops after the
rotation), then everything it made is removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return runDemo(ctx, cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.dir, "dir", "", "directory for kubeconfigs and the SoftHSM token (default: a new temp dir, removed on exit)")
	cmd.Flags().StringVar(&o.registryBinary, "registry-binary", "", "CNCF Distribution registry binary (default: registry beside keyward, else on PATH; make registry builds bin/registry)")
	cmd.Flags().BoolVar(&o.once, "once", false, "stop after the rotation instead of waiting for Ctrl-C (for CI smoke runs)")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, o *demoOptions) error {
	registryBin, plugin, err := demoBinaries(o)
	if err != nil {
		return err
	}
	dir := o.dir
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
	cli := demoCLI{out: out, kubeconfig: admin, module: token.ModulePath}
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
			AlsoLead: TrustPublisherCompanion(cfg),
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
	describeChain(out, chain)
	daemonChain, err := requestDaemonCertificate(ctx, out, cp)
	if err != nil {
		return err
	}
	describeChain(out, daemonChain)

	var secrets *demoSecrets
	if o.beforeStop != nil {
		secrets = &demoSecrets{}
	}
	stopRegistry, err := runRegistryDemo(ctx, demoRegistryEnv{
		out: out, dir: dir, cp: cp, cli: cli, authorities: authorities, token: token, backends: reg, node: node,
		registryBinary: registryBin, plugin: plugin, secrets: secrets,
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

	if o.once {
		if o.beforeStop != nil {
			if err := o.beforeStop(ctx, demoRunning{dir: dir, controlPlaneDir: cp.Dir, token: token, secrets: secrets}); err != nil {
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
func demoBinaries(o *demoOptions) (registryBin string, plugin []string, err error) {
	plugin = o.plugin
	exe, err := os.Executable()
	if err != nil {
		return "", nil, fmt.Errorf("finding the keyward executable: %w", err)
	}
	if len(plugin) == 0 {
		plugin = []string{exe}
	}
	registryBin = o.registryBinary
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
