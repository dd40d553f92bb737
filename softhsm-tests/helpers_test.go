package softhsmtests

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"math/big"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// uniqueName turns the test's name into a DNS label with a random suffix, so
// that tests sharing one control plane never see each other's objects.
func uniqueName(t testing.TB, prefix string) string {
	t.Helper()
	s := strings.ToLower(regexp.MustCompile(`[^A-Za-z0-9]+`).ReplaceAllString(t.Name(), "-"))
	if len(s) > 30 {
		s = s[:30]
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return strings.Trim(prefix+"-"+s, "-") + "-" + hex.EncodeToString(b)
}

func testContext(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// podOnNode makes a namespace, node, service account and a pod bound to the
// node that mounts a podCertificate volume for each of signerNames.
func podOnNode(t testing.TB, ctx context.Context, node string, signerNames ...string) *controlplane.WorkloadObjects {
	t.Helper()
	w, err := controlplane.CreateWorkload(ctx, cp.AdminClient(), controlplane.Workload{
		Namespace:      uniqueName(t, "ns"),
		Node:           node,
		ServiceAccount: "workload",
		Pod:            "app",
		SignerNames:    signerNames,
	})
	if err != nil {
		t.Fatalf("creating workload: %v", err)
	}
	return w
}

// newPCR builds the PodCertificateRequest kubelet would create for w, with a
// fresh P-256 subject key, and returns it with that key.
func newPCR(t testing.TB, w *controlplane.WorkloadObjects, signerName string) (*certv1.PodCertificateRequest, crypto.Signer) {
	t.Helper()
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	p, err := nodehelper.NewPodCertificateRequest(podRef(w), signerName, key, nodehelper.PodCertificateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return p, key
}

func podRef(w *controlplane.WorkloadObjects) nodehelper.PodRef {
	return nodehelper.PodRef{
		Namespace: w.Pod.Namespace, Name: w.Pod.Name, UID: w.Pod.UID,
		ServiceAccountName: w.ServiceAccount.Name, ServiceAccountUID: w.ServiceAccount.UID,
		NodeName: w.Node.Name, NodeUID: w.Node.UID,
	}
}

// testCA is a CA held in memory, standing in for the signer until the
// authority exists; what is under test here is the apiserver's judgement.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  string
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "keyward test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

// issue signs a leaf for pub valid from notBefore for lifetime and returns
// the PEM chain (leaf, CA) and the parsed leaf.
func (ca *testCA) issue(t testing.TB, pub crypto.PublicKey, notBefore time.Time, lifetime time.Duration) (string, *x509.Certificate) {
	t.Helper()
	notBefore = notBefore.Truncate(time.Second)
	serial, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    notBefore,
		NotAfter:     notBefore.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	leaf, _ := x509.ParseCertificate(der)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) + ca.pem, leaf
}

// issuedStatus is the status a signer writes for leaf: one Issued condition
// and times equal to the leaf's, refresh half way through.
func issuedStatus(chain string, leaf *x509.Certificate) certv1.PodCertificateRequestStatus {
	refresh := leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) / 2)
	return certv1.PodCertificateRequestStatus{
		Conditions: []metav1.Condition{{
			Type:               certv1.PodCertificateRequestConditionTypeIssued,
			Status:             metav1.ConditionTrue,
			Reason:             "Issued",
			Message:            "issued by the keyward test CA",
			LastTransitionTime: metav1.Now(),
		}},
		CertificateChain: chain,
		NotBefore:        ptrTime(leaf.NotBefore),
		BeginRefreshAt:   ptrTime(refresh),
		NotAfter:         ptrTime(leaf.NotAfter),
	}
}

func ptrTime(t time.Time) *metav1.Time {
	mt := metav1.NewTime(t)
	return &mt
}
