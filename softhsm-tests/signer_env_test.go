package softhsmtests

import (
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/cmd/keyward/app"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// caInToken creates a CA key in the run's SoftHSM token through keyward's
// own pkcs11 backend and self-signs a root for it. It returns the key URI
// and the path of the root certificate.
func caInToken(t testing.TB, label string) (string, string, *x509.Certificate) {
	t.Helper()
	return newCA(t, all.Options{}, "pkcs11:token="+token.Label+";object="+label+"?module-path="+token.ModulePath+"&pin-source=file:"+token.PINFile, label)
}

// newCA creates an ECDSA P-256 key at createURI through a registry with
// opts and a root CA certificate for it; it returns the key's URI, the
// certificate's file and the certificate.
func newCA(t testing.TB, opts all.Options, createURI, name string) (string, string, *x509.Certificate) {
	t.Helper()
	return newCAPathLen(t, opts, createURI, name, 0)
}

// newCAPathLen is newCA with a root of basicConstraints pathLen (1 allows
// the in-memory intermediate of signers[].intermediate below it).
func newCAPathLen(t testing.TB, opts all.Options, createURI, name string, pathLen int) (string, string, *x509.Certificate) {
	t.Helper()
	reg, err := all.NewRegistry(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ctx := testContext(t)
	key, err := reg.CreateKey(ctx, backends.CreateKeyRequest{URI: createURI, Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatalf("creating CA key %s: %v", createURI, err)
	}
	defer key.Close()
	root, err := ca.SelfSign(ctx, key, ca.Options{Subject: pkix.Name{CommonName: name}, Lifetime: 30 * 24 * time.Hour, PathLen: pathLen})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".crt")
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	return key.URI(), path, root
}

// signerKubeconfig writes a kubeconfig for the signer's service account.
func signerKubeconfig(t testing.TB) string {
	t.Helper()
	cfg, err := cp.ServiceAccountConfig(signerNamespace, signerServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "signer.kubeconfig")
	if err := controlplane.WriteKubeconfig(cfg, "keyward-signer", path); err != nil {
		t.Fatal(err)
	}
	return path
}

// baseConfig is a configuration for the given signers, talking to the test
// apiserver as the signer's service account, without leader election.
func baseConfig(t testing.TB, signers ...config.Signer) *config.SignerConfiguration {
	t.Helper()
	off := false
	cfg := &config.SignerConfiguration{
		APIVersion: config.APIVersion, Kind: config.Kind,
		KubeClient:     config.KubeClient{Kubeconfig: signerKubeconfig(t), QPS: 500, Burst: 1000},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		LeaderElection: config.LeaderElection{Enabled: &off},
		// The tests stand in for the trust publisher (signerConfig applies
		// status phases); the rotation tests turn it on.
		TrustPublisher: config.TrustPublisher{Enabled: &off},
		Signers:        signers,
	}
	// Tests and benchmarks that are not about rate limits issue hundreds
	// of PCRs from one node: the shipped per-node default (5/s, burst 110)
	// would measure the limiter. A signer silent on it gets no per-node
	// bucket here; TestDefaultPerNodeLimitHoldsAFloodingNode unsets this.
	for i := range cfg.Signers {
		if r := &cfg.Signers[i].RateLimits; r.PerNode == nil {
			r.PerNode = &config.Rate{QPS: 1e6, Burst: 1 << 20}
		}
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatalf("test configuration invalid: %v", errs.ToAggregate())
	}
	return cfg
}

// runSigner runs keyward's signer in this process until the test ends (or
// stop is called) and waits until it is ready.
func runSigner(t testing.TB, cfg *config.SignerConfiguration, identity string) *runningSigner {
	t.Helper()
	// v1, as in a cluster that does not serve the deprecated v1beta1 (the
	// test control plane serves both, and discovery would choose v1beta1,
	// which shows both key forms). The v1beta1 tests and the process-based
	// replicas use discovery.
	return runSignerVersion(t, cfg, identity, pcr.V1)
}

// runningSigner is a signer started by runSigner.
type runningSigner struct {
	Stop                    func()
	MetricsAddr, HealthAddr string
	// LogPath is the signer's log (klog text, verbosity 2).
	LogPath string
}

// runSignerVersion is runSigner speaking a forced PodCertificateRequest
// API version ("" discovers).
func runSignerVersion(t testing.TB, cfg *config.SignerConfiguration, identity, version string) *runningSigner {
	t.Helper()
	return runSignerWith(t, cfg, identity, version, all.Options{})
}

// runSignerWith is runSignerVersion with backends configured by opts.
func runSignerWith(t testing.TB, cfg *config.SignerConfiguration, identity, version string, opts all.Options) *runningSigner {
	t.Helper()
	rs := startSigner(t, cfg, identity, version, opts)
	if err := waitReady(rs.HealthAddr); err != nil {
		t.Fatalf("signer %s not ready: %v", identity, err)
	}
	return rs
}

// startSigner is runSignerWith without waiting for /readyz: it returns once
// the listeners are bound.
func startSigner(t testing.TB, cfg *config.SignerConfiguration, identity, version string, opts all.Options) *runningSigner {
	t.Helper()
	return startSignerFull(t, cfg, identity, version, opts, 0)
}

// startSignerOpts is startSigner (discovering the API version) with the
// permission gate's recheck interval set.
func startSignerOpts(t testing.TB, cfg *config.SignerConfiguration, identity string, opts all.Options, recheck time.Duration) *runningSigner {
	t.Helper()
	return startSignerFull(t, cfg, identity, "", opts, recheck)
}

func startSignerFull(t testing.TB, cfg *config.SignerConfiguration, identity, version string, opts all.Options, recheck time.Duration) *runningSigner {
	t.Helper()
	reg, err := all.NewRegistry(opts)
	if err != nil {
		t.Fatal(err)
	}
	return startSignerRegistry(t, cfg, identity, version, reg, recheck)
}

// startSignerRegistry is startSigner opening keys through reg (closed when
// the signer stops).
func startSignerRegistry(t testing.TB, cfg *config.SignerConfiguration, identity, version string, reg *backends.Registry, recheck time.Duration) *runningSigner {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), identity+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(2)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	addrs := make(chan [2]string, 1)
	go func() {
		done <- signer.Run(ctx, signer.Options{Config: cfg, Backends: reg, Identity: identity, PodCertificateVersion: version, PermissionRecheck: recheck,
			AlsoLead: app.TrustPublisherCompanion(cfg),
			Ready:    func(metrics, health string) { addrs <- [2]string{metrics, health} }})
	}()
	var once bool
	stop := func() {
		if once {
			return
		}
		once = true
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Logf("signer %s stopped: %v", identity, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("signer %s did not stop within 30s", identity)
		}
		reg.Close()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("signer %s log:\n%s", identity, b)
		}
	}
	t.Cleanup(stop)
	select {
	case a := <-addrs:
		return &runningSigner{Stop: stop, MetricsAddr: a[0], HealthAddr: a[1], LogPath: logPath}
	case err := <-done:
		t.Fatalf("signer %s exited: %v", identity, err)
	}
	return nil
}

