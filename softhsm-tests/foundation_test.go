package softhsmtests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/keyward/keyward/testsupport/controlplane"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

const testSigner = "keyward.dev/foundation"

// A node creates a PCR for its own pod; the signer's identity, holding only
// the shipped RBAC, writes an Issued status that the apiserver accepts.
func TestNodeRequestIsIssuedBySignerIdentity(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node-a")
	w := podOnNode(t, ctx, node, testSigner)
	pcr, key := newPCR(t, w, testSigner)

	created, err := nodeClient(t, node).CertificatesV1().PodCertificateRequests(pcr.Namespace).Create(ctx, pcr, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("node creating PCR for its own pod: %v", err)
	}

	ca := newTestCA(t)
	chain, leaf := ca.issue(t, key.Public(), time.Now().Add(-2*time.Minute), 2*time.Hour)
	created.Status = issuedStatus(chain, leaf)

	// The node may not write status: only a signer may.
	if _, err := nodeClient(t, node).CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("node writing status: got %v, want Forbidden", err)
	}

	updated, err := signerClient(t).CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("signer writing Issued status: %v", err)
	}
	got, err := cp.AdminClient().CertificatesV1().PodCertificateRequests(pcr.Namespace).Get(ctx, updated.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 1 || got.Status.Conditions[0].Type != certv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("conditions = %+v, want one Issued", got.Status.Conditions)
	}
	block, _ := pem.Decode([]byte(got.Status.CertificateChain))
	if block == nil {
		t.Fatal("stored chain has no PEM block")
	}
	stored, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	wantPub, _ := x509.MarshalPKIXPublicKey(key.Public())
	if !bytes.Equal(stored.RawSubjectPublicKeyInfo, wantPub) {
		t.Error("stored leaf is not for the requested key")
	}
	if !got.Status.NotAfter.Time.Equal(leaf.NotAfter) {
		t.Errorf("notAfter = %v, want %v", got.Status.NotAfter, leaf.NotAfter)
	}

	// A terminal status is immutable, even for the signer.
	got.Status.Conditions[0].Message = "changed"
	if _, err := signerClient(t).CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{}); err == nil {
		t.Fatal("second status write after Issued was accepted; want it refused")
	}
}

// kube-apiserver refuses a notBefore more than 5 minutes from its clock.
func TestStaleNotBeforeIsRejected(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node-a")
	w := podOnNode(t, ctx, node, testSigner)
	pcr, key := newPCR(t, w, testSigner)
	created, err := nodeClient(t, node).CertificatesV1().PodCertificateRequests(pcr.Namespace).Create(ctx, pcr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	chain, leaf := newTestCA(t).issue(t, key.Public(), time.Now().Add(-10*time.Minute), 2*time.Hour)
	created.Status = issuedStatus(chain, leaf)
	_, err = signerClient(t).CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Fatalf("status with a 10-minute-old notBefore: got %v, want Invalid", err)
	}
	if !strings.Contains(err.Error(), "within 5 minutes") {
		t.Errorf("rejection %q does not give the 5-minute rule", err)
	}
}

