package registrycredentials_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/cmd/keyward/app"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/tokenservice"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// The least privilege is enough: `keyward token-service`'s Run, with the
// example's configuration and as the example's ServiceAccount holding
// nothing but token-service.yaml's RBAC, takes its Lease, reports the key
// check that lets the trust publisher bootstrap the Authority, publishes
// the live bundle, turns ready, reviews a pod-bound token (TokenReview,
// Pod, ServiceAccount with its annotation) for both endpoints, and records
// the reservation before minting.
func TestTokenServiceRunsOnTheShippedRBAC(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Stop)
	admin := cp.AdminClient()
	if err := controlplane.EnsureNamespace(ctx, admin, namespace); err != nil {
		t.Fatal(err)
	}
	auths, err := controlplane.InstallAuthorityCRD(ctx, cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), tokenServiceRBAC(t)); err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), read(t, "token-service.yaml")); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	key, err := file.New().CreateKey(ctx, backends.CreateKeyRequest{URI: "file:" + filepath.Join(dir, "key.pem"), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := testregistry.SelfSign(key, "tokens")
	if err != nil {
		t.Fatal(err)
	}
	certPEM := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}))
	if _, err := auths.Create(ctx, &v1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: "keyward.dev.registry-token"},
		Spec: v1alpha1.AuthoritySpec{SignerName: signerName, Generations: []v1alpha1.Generation{
			{Name: "g1", KeyURI: "file:" + filepath.Join(dir, "key.pem"), CertificatePEM: certPEM, Phase: v1alpha1.PhaseActive}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	saCfg, err := cp.ServiceAccountConfig(namespace, serviceAccount)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(saCfg, serviceAccount, kubeconfig); err != nil {
		t.Fatal(err)
	}
	_, cfg := tokenServiceConfig(t, tokenServiceObjects(t))
	cfg.KubeClient.Kubeconfig = kubeconfig
	cfg.Listen.Address, cfg.MetricsAddress, cfg.HealthAddress = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	var tlsRoots *x509.CertPool
	cfg.Listen.TLSCertFile, cfg.Listen.TLSKeyFile, tlsRoots = serverCert(t, dir)
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addrs := make(chan [3]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- tokenservice.Run(ctx, tokenservice.Options{Config: cfg, Backends: reg, Identity: "replica-0",
			Ready:    func(l, m, h string) { addrs <- [3]string{l, m, h} },
			AlsoLead: app.TokenServiceCompanions(cfg)})
	}()
	var a [3]string
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatalf("Run: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })

	waitFor(t, ctx, "readyz", func() bool {
		r, err := http.Get("http://" + a[2] + "/readyz")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	waitFor(t, ctx, "live bundle", func() bool {
		_, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, "keyward.dev:registry-token:live", metav1.GetOptions{})
		return err == nil
	})
	if _, err := admin.CoordinationV1().Leases(namespace).Get(ctx, "keyward-token-service", metav1.GetOptions{}); err != nil {
		t.Errorf("lease: %v", err)
	}

	// A pod and its token.
	if _, err := controlplane.EnsureNode(ctx, admin, "n1"); err != nil {
		t.Fatal(err)
	}
	if err := controlplane.EnsureNamespace(ctx, admin, "team-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().ServiceAccounts("team-a").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "ci",
		Annotations: map[string]string{"keyward.dev/registry-push": "true"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := admin.CoreV1().Pods("team-a").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "build"},
		Spec: corev1.PodSpec{NodeName: "n1", ServiceAccountName: "ci", Containers: []corev1.Container{{Name: "c", Image: "x"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tr, err := admin.CoreV1().ServiceAccounts("team-a").CreateToken(ctx, "ci", &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{cfg.Audience}, BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: tlsRoots}}}
	call := func(req *http.Request) (int, []byte) {
		t.Helper()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	req, err := http.NewRequest(http.MethodPost, "https://"+a[0]+"/v1/credential", strings.NewReader(`{"image":"registry.example.com/team-a/web:v1"}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
	if code, body := call(req); code != http.StatusOK {
		t.Errorf("POST /v1/credential: %d %s", code, body)
	}
	q := url.Values{"service": {"registry.example.com"}, "scope": {"repository:team-a/web:pull,push"}}
	if req, err = http.NewRequest(http.MethodGet, "https://"+a[0]+"/token?"+q.Encode(), nil); err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("keyward", tr.Status.Token)
	code, body := call(req)
	var tok struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &tok); code != http.StatusOK || err != nil || tok.Token == "" {
		t.Fatalf("GET /token: %d %s", code, body)
	}
	got, err := auths.Get(ctx, "keyward.dev.registry-token")
	if err != nil {
		t.Fatal(err)
	}
	if g := got.Status.Generations; len(g) != 1 || g[0].Phase != v1alpha1.PhaseActive || g[0].LastIssuedNotAfter == nil {
		t.Errorf("the Authority's status after minting: %+v", got.Status.Generations)
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, ok func() bool) {
	t.Helper()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// serverCert writes a self-signed certificate for 127.0.0.1 and its key
// into dir and returns their paths and a pool trusting it.
func serverCert(t *testing.T, dir string) (string, string, *x509.CertPool) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	c, kf := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	if err := os.WriteFile(c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(kf, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return c, kf, pool
}
