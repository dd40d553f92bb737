package demo

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"github.com/keyward/keyward/internal/pemcert"
	"io"
	"os"
	"path/filepath"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// The demo's custom CSR signer name, the node daemon that asks it for a
// client certificate, and the group that may.
const (
	demoDaemonSigner     = "keyward.dev/node-daemons"
	demoDaemonAuthority  = "keyward.dev.node-daemons"
	demoDaemonGeneration = "daemons-1"
	demoDaemonUser       = "node-daemon:demo-node:log-shipper"
	demoDaemonGroup      = "keyward.dev:node-daemons"
	demoDaemonName       = "log-shipper.demo-node"
)

// demoDaemonSignerConfig is keyward.dev/node-daemons in the signer's
// configuration: KEP-1513's properties as the csr profile's rules, and who
// keyward's approver lets ask.
func demoDaemonSignerConfig() config.Signer {
	return config.Signer{
		Name: demoDaemonSigner, Profile: config.ProfileCSR,
		CSR: &config.CSRPolicy{
			TrustDistribution: "ClusterTrustBundle keyward.dev:node-daemons:live",
			CommonNames:       []string{"*.demo-node"},
			DNSNames:          []string{"*.demo-node"},
			KeyUsages:         []string{string(certv1.UsageDigitalSignature), string(certv1.UsageClientAuth)},
		},
		Approval: &config.Approval{Groups: []string{demoDaemonGroup}},
	}
}

// caInitDaemons is `keyward ca init` for keyward.dev/node-daemons' own CA,
// its key in the token beside the pod signer's.
func (c demoCLI) caInitDaemons(ctx context.Context, keyURI string) error {
	return c.run(ctx, "ca", "init", "--signer", demoDaemonSigner, "--generation", demoDaemonGeneration,
		"--create-key", "--key-uri", keyURI, "--pkcs11-module", c.module,
		"--subject", "CN=keyward demo node-daemons CA", "--lifetime", "8760h")
}

// waitDaemonsActive waits until the trust publisher shows the node-daemons
// generation Active.
func waitDaemonsActive(ctx context.Context, ac *authclient.Client) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		a, err := ac.Get(ctx, demoDaemonAuthority)
		if err != nil {
			return false, nil // transient: poll again
		}
		st, ok := statusOf(a, demoDaemonGeneration)
		return ok && st.Phase == v1alpha1.PhaseActive, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Authority %s to show %s Active: %w", demoDaemonAuthority, demoDaemonGeneration, err)
	}
	return nil
}

// requestDaemonCertificate plays a node daemon (log-shipper on demo-node,
// authenticated as its own user in group keyward.dev:node-daemons): it
// makes a key and a CSR for keyward.dev/node-daemons with client-go's CSR
// helpers (kubelet's own), waits for approval and keyward's signature, and
// returns the issued chain, leaf first.
func requestDaemonCertificate(ctx context.Context, out io.Writer, cp *controlplane.ControlPlane) ([]*x509.Certificate, error) {
	admin := cp.AdminClient()
	// What a cluster admin grants node daemons: to ask for certificates.
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "node-daemons-csr"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{certv1.GroupName}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get", "list", "watch"}}},
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating ClusterRole %s: %w", role.Name, err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: demoDaemonGroup}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating ClusterRoleBinding %s: %w", role.Name, err)
	}
	daemonCfg, err := cp.UserConfig(demoDaemonUser, demoDaemonGroup, "system:authenticated")
	if err != nil {
		return nil, err
	}
	daemon, err := kubernetes.NewForConfig(daemonCfg)
	if err != nil {
		return nil, err
	}

	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: demoDaemonName}, DNSNames: []string{demoDaemonName},
	}, key)
	if err != nil {
		return nil, fmt.Errorf("making the node daemon's PKCS#10 request: %w", err)
	}
	lifetime := 24 * time.Hour
	began := time.Now()
	name, uid, err := csr.RequestCertificateWithContext(ctx, daemon, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		"", demoDaemonSigner, &lifetime, []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, key)
	if err != nil {
		return nil, fmt.Errorf("node daemon creating its CertificateSigningRequest: %w", err)
	}
	approvedBy, err := waitApproved(ctx, daemon, name)
	if err != nil {
		return nil, err
	}
	waitCtx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	certPEM, err := csr.WaitForCertificate(waitCtx, daemon, name, uid)
	if err != nil {
		return nil, fmt.Errorf("waiting for CertificateSigningRequest %s: %w", name, err)
	}
	latency := time.Since(began)
	chain, err := pemcert.Parse(certPEM)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "\nCertificateSigningRequest %s by %s (node daemon, group %s) for %s: %s, certificate issued in %s (create → certificate seen by the daemon)\n",
		name, demoDaemonUser, demoDaemonGroup, demoDaemonSigner, approvedBy, latency.Round(time.Millisecond))
	return chain, nil
}

// startDemoApprover runs `keyward approver` on the demo's configuration as
// its own service account (keyward/keyward-approver, whose RBAC demoRBAC
// rendered for the demo's names) until ctx ends; the returned function
// stops it and waits.
func startDemoApprover(ctx context.Context, out io.Writer, cp *controlplane.ControlPlane, cfg *config.SignerConfiguration, dir string) (func(), error) {
	saCfg, err := cp.ServiceAccountConfig("keyward", "keyward-approver")
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "approver.kubeconfig")
	if err := controlplane.WriteKubeconfig(saCfg, "keyward-approver", kubeconfig); err != nil {
		return nil, err
	}
	acfg := *cfg
	acfg.KubeClient.Kubeconfig = kubeconfig
	logFile, err := os.Create(filepath.Join(dir, "approver.log"))
	if err != nil {
		return nil, err
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile)))
	ctx, cancel := context.WithCancel(klog.NewContext(ctx, logger))
	done := make(chan error, 1)
	addrs := make(chan [2]string, 1)
	go func() {
		done <- approver.Run(ctx, approver.RunOptions{Config: &acfg, Identity: "demo-approver",
			Ready: func(m, h string) { addrs <- [2]string{m, h} }})
	}()
	stop := func() { cancel(); <-done; logFile.Close() }
	select {
	case a := <-addrs:
		fmt.Fprintf(out, "approver running as keyward/keyward-approver (no keys) for %s: metrics http://%s/metrics, health http://%s/readyz, log %s\n",
			demoDaemonSigner, a[0], a[1], logFile.Name())
		return stop, nil
	case err := <-done:
		cancel()
		logFile.Close()
		return nil, fmt.Errorf("approver: %w", err)
	}
}

// waitApproved waits for the approver's decision on CSR name and describes
// it.
func waitApproved(ctx context.Context, client kubernetes.Interface, name string) (string, error) {
	var decided *certv1.CertificateSigningRequestCondition
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		c, err := client.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil // transient: poll again
		}
		for i, cond := range c.Status.Conditions {
			if cond.Type == certv1.CertificateApproved || cond.Type == certv1.CertificateDenied {
				decided = &c.Status.Conditions[i]
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("waiting for the approver to decide CertificateSigningRequest %s: %w", name, err)
	}
	if decided.Type != certv1.CertificateApproved {
		return "", fmt.Errorf("CertificateSigningRequest %s: %s (%s): %s", name, decided.Type, decided.Reason, decided.Message)
	}
	return fmt.Sprintf("Approved by keyward approver (%s: %s)", decided.Reason, decided.Message), nil
}