// NodeRestriction admits a PCR only from the pod's own node, for a signer the
// pod mounts a podCertificate volume for.
func TestNodeRestrictionRefusesForeignRequests(t *testing.T) {
	ctx := testContext(t)
	nodeA := uniqueName(t, "node-a")
	nodeB := uniqueName(t, "node-b")
	w := podOnNode(t, ctx, nodeA, testSigner)
	nodeBObj, err := controlplane.EnsureNode(ctx, cp.AdminClient(), nodeB)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name   string
		caller string
		mutate func(*certv1.PodCertificateRequest)
	}{
		{name: "another node asks for the pod's certificate", caller: nodeB},
		{name: "another node names itself in the request", caller: nodeB, mutate: func(p *certv1.PodCertificateRequest) {
			p.Spec.NodeName = types.NodeName(nodeBObj.Name)
			p.Spec.NodeUID = nodeBObj.UID
		}},
		{name: "the pod's node asks for a signer the pod does not mount", caller: nodeA, mutate: func(p *certv1.PodCertificateRequest) {
			p.Spec.SignerName = "keyward.dev/not-mounted"
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pcr, _ := newPCR(t, w, testSigner)
			if tc.mutate != nil {
				tc.mutate(pcr)
			}
			_, err := nodeClient(t, tc.caller).CertificatesV1().PodCertificateRequests(pcr.Namespace).Create(ctx, pcr, metav1.CreateOptions{})
			if !apierrors.IsForbidden(err) {
				t.Fatalf("got %v, want Forbidden", err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// ClusterTrustBundles labelled canary and live are found by consumers with a
// spec.signerName field selector plus a label selector. The bundles are
// written by an identity holding only `attest` and ClusterTrustBundle
// writes, the grant a trust publisher needs.
func TestClusterTrustBundlesSelectedBySignerAndLabel(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "ctb")
	signer := "keyward.dev/" + suffix
	other := "keyward.dev/" + suffix + "-other"
	const versionLabel = "keyward.dev/cluster-trust-bundle-version"
	ca := newTestCA(t)

	signerCS := trustPublisherClient(t)
	for _, v := range []string{"canary", "live"} {
		for _, s := range []string{signer, other} {
			ctb := &certv1.ClusterTrustBundle{
				ObjectMeta: metav1.ObjectMeta{
					Name:   strings.ReplaceAll(s, "/", ":") + ":" + v,
					Labels: map[string]string{versionLabel: v},
				},
				Spec: certv1.ClusterTrustBundleSpec{SignerName: s, TrustBundle: ca.pem},
			}
			if _, err := signerCS.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb, metav1.CreateOptions{}); err != nil {
				t.Fatalf("signer identity creating %s: %v", ctb.Name, err)
			}
			t.Cleanup(func() {
				_ = cp.AdminClient().CertificatesV1().ClusterTrustBundles().Delete(t.Context(), ctb.Name, metav1.DeleteOptions{})
			})
		}
	}

	list, err := cp.AdminClient().CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.signerName", signer).String(),
		LabelSelector: labels.SelectorFromSet(labels.Set{versionLabel: "live"}).String(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != strings.ReplaceAll(signer, "/", ":")+":live" {
		var names []string
		for _, i := range list.Items {
			names = append(names, i.Name)
		}
		t.Fatalf("selected %v, want only the live bundle of %s", names, signer)
	}

	// A name that does not start with the signer name is refused.
	bad := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: "wrong-prefix-" + suffix},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: ca.pem},
	}
	if _, err := signerCS.CertificatesV1().ClusterTrustBundles().Create(ctx, bad, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("bundle named %q for %s: got %v, want Invalid", bad.Name, signer, err)
	}
}

// A key generated in the SoftHSM2 token signs, and the signature verifies
// against the public key the token reports.
func TestSoftHSMKeySignsAndVerifies(t *testing.T) {
	ctx, err := crypto11.Configure(&crypto11.Config{
		Path:            token.ModulePath,
		TokenLabel:      token.Label,
		Pin:             token.PIN(),
		PoolWaitTimeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatalf("opening %v: %v", token, err)
	}
	defer ctx.Close()

	id := []byte(uniqueName(t, "key"))
	key, err := ctx.GenerateECDSAKeyPairWithLabel(id, id, elliptic.P256())
	if err != nil {
		t.Fatalf("generating P-256 key in SoftHSM: %v", err)
	}
	found, err := ctx.FindKeyPair(id, nil)
	if err != nil || found == nil {
		t.Fatalf("finding the key again by id: %v, %v", found, err)
	}
	digest := sha256.Sum256([]byte("keyward"))
	sig, err := found.Sign(rand.Reader, digest[:], nil)
	if err != nil {
		t.Fatalf("signing in SoftHSM: %v", err)
	}
	pub, ok := key.Public().(*ecdsa.PublicKey)
	if !ok {
		t.Fatalf("public key is %T, want *ecdsa.PublicKey", key.Public())
	}
	if !ecdsa.VerifyASN1(pub, digest[:], sig) {
		t.Fatal("SoftHSM signature does not verify")
	}
	digest[0] ^= 0xff
	if ecdsa.VerifyASN1(pub, digest[:], sig) {
		t.Fatal("signature verifies for a different digest")
	}
}

// trustPublisherClient authenticates as a user that may publish
// ClusterTrustBundles for keyward.dev signers and do nothing else: `attest`
// on those signer names and writes of ClusterTrustBundles.
func trustPublisherClient(t testing.TB) kubernetes.Interface {
	t.Helper()
	ctx := testContext(t)
	const user = "keyward-test-trust-publisher"
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"get", "list", "create", "delete"}},
			{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{"keyward.dev/*"}, Verbs: []string{"attest"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}
	admin := cp.AdminClient().RbacV1()
	if _, err := admin.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	cfg, err := cp.UserConfig(user, "system:authenticated")
	cs := clientFor(t, cfg, err)
	// The apiserver's RBAC authorizer learns of a new binding through its
	// informer: wait until it answers yes.
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
				Group: "certificates.k8s.io", Resource: "clustertrustbundles", Verb: "create"}},
		}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s's binding to take effect: %v", user, err)
	}
	return cs
}
