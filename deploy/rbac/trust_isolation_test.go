package rbac

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"testing"
	"time"

	"github.com/keyward/keyward/deploy"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/testsupport/controlplane"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certv1ac "k8s.io/client-go/applyconfigurations/certificates/v1"
	"k8s.io/client-go/kubernetes"
)

// selfSignedCA is a fresh CA certificate in PEM, for Authorities and
// ClusterTrustBundles the apiserver must accept.
func selfSignedCA(t *testing.T, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// TestTokenServiceCannotRewriteAnotherSignersTrust plays an attacker who
// took over the token service (the component every node and pod reaches):
// with the shipped RBAC (deploy/kustomize/base/rbac.yaml, applied as is)
// and the token service's ServiceAccount, against a real kube-apiserver, it
// tries to add its own root as a generation of keyward.dev/pod-identity's
// Authority, to mark that generation Promoted in the Authority's status, and
// to delete the signer's ClusterTrustBundles. Each must be Forbidden; the
// same writes on its own Authority and bundle stay allowed.
func TestTokenServiceCannotRewriteAnotherSignersTrust(t *testing.T) {
	ctx, cp := startControlPlane(t)
	admin := cp.AdminClient()
	adminAuth, err := controlplane.InstallAuthorityCRD(ctx, cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{DefaultNamespace, DefaultNodeAgentNamespace} {
		if err := controlplane.EnsureNamespace(ctx, admin, ns); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []struct {
		fsys interface{ ReadFile(string) ([]byte, error) }
		name string
	}{{deploy.Base, "kustomize/base/rbac.yaml"}, {deploy.TokenService, "kustomize/components/token-service/rbac.yaml"}} {
		shipped, err := f.fsys.ReadFile(f.name)
		if err != nil {
			t.Fatal(err)
		}
		if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), shipped); err != nil {
			t.Fatalf("applying deploy/%s: %v", f.name, err)
		}
	}

	// The two signers' trust as an administrator (and their publishers)
	// set it up: an Active generation g1, and its canary and live bundles
	// (ActiveAuthority publishes them as the trust publisher would).
	const victim, own = "keyward.dev/pod-identity", "keyward.dev/registry-token"
	for _, signer := range []string{victim, own} {
		if _, err := controlplane.ActiveAuthority(ctx, adminAuth, admin, AuthorityName(signer), signer, "g1",
			"pkcs11:token=t;object=g1", selfSignedCA(t, signer+" g1")); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, bundleName(signer, "live"), metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	cfg, err := cp.ServiceAccountConfig(DefaultNamespace, TokenServiceName)
	if err != nil {
		t.Fatal(err)
	}
	attacker, err := authclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	attackerKube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rogue := selfSignedCA(t, "rogue root")

	addGeneration := func(ctx context.Context, signer string) error {
		a, err := adminAuth.Get(ctx, AuthorityName(signer))
		if err != nil {
			t.Fatal(err)
		}
		gens := append([]v1alpha1.Generation{}, a.Spec.Generations...)
		gens = append(gens, v1alpha1.Generation{Name: "rogue", KeyURI: "pkcs11:token=attacker;object=rogue",
			CertificatePEM: rogue, Phase: v1alpha1.PhasePromoted})
		body := map[string]any{"spec": map[string]any{"generations": gens}}
		_, err = attacker.Patch(ctx, AuthorityName(signer), types.MergePatchType, mustJSON(t, body), metav1.PatchOptions{})
		return err
	}
	promoteInStatus := func(ctx context.Context, signer string) error {
		_, err := attacker.ApplyStatus(ctx, AuthorityName(signer), map[string]any{"generations": []map[string]any{
			{"name": "g1", "phase": v1alpha1.PhasePromoted, "since": metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))},
		}}, v1alpha1.FieldManagerTrustPublisher)
		return err
	}
	deleteBundle := func(ctx context.Context, signer string) error {
		return attackerKube.CertificatesV1().ClusterTrustBundles().Delete(ctx, bundleName(signer, "live"), metav1.DeleteOptions{})
	}

	// The trust publisher's write: server-side apply, which creates the
	// bundle when absent (the apiserver then checks create on its name).
	applyCanary := func(ctx context.Context, signer string) error {
		ac := certv1ac.ClusterTrustBundle(bundleName(signer, "canary")).
			WithSpec(certv1ac.ClusterTrustBundleSpec().WithSignerName(signer).WithTrustBundle(selfSignedCA(t, signer+" g2")))
		_, err := attackerKube.CertificatesV1().ClusterTrustBundles().Apply(ctx, ac, metav1.ApplyOptions{FieldManager: v1alpha1.FieldManagerTrustPublisher, Force: true})
		return err
	}

	attacks := []struct {
		name   string
		signer string
		do     func(context.Context, string) error
		// forbidden: the apiserver must refuse it with 403.
		forbidden bool
	}{
		{"adding a rogue generation to the pod-identity signer's Authority is forbidden", victim, addGeneration, true},
		{"writing a phase into the pod-identity signer's Authority status is forbidden", victim, promoteInStatus, true},
		{"deleting the pod-identity signer's live ClusterTrustBundle is forbidden", victim, deleteBundle, true},
		{"writing its own Authority's status stays allowed", own, promoteInStatus, false},
		{"deleting its own live ClusterTrustBundle stays allowed", own, deleteBundle, false},
		{"publishing (creating) its own canary ClusterTrustBundle by server-side apply stays allowed", own, applyCanary, false},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			err := a.do(ctx, a.signer)
			t.Logf("as %s: %s on %s: %v", TokenServiceName, a.name, a.signer, err)
			switch {
			case a.forbidden && !apierrors.IsForbidden(err):
				t.Errorf("the token service's identity could write %s's trust (error %v), want Forbidden", a.signer, err)
			case !a.forbidden && err != nil:
				t.Errorf("the token service's identity could not write its own trust: %v", err)
			}
		})
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
