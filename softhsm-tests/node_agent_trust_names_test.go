package softhsmtests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/trust"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

const trustVersionLabel = "keyward.dev/cluster-trust-bundle-version"

// attestClient is a user that holds attest on signers/<signer> only, with
// create and update on ClusterTrustBundles: what the apiserver asks of
// anyone who writes a bundle for that signer name.
func attestClient(t *testing.T, ctx context.Context, signer string) kubernetes.Interface {
	t.Helper()
	user := uniqueName(t, "attester")
	admin := cp.AdminClient().RbacV1()
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"clustertrustbundles"}, Verbs: []string{"get", "create", "update"}},
			{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"}, ResourceNames: []string{signer}, Verbs: []string{"attest"}},
		},
	}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: user},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
		Subjects:   []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}},
	}
	if _, err := admin.ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if _, err := admin.ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.ClusterRoleBindings().Delete(context.Background(), user, metav1.DeleteOptions{})
		_ = admin.ClusterRoles().Delete(context.Background(), user, metav1.DeleteOptions{})
	})
	cfg, err := cp.UserConfig(user, "system:authenticated")
	cs := clientFor(t, cfg, err)
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
				Group: "certificates.k8s.io", Resource: "signers", Name: signer, Verb: "attest"}},
		}, metav1.CreateOptions{})
		return err == nil && r.Status.Allowed, nil
	})
	if err != nil {
		t.Fatalf("waiting for %s's binding to take effect: %v", user, err)
	}
	return cs
}

// manyCAs returns n distinct self-signed CA certificates as PEM (one key,
// n serials): what an attacker stuffs into a bundle.
func manyCAs(t *testing.T, n int) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range n {
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 1)), Subject: pkix.Name{CommonName: fmt.Sprintf("a%d", i)},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	return b.String()
}

// putBundle creates or updates the ClusterTrustBundle name of signer,
// labelled version, as cs.
func putBundle(t *testing.T, ctx context.Context, cs kubernetes.Interface, name, signer, version, bundle string) {
	t.Helper()
	c := cs.CertificatesV1().ClusterTrustBundles()
	cur, err := c.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		ctb := &certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{trustVersionLabel: version}},
			Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: bundle},
		}
		if _, err := c.Create(ctx, ctb, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", name, err)
		}
		t.Cleanup(func() {
			_ = cp.AdminClient().CertificatesV1().ClusterTrustBundles().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.TrustBundle = bundle
	if _, err := c.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("updating %s: %v", name, err)
	}
}

// The projection attack: an identity that holds attest on the signer name
// (not the trust publisher) creates <signer>:attacker with the live label
// and 1,000 certificates. The node agent's trust file, by default, holds
// keyward's own <signer>:live only, and the agent counts the bundle it
// ignored.
func TestNodeAgentTrustProjectsOnlyKeywardsBundleNames(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	signer := "keyward.dev/" + uniqueName(t, "names")
	prefix := strings.ReplaceAll(signer, "/", ":")
	publisher := trustPublisherClient(t)
	attacker := attestClient(t, ctx, signer)
	live := []string{newTestCA(t).pem, newTestCA(t).pem}
	putBundle(t, ctx, publisher, prefix+":live", signer, "live", live[0])
	putBundle(t, ctx, attacker, prefix+":attacker", signer, "live", manyCAs(t, 1000))

	trustDir := t.TempDir()
	cfg := writeAgentConfig(t, node, newStateDir(t), kubeconfigLine(writeNodeKubeconfig(t, cp.URL, node)),
		fmt.Sprintf("trust:\n- {name: pods, signerName: %s, dir: %q}", signer, trustDir))
	a := startAgent(t, cfg)
	file := filepath.Join(trustDir, trust.DefaultFileName)
	waitTrustFile(t, ctx, file, live[0])

	// A change to keyward's bundle is followed; the attacker's stays out.
	admin := cp.AdminClient() // the test's publisher may create, not update
	putBundle(t, ctx, admin, prefix+":live", signer, "live", live[0]+live[1])
	waitTrustFile(t, ctx, file, live[0]+live[1])
	putBundle(t, ctx, attacker, prefix+":attacker", signer, "live", manyCAs(t, 3))
	putBundle(t, ctx, admin, prefix+":live", signer, "live", live[1])
	waitTrustFile(t, ctx, file, live[1])
	eventually(t, ctx, func() (bool, string) {
		v := metricValue(t, a.metrics, "keyward_node_trust_bundles_ignored", `trust="pods"`)
		return v == 1, fmt.Sprintf("keyward_node_trust_bundles_ignored = %v, want 1 (%s:attacker)", v, prefix)
	})
}

// With the attacker's bundle name accepted explicitly
// (trust[].additionalBundleNames), the caps still hold: a bundle that grows
// past trust[].maxCertificates and maxBytes leaves the last good file in place, said by
// keyward_node_trust_bundle_over_limit; once it shrinks, the file follows.
func TestNodeAgentTrustCapKeepsTheLastGoodFile(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	signer := "keyward.dev/" + uniqueName(t, "caps")
	prefix := strings.ReplaceAll(signer, "/", ":")
	publisher := trustPublisherClient(t)
	extra := attestClient(t, ctx, signer)
	cas := []string{newTestCA(t).pem, newTestCA(t).pem, newTestCA(t).pem}
	putBundle(t, ctx, publisher, prefix+":live", signer, "live", cas[0])
	putBundle(t, ctx, extra, prefix+":extra", signer, "live", cas[1])

	trustDir := t.TempDir()
	cfg := writeAgentConfig(t, node, newStateDir(t), kubeconfigLine(writeNodeKubeconfig(t, cp.URL, node)),
		fmt.Sprintf("trust:\n- {name: pods, signerName: %s, additionalBundleNames: [%s], maxCertificates: 10, dir: %q}", signer, prefix+":extra", trustDir))
	a := startAgent(t, cfg)
	file := filepath.Join(trustDir, trust.DefaultFileName)
	waitTrustFile(t, ctx, file, cas[0]+cas[1])

	putBundle(t, ctx, extra, prefix+":extra", signer, "live", manyCAs(t, 1000))
	eventually(t, ctx, func() (bool, string) {
		v := metricValue(t, a.metrics, "keyward_node_trust_bundle_over_limit", `trust="pods"`)
		return v == 1, fmt.Sprintf("keyward_node_trust_bundle_over_limit = %v, want 1", v)
	})
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, trust.Merge([]byte(cas[0]+cas[1]))) {
		t.Fatalf("over the cap the file holds %d bytes (%v), want the last good file", len(got), err)
	}
	log, _ := os.ReadFile(a.logPath)
	if n := strings.Count(string(log), "(maxBytes); keeping the last good trust file"); n != 1 {
		t.Errorf("the agent's log names the cap %d times, want once (maxBytes: 1,000 certificates are over both caps, and the bytes are said):\n%s", n, log)
	}

	putBundle(t, ctx, extra, prefix+":extra", signer, "live", cas[2])
	waitTrustFile(t, ctx, file, cas[0]+cas[2])
	eventually(t, ctx, func() (bool, string) {
		v := metricValue(t, a.metrics, "keyward_node_trust_bundle_over_limit", `trust="pods"`)
		return v == 0, fmt.Sprintf("keyward_node_trust_bundle_over_limit = %v, want 0 once the file is within the caps", v)
	})
}
