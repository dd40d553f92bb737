package softhsmtests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"path/filepath"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/credbundle"
	"github.com/keyward/keyward/signer/config"
)

// apiserverClientBundle has keyward sign a kubernetes.io/kube-apiserver-client
// certificate for user (approved by the test: keyward's approver never
// approves that signer name) and returns the KEP-4317 bundle (PRIVATE KEY,
// then the leaf) and the pair.
func apiserverClientBundle(t *testing.T, ctx context.Context, root *x509.Certificate, user string) ([]byte, *tls.Certificate) {
	t.Helper()
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(nil, &x509.CertificateRequest{Subject: pkix.Name{CommonName: user}}, key)
	if err != nil {
		t.Fatal(err)
	}
	c, err := cp.AdminClient().CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: uniqueName(t, "credbundle-csr")},
		Spec: certv1.CertificateSigningRequestSpec{
			SignerName: certv1.KubeAPIServerClientSignerName,
			Usages:     usages(certv1.UsageDigitalSignature, certv1.UsageClientAuth),
			Request:    pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("creating CSR: %v", err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CertificatesV1().CertificateSigningRequests().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
	})
	approve(t, ctx, c)
	leaf := csrLeaf(t, waitCSRDone(t, ctx, c), root)
	keyPEM, err := nodehelper.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	return append(keyPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})...),
		&tls.Certificate{Certificate: [][]byte{leaf.Raw}, PrivateKey: key, Leaf: leaf}
}

// A client-go client built by credbundle.RESTConfig authenticates to the
// real apiserver with a bundle file holding a certificate keyward signed
// for kubernetes.io/kube-apiserver-client (the apiserver's --client-ca-file
// trusting keyward's root in SoftHSM). When the bundle is rotated on disk
// and the credential has loaded it, the next request authenticates as the
// new certificate's user, though the client's HTTP/2 connection made with
// the old one is still open.
func TestCredbundleRESTConfigFollowsRotation(t *testing.T) {
	ctx := testContext(t)
	signerName := certv1.KubeAPIServerClientSignerName
	grantSigner(t, ctx, signerName, "sign")
	root := kubeletSignerCA(t, signerName, "apiserver-client-ca")
	runSigner(t, kubeletSignerConfig(t, config.ProfileKubeAPIServerClient), "apiserver-client-signer")

	userA, userB := uniqueName(t, "bundle-user-a"), uniqueName(t, "bundle-user-b")
	bundleA, certA := apiserverClientBundle(t, ctx, root, userA)
	trustClientCA(t, ctx, root, certA, userA)

	dir := t.TempDir()
	keep := atomicdir.Options{UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner}
	write := func(b []byte) {
		t.Helper()
		if err := atomicdir.Write(dir, map[string]atomicdir.File{"credential-bundle.pem": {Data: b, Mode: 0o600}}, keep); err != nil {
			t.Fatal(err)
		}
	}
	write(bundleA)
	cred, err := credbundle.New(credbundle.Options{BundleFile: filepath.Join(dir, "credential-bundle.pem"), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go cred.Run(runCtx)

	admin := cp.AdminConfig()
	cfg, err := credbundle.RESTConfig(admin.Host, admin.CAData, cred)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	whoami := func() string {
		t.Helper()
		r, err := client.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("SelfSubjectReview with the bundle: %v", err)
		}
		return r.Status.UserInfo.Username
	}
	for i := 0; i < 2; i++ {
		if got := whoami(); got != userA {
			t.Fatalf("request %d authenticates as %q, want %q", i, got, userA)
		}
	}

	bundleB, certB := apiserverClientBundle(t, ctx, root, userB)
	write(bundleB)
	err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		cur := cred.Current()
		return cur != nil && cur.Leaf.Equal(certB.Leaf), nil
	})
	if err != nil {
		t.Fatalf("the credential did not load the rotated bundle: %v", err)
	}
	for i := 0; i < 2; i++ {
		if got := whoami(); got != userB {
			t.Fatalf("request %d after the rotation authenticates as %q, want %q", i, got, userB)
		}
	}
}