func waitReady(healthAddr string) error {
	return wait.PollUntilContextTimeout(context.Background(), 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		return httpOK("http://"+healthAddr+"/readyz") == nil, nil
	})
}

// pcrOptions vary the request newPCRFor builds.
type pcrOptions struct {
	keyType              string
	annotations          map[string]string
	maxExpirationSeconds *int32
}

// createPCR has the node create a PCR for w's pod and returns it and the key.
func createPCR(t testing.TB, ctx context.Context, w *controlplane.WorkloadObjects, signerName string, o pcrOptions) (*certv1.PodCertificateRequest, crypto.Signer) {
	t.Helper()
	created, key, err := tryCreatePCR(ctx, nodeClient(t, w.Node.Name), w, signerName, o)
	if err != nil {
		t.Fatal(err)
	}
	return created, key
}

// tryCreatePCR is createPCR for goroutines: it returns its error instead
// of failing the test (t.Fatal must run on the test's goroutine).
func tryCreatePCR(ctx context.Context, node kubernetes.Interface, w *controlplane.WorkloadObjects, signerName string, o pcrOptions) (*certv1.PodCertificateRequest, crypto.Signer, error) {
	if o.keyType == "" {
		o.keyType = nodehelper.KeyTypeECDSAP256
	}
	key, err := nodehelper.GenerateKey(o.keyType)
	if err != nil {
		return nil, nil, err
	}
	pcr, err := nodehelper.NewPodCertificateRequest(podRef(w), signerName, key, nodehelper.PodCertificateOptions{
		MaxExpirationSeconds: o.maxExpirationSeconds, Annotations: o.annotations,
	})
	if err != nil {
		return nil, nil, err
	}
	// NodeRestriction reads pods from kube-apiserver's informer cache: a
	// pod created a moment ago may not be there yet ("pod … not found").
	// Retry that for a few seconds; any other refusal is returned at once.
	var created *certv1.PodCertificateRequest
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		created, err = node.CertificatesV1().PodCertificateRequests(pcr.Namespace).Create(ctx, pcr, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), "while retrieving pod") || !strings.Contains(err.Error(), "not found") || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("node creating PCR: %w", err)
	}
	return created, key, nil
}

// waitTerminal polls until the PCR has a terminal condition.
func waitTerminal(t testing.TB, ctx context.Context, p *certv1.PodCertificateRequest, timeout time.Duration) *certv1.PodCertificateRequest {
	t.Helper()
	var got *certv1.PodCertificateRequest
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		var err error
		got, err = cp.AdminClient().CertificatesV1().PodCertificateRequests(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return len(got.Status.Conditions) > 0, nil
	})
	if err != nil {
		t.Fatalf("PCR %s/%s has no terminal status after %s: %v (status %+v)", p.Namespace, p.Name, timeout, err, got.Status)
	}
	return got
}

func condition(p *certv1.PodCertificateRequest) metav1.Condition {
	if len(p.Status.Conditions) != 1 {
		panic(fmt.Sprintf("want exactly one condition, got %+v", p.Status.Conditions))
	}
	return p.Status.Conditions[0]
}
