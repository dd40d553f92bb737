package app

import (
	"context"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/deploy"
	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/internal/softhsm"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
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
}

func newDemoCommand() *cobra.Command {
	o := &demoOptions{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run keyward's whole life cycle locally: kube-apiserver + etcd, SoftHSM2, signer, a node asking for a pod certificate",
		Long: `demo starts a kube-apiserver and etcd on loopback (Node,RBAC authorization,
NodeRestriction admission) and applies keyward's RBAC; makes a SoftHSM2 token
and a CA key inside it; runs the signer under its own service account; creates
a pod with a podCertificate volume and, playing its node, requests the pod's
certificate; prints the issued chain and how long it took. Everything keeps
running until Ctrl-C, then everything it made is removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return runDemo(ctx, cmd.OutOrStdout(), o)
		},
	}
	cmd.Flags().StringVar(&o.dir, "dir", "", "directory for kubeconfigs and the SoftHSM token (default: a new temp dir, removed on exit)")
	cmd.Flags().BoolVar(&o.once, "once", false, "stop as soon as everything is up (for CI smoke runs)")
	return cmd
}

func runDemo(ctx context.Context, out io.Writer, o *demoOptions) error {
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
	manifest, err := deploy.Base.ReadFile("base/rbac.yaml")
	if err != nil {
		return err
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		return fmt.Errorf("applying deploy/base/rbac.yaml: %w", err)
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

	// The CA key is made inside the token and never leaves it.
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		return err
	}
	defer reg.Close()
	caKey, err := reg.CreateKey(ctx, backends.CreateKeyRequest{
		URI:       "pkcs11:token=" + token.Label + ";object=demo-ca?module-path=" + token.ModulePath + "&pin-source=file:" + token.PINFile,
		Algorithm: backends.ECDSAP256SHA256,
	})
	if err != nil {
		return fmt.Errorf("creating the CA key in SoftHSM: %w", err)
	}
	root, err := authority.SelfSignRoot(ctx, caKey, authority.RootOptions{CommonName: "keyward demo CA", Lifetime: 365 * 24 * time.Hour})
	if err != nil {
		return err
	}
	rootPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.crt"), rootPEM, 0o644); err != nil {
		return err
	}
	fmt.Fprintf(out, "CA key created in SoftHSM (non-extractable): %s\n  fingerprint sha256:%s\n", caKey.URI(), caKey.Fingerprint())

	// The CA lives in the cluster, in the signer name's Authority: one
	// generation, Active. The trust publisher makes a generation Active
	// (status) once it runs here; until it is wired in, the demo applies
	// that status itself, as the trust publisher's bootstrap would.
	authorities, err := controlplane.InstallAuthorityCRD(ctx, cp.AdminConfig())
	if err != nil {
		return err
	}
	if _, err := controlplane.ActiveAuthority(ctx, authorities, "demo", demoSigner, demoGeneration, caKey.URI(), string(rootPEM)); err != nil {
		return err
	}
	fmt.Fprintf(out, "Authority demo (keyward.dev/v1alpha1) for %s: generation %s Active\n", demoSigner, demoGeneration)

	// The signer, as `keyward signer --config` would run it.
	off := false
	cfg := &config.SignerConfiguration{
		APIVersion: config.APIVersion, Kind: config.Kind,
		KubeClient:     config.KubeClient{Kubeconfig: signerKubeconfig},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		LeaderElection: config.LeaderElection{Enabled: &off},
		Signers:        []config.Signer{{Name: demoSigner, Profile: config.ProfilePodIdentity}},
	}
	cfg.Default()
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
			Ready: func(m, h string) { addrs <- [2]string{m, h} }})
	}()
	defer func() { stopSigner(); <-signerDone }()
	var a [2]string
	select {
	case a = <-addrs:
	case err := <-signerDone:
		return fmt.Errorf("signer: %w", err)
	}
	fmt.Fprintf(out, "signer running for %s: metrics http://%s/metrics, health http://%s/readyz, log %s\n", demoSigner, a[0], a[1], logFile.Name())

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
	subjectKey, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		return err
	}
	req, err := nodehelper.NewPodCertificateRequest(nodehelper.PodRef{
		Namespace: w.Pod.Namespace, Name: w.Pod.Name, UID: w.Pod.UID,
		ServiceAccountName: w.ServiceAccount.Name, ServiceAccountUID: w.ServiceAccount.UID,
		NodeName: w.Node.Name, NodeUID: w.Node.UID,
	}, demoSigner, subjectKey, nodehelper.PodCertificateOptions{})
	if err != nil {
		return err
	}
	began := time.Now()
	created, err := node.CertificatesV1().PodCertificateRequests(req.Namespace).Create(ctx, req, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("node creating PodCertificateRequest: %w", err)
	}
	waitCtx, cancelWait := context.WithTimeout(ctx, time.Minute)
	defer cancelWait()
	done, err := nodehelper.WaitForTerminal(waitCtx, node, created)
	if err != nil {
		return err
	}
	latency := time.Since(began)
	c := done.Status.Conditions[0]
	if c.Type != "Issued" {
		return fmt.Errorf("PodCertificateRequest %s/%s: %s (%s): %s", done.Namespace, done.Name, c.Type, c.Reason, c.Message)
	}
	chain, err := signer.ParseCertificates([]byte(done.Status.CertificateChain))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nPodCertificateRequest %s/%s for pod demo/demo-app on node demo-node: Issued in %s (create → Issued seen by the node)\n",
		done.Namespace, done.Name, latency.Round(time.Millisecond))
	fmt.Fprintf(out, "  notBefore %s, beginRefreshAt %s, notAfter %s\n",
		done.Status.NotBefore.UTC().Format(time.RFC3339), done.Status.BeginRefreshAt.UTC().Format(time.RFC3339), done.Status.NotAfter.UTC().Format(time.RFC3339))
	describeChain(out, chain)
	fmt.Fprintln(out)

	if o.once {
		fmt.Fprintln(out, "--once: stopping")
		return nil
	}
	fmt.Fprintln(out, "press Ctrl-C to stop and remove everything")
	<-ctx.Done()
	fmt.Fprintln(out, "stopping ...")
	return nil
}
