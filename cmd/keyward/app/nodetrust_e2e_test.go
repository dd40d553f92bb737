package app

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/trust"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// keyward node trust, run as a node identity against a real apiserver,
// writes the selected bundle's certificates and runs its --on-change hook.
func TestNodeTrustCommandProjectsAndRunsHook(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(cp.Stop)

	const signer = "keyward.dev/cmd-test"
	ca := trust.Merge([]byte(testCAPEM(t)))
	ctb := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "keyward.dev:cmd-test:live", Labels: map[string]string{"keyward.dev/cluster-trust-bundle-version": "live"}},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: "junk before\n" + string(ca)},
	}
	if _, err := cp.AdminClient().CertificatesV1().ClusterTrustBundles().Create(ctx, ctb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := cp.NodeConfig("node-a")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "node.kubeconfig")
	if err := controlplane.WriteKubeconfig(nodeCfg, "system:node:node-a", kubeconfig); err != nil {
		t.Fatal(err)
	}
	out, marker := filepath.Join(dir, "trust"), filepath.Join(dir, "hook-ran")

	cmd := newNodeTrustCommand()
	cmd.SetArgs([]string{"--kubeconfig", kubeconfig, "--signer-name", signer, "--dir", out, "--mode", "0640", "--on-change", "touch " + marker, "--on-change-debounce", "100ms"})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(runCtx) }()

	file := filepath.Join(out, trust.DefaultFileName)
	for {
		got, _ := os.ReadFile(file)
		_, hookErr := os.Stat(marker)
		if bytes.Equal(got, ca) && hookErr == nil {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("command ended: %v", err)
		case <-ctx.Done():
			t.Fatalf("file %q, hook marker %v: want the CA and the hook run", got, hookErr)
		case <-time.After(50 * time.Millisecond):
		}
	}
	if fi, err := os.Stat(file); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("trust file mode %v (%v), want 0640", fi.Mode(), err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("command after its context ended: %v", err)
	}
}

func testCAPEM(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node trust test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}
