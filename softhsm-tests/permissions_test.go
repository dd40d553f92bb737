package softhsmtests

import (
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
	certv1 "k8s.io/api/certificates/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// readyzBody returns /readyz's status code and body.
func readyzBody(addr string) (int, string, error) {
	resp, err := http.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// grantSign gives the signer's service account `sign` on name and returns
// a function that takes it away again.
func grantSign(t *testing.T, ctx context.Context, name string) func() {
	t.Helper()
	role := uniqueName(t, "sign")
	rbac := cp.AdminClient().RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"signers"},
			ResourceNames: []string{name}, Verbs: []string{"sign"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: signerServiceAccount, Namespace: signerNamespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := rbac.ClusterRoleBindings().Delete(ctx, role, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// A signer name the RBAC does not cover (the shipped role grants only
// keyward.dev/*): the signer says so at start, stays unready, signs
// nothing, and issues once the grant is added. A grant taken away while
// it runs costs one signature (the request that found out), then none.
// Signatures are counted by the KMS, not by keyward's logs.
func TestMissingSignGrantCostsNoSignatures(t *testing.T) {
	ctx := testContext(t)
	gcp, err := gcpkmsfake.Start(gcpkmsfake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gcp.Close()
	cryptoKey := "projects/keyward/locations/global/keyRings/ca/cryptoKeys/" + uniqueName(t, "rbac")
	if err := gcp.AddCryptoKey(cryptoKey, kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256); err != nil {
		t.Fatal(err)
	}
	var opts all.Options
	opts.GCPKMS.ClientOptions = gcp.ClientOptions()
	keyURI, caFile, root := newCA(t, opts, "gcpkms:"+cryptoKey, "ca-rbac")
	signatures := func() int { return gcp.Calls(gcpkmsfake.AsymmetricSign) }

	name := "example.com/" + uniqueName(t, "rbac")
	rs := startSignerOpts(t, baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile)), "rbac", opts, time.Second)
	var body string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		code, b, err := readyzBody(rs.HealthAddr)
		body = b
		return err == nil && code == http.StatusServiceUnavailable && strings.Contains(b, "missing RBAC permission"), nil
	})
	if err != nil {
		t.Fatalf("/readyz does not report the missing grant: %v (%q)", err, body)
	}
	for _, want := range []string{`verb "sign"`, `"` + name + `"`, `resources: ["signers"]`, `resourceNames: ["` + name + `"]`} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz lacks %s: %q", want, body)
		}
	}

	before := signatures()
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	p1, _ := createPCR(t, ctx, w, name, pcrOptions{})
	time.Sleep(3 * time.Second) // several rechecks and retries
	if got, _ := cp.AdminClient().CertificatesV1().PodCertificateRequests(p1.Namespace).Get(ctx, p1.Name, metav1.GetOptions{}); len(got.Status.Conditions) != 0 {
		t.Fatalf("request without a grant got %+v, want it left pending", got.Status.Conditions)
	}
	if n := signatures() - before; n != 0 {
		t.Fatalf("the CA key signed %d times while the grant was missing, want 0", n)
	}
	logData, _ := os.ReadFile(rs.LogPath)
	if !strings.Contains(string(logData), "missing RBAC permission") || !strings.Contains(string(logData), "\nE") {
		t.Errorf("the log has no error line about the missing grant:\n%s", logData)
	}

	revoke := grantSign(t, ctx, name)
	if got := waitTerminal(t, ctx, p1, 30*time.Second); condition(got).Type != "Issued" {
		t.Fatalf("after the grant: %+v", got.Status.Conditions)
	}
	parseChain(t, waitTerminal(t, ctx, p1, time.Second).Status.CertificateChain, root)
	if err := waitReady(rs.HealthAddr); err != nil {
		t.Fatalf("/readyz after the grant: %v", err)
	}
	if n := signatures() - before; n != 1 {
		t.Fatalf("%d signatures for one request, want 1", n)
	}

	// The grant goes away at run time: the next request's status write is
	// refused (422 from status validation); it and the requests after it
	// cost no further signature.
	revoke()
	time.Sleep(500 * time.Millisecond) // RBAC informers in the apiserver
	before = signatures()
	var later []*certv1.PodCertificateRequest
	for range 4 {
		p, _ := createPCR(t, ctx, w, name, pcrOptions{})
		later = append(later, p)
		time.Sleep(300 * time.Millisecond)
	}
	time.Sleep(3 * time.Second)
	if n := signatures() - before; n > 1 {
		t.Fatalf("the CA key signed %d times for 4 requests after the grant was revoked, want at most 1", n)
	}
	for _, p := range later {
		if got, _ := cp.AdminClient().CertificatesV1().PodCertificateRequests(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{}); len(got.Status.Conditions) != 0 {
			t.Fatalf("%s got %+v without a grant", p.Name, got.Status.Conditions)
		}
	}
	grantSign(t, ctx, name)
	for _, p := range later {
		if got := waitTerminal(t, ctx, p, 30*time.Second); condition(got).Type != "Issued" {
			t.Fatalf("%s after the grant came back: %+v", p.Name, got.Status.Conditions)
		}
	}
	if n := signatures() - before; n != len(later) {
		t.Fatalf("%d signatures for %d requests across the revocation, want exactly one each", n, len(later))
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("test context expired")
	}
}
