package softhsmtests

import (
	"context"
	"crypto/ecdsa"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/config"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// On clusters that serve PodCertificateRequests only in v1beta1 (1.35,
// 1.36), keyward reads both key forms: stubPKCS10Request, and the older
// pkixPublicKey + proofOfPossession.
func TestV1beta1RequestsInBothKeyForms(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "b")
	name := "keyward.dev/beta-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	runSignerVersion(t, baseConfig(t, signerConfig(name, config.ProfilePodIdentity, keyURI, caFile)), "replica-0", "v1beta1")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	node := nodeClient(t, w.Node.Name)

	for _, form := range []string{"stubPKCS10Request", "pkixPublicKey+proofOfPossession"} {
		t.Run(form, func(t *testing.T) {
			key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
			if err != nil {
				t.Fatal(err)
			}
			v1, err := nodehelper.NewPodCertificateRequest(podRef(w), name, key, nodehelper.PodCertificateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p := &certv1beta1.PodCertificateRequest{
				ObjectMeta: v1.ObjectMeta,
				Spec: certv1beta1.PodCertificateRequestSpec{
					SignerName: name, PodName: v1.Spec.PodName, PodUID: v1.Spec.PodUID,
					ServiceAccountName: v1.Spec.ServiceAccountName, ServiceAccountUID: v1.Spec.ServiceAccountUID,
					NodeName: v1.Spec.NodeName, NodeUID: v1.Spec.NodeUID,
				},
			}
			if form == "stubPKCS10Request" {
				p.Spec.StubPKCS10Request = v1.Spec.StubPKCS10Request
			} else {
				p.Spec.PKIXPublicKey, _ = x509.MarshalPKIXPublicKey(key.Public())
				digest := sha256.Sum256([]byte(p.Spec.PodUID))
				p.Spec.ProofOfPossession, err = ecdsa.SignASN1(rand.Reader, key.(*ecdsa.PrivateKey), digest[:])
				if err != nil {
					t.Fatal(err)
				}
			}
			created, err := node.CertificatesV1beta1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("node creating v1beta1 PCR: %v", err)
			}
			var got *certv1beta1.PodCertificateRequest
			err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err = cp.AdminClient().CertificatesV1beta1().PodCertificateRequests(p.Namespace).Get(ctx, created.Name, metav1.GetOptions{})
				return err == nil && len(got.Status.Conditions) > 0, err
			})
			if err != nil {
				t.Fatalf("no status: %v", err)
			}
			if c := got.Status.Conditions[0]; c.Type != "Issued" {
				t.Fatalf("%s/%s: %s", c.Type, c.Reason, c.Message)
			}
			leaf := parseChain(t, got.Status.CertificateChain, root)
			want, _ := x509.MarshalPKIXPublicKey(key.Public())
			if string(leaf.RawSubjectPublicKeyInfo) != string(want) {
				t.Fatal("leaf is not for the requested key")
			}
		})
	}
}
