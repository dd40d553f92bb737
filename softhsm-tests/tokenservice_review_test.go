package softhsmtests

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/cmd/keyward/app"
	signerconfig "github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/tokenservice"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/servingcert"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// registryAudience is declared in node_token_audience_test.go (h-C).

// reviewerClient is a client for a user holding exactly the grants the
// token service's reviewer needs (tokenreviews create, pods and
// serviceaccounts get), or none when grant is false.
func reviewerClient(t *testing.T, ctx context.Context, grant bool) kubernetes.Interface {
	t.Helper()
	user := uniqueName(t, "token-service")
	if grant {
		admin := cp.AdminClient()
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: user}, Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
			{APIGroups: []string{""}, Resources: []string{"pods", "serviceaccounts"}, Verbs: []string{"get"}},
		}}
		if _, err := admin.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: user},
			RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: user},
			Subjects: []rbacv1.Subject{{APIGroup: "rbac.authorization.k8s.io", Kind: "User", Name: user}}}
		if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cfg, err := cp.UserConfig(user)
	return clientFor(t, cfg, err)
}

// registryWorkload makes a pod (bound to a node) running as service
// account "puller" in namespace ns.
func registryWorkload(t *testing.T, ctx context.Context, ns, node, pod string) *controlplane.WorkloadObjects {
	t.Helper()
	w, err := controlplane.CreateWorkload(ctx, cp.AdminClient(), controlplane.Workload{
		Namespace: ns, Node: node, ServiceAccount: "puller", Pod: pod,
		// CreateWorkload's pods mount a podCertificate volume; nothing
		// signs for this name, nothing needs to.
		SignerNames: []string{"keyward.dev/unused"},
	})
	if err != nil {
		t.Fatalf("creating workload: %v", err)
	}
	return w
}

// saToken asks the apiserver for a token of w's service account for
// audience, bound to w's pod unless unbound.
func saToken(t *testing.T, ctx context.Context, w *controlplane.WorkloadObjects, audience string, unbound bool) string {
	t.Helper()
	req := &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{Audiences: []string{audience}}}
	if !unbound {
		req.Spec.BoundObjectRef = &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: w.Pod.Name, UID: w.Pod.UID}
	}
	tr, err := cp.AdminClient().CoreV1().ServiceAccounts(w.Pod.Namespace).CreateToken(ctx, w.ServiceAccount.Name, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("requesting a token: %v", err)
	}
	return tr.Status.Token
}

// TestTheTokenReviewerChecksRealServiceAccountTokens: the token service's
// reviewer, with only the grants it ships with, accepts a pod-bound token
// the real apiserver issued for the audience, with the pod's identity and
// its ServiceAccount's annotations, and refuses, each with its reason, a
// token for another audience, one bound to no pod, one whose pod was
// deleted and one whose pod finished.
func TestTheTokenReviewerChecksRealServiceAccountTokens(t *testing.T) {
	ctx := testContext(t)
	ns, node := uniqueName(t, "ns"), uniqueName(t, "node")
	w := registryWorkload(t, ctx, ns, node, "app")
	admin := cp.AdminClient()
	sa := w.ServiceAccount.DeepCopy()
	sa.Annotations = map[string]string{"keyward.dev/registry-team": "blue"}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Update(ctx, sa, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	reviewer, err := tokenservice.NewReviewer(tokenservice.ReviewerOptions{Client: reviewerClient(t, ctx, true), Audience: registryAudience})
	if err != nil {
		t.Fatal(err)
	}

	t.Run("a pod-bound token for the audience is accepted with the pod's identity and the service account's annotations", func(t *testing.T) {
		tok := saToken(t, ctx, w, registryAudience, false)
		rv, err := reviewer.Review(ctx, tok, tokenservice.ReviewRequest{})
		if err != nil {
			t.Fatal(err)
		}
		id := rv.Identity
		if id.Namespace != ns || id.ServiceAccount != "puller" || id.PodName != "app" || id.PodUID != string(w.Pod.UID) || id.NodeName != node {
			t.Errorf("identity %+v, want %s/puller pod app (%s) on %s", id, ns, w.Pod.UID, node)
		}
		if id.Annotations["keyward.dev/registry-team"] != "blue" {
			t.Errorf("annotations %v, want the ServiceAccount's", id.Annotations)
		}
		if d := time.Until(rv.Expiry); d < 50*time.Minute || d > 2*time.Hour {
			t.Errorf("expiry %s, want the token's (about an hour)", rv.Expiry)
		}
	})

	refused := func(t *testing.T, tok, reason string) {
		t.Helper()
		_, err := reviewer.Review(ctx, tok, tokenservice.ReviewRequest{})
		var r *tokenservice.RefusedError
		if !errors.As(err, &r) {
			t.Fatalf("error %v, want a refusal (%s)", err, reason)
		}
		if r.Reason != reason {
			t.Errorf("refused %s (%s), want %s", r.Reason, r.Message, reason)
		}
	}
	t.Run("a pod-bound token for another audience is refused", func(t *testing.T) {
		refused(t, saToken(t, ctx, w, "https://kubernetes.default.svc", false), tokenservice.ReasonWrongAudience)
	})
	t.Run("a token for the audience bound to no pod is refused", func(t *testing.T) {
		refused(t, saToken(t, ctx, w, registryAudience, true), tokenservice.ReasonNotPodBound)
	})
	t.Run("the token of a deleted pod is refused", func(t *testing.T) {
		gone := registryWorkload(t, ctx, ns, node, "gone")
		tok := saToken(t, ctx, gone, registryAudience, false)
		if _, err := reviewer.Review(ctx, tok, tokenservice.ReviewRequest{}); err != nil {
			t.Fatalf("before the deletion: %v", err)
		}
		zero := int64(0)
		if err := admin.CoreV1().Pods(ns).Delete(ctx, "gone", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
			t.Fatal(err)
		}
		refused(t, tok, tokenservice.ReasonPodGone)
	})
	t.Run("the token of a finished pod is refused", func(t *testing.T) {
		done := registryWorkload(t, ctx, ns, node, "done")
		tok := saToken(t, ctx, done, registryAudience, false)
		p := done.Pod.DeepCopy()
		p.Status.Phase = corev1.PodSucceeded
		if _, err := admin.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		refused(t, tok, tokenservice.ReasonPodFinished)
	})
}

// TestTheTokenReviewerNamesAMissingGrant: without RBAC for TokenReviews,
// the reviewer's error says which grant is missing and is transient (the
// token is not refused: 503, not 401).
func TestTheTokenReviewerNamesAMissingGrant(t *testing.T) {
	ctx := testContext(t)
	w := registryWorkload(t, ctx, uniqueName(t, "ns"), uniqueName(t, "node"), "app")
	reviewer, err := tokenservice.NewReviewer(tokenservice.ReviewerOptions{Client: reviewerClient(t, ctx, false), Audience: registryAudience})
	if err != nil {
		t.Fatal(err)
	}
	_, err = reviewer.Review(ctx, saToken(t, ctx, w, registryAudience, false), tokenservice.ReviewRequest{})
	var missing *tokenservice.MissingGrantError
	if !errors.Is(err, tokenservice.ErrUnavailable) || !errors.As(err, &missing) || !strings.Contains(missing.Grant, "tokenreviews") {
		t.Fatalf("error %v, want ErrUnavailable naming the tokenreviews grant", err)
	}
}

// runningTokenService is a tokenservice.Run started by startMintingTokenService.
type runningTokenService struct {
	listen, metrics, health string
	client                  *http.Client
}

// startMintingTokenService runs the token service for signerName (registry reg,
// granting pull of keyward/* to namespace ns's "puller") until the test
// ends; it returns once the listeners are bound.
func startMintingTokenService(t *testing.T, signerName string, reg *testregistry.Registry, ns string) *runningTokenService {
	t.Helper()
	kubeconfig := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", kubeconfig); err != nil {
		t.Fatal(err)
	}
	serving, err := servingcert.Write(t.TempDir(), "token-service")
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile, pool := serving.CertFile, serving.KeyFile, serving.Pool
	off := false
	cfg := &tsconfig.TokenServiceConfiguration{
		APIVersion: tsconfig.APIVersion, Kind: tsconfig.Kind,
		KubeClient:     signerconfig.KubeClient{Kubeconfig: kubeconfig},
		LeaderElection: signerconfig.LeaderElection{Namespace: signerNamespace, LeaseName: uniqueName(t, "lease")},
		TrustPublisher: signerconfig.TrustPublisher{Enabled: &off},
		Listen:         tsconfig.Listen{Address: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		SignerName: signerName, Issuer: reg.Issuer, Audience: registryAudience,
		Registries: []tsconfig.Registry{{Service: reg.Service}},
		Rules: []tsconfig.Rule{{Namespaces: []string{ns}, ServiceAccounts: []string{"puller"},
			Repositories: []string{"keyward/*"}}},
	}
	backendsReg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "token-service.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(2)))))
	addrs := make(chan [3]string, 1)
	done := make(chan error, 1)
	go func() {
		done <- tokenservice.Run(runCtx, tokenservice.Options{Config: cfg, Backends: backendsReg, Identity: "ts-0",
			AlsoLead: app.TokenServiceCompanions(cfg),
			Ready:    func(listen, metrics, health string) { addrs <- [3]string{listen, metrics, health} }})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("token service stopped: %v", err)
		}
		backendsReg.Close()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("token service log:\n%s", b)
		}
	})
	select {
	case a := <-addrs:
		return &runningTokenService{listen: a[0], metrics: a[1], health: a[2],
			client: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 30 * time.Second}}
	case err := <-done:
		t.Fatalf("token service stopped before serving: %v", err)
	}
	return nil
}

// getToken asks ts's /token for scope with tok as Basic password.
func (ts *runningTokenService) getToken(t *testing.T, service, scope, tok string) (int, []byte) {
	t.Helper()
	q := url.Values{"service": {service}, "scope": {scope}}
	req, _ := http.NewRequest(http.MethodGet, "https://"+ts.listen+"/token?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("keyward:"+tok)))
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

// TestTheTokenServiceMintsTokensARegistryAccepts runs tokenservice.Run
// against the real apiserver with its key in SoftHSM: a pod-bound token
// buys a registry token the real Distribution registry lets pull the
// granted repository, and the credential endpoint answers the plugin.
func TestTheTokenServiceMintsTokensARegistryAccepts(t *testing.T) {
	ctx := testContext(t)
	signerName := "keyward.dev/" + uniqueName(t, "regtokens")
	uri, caFile, root := caInToken(t, uniqueName(t, "regtoken-key"))
	activeAuthority(t, signerName, uri, caFile)
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{root}, SigningAlgorithms: []string{"ES256"}})
	w := registryWorkload(t, ctx, uniqueName(t, "ns"), uniqueName(t, "node"), "app")
	ts := startMintingTokenService(t, signerName, reg, w.Pod.Namespace)
	if err := waitReady(ts.health); err != nil {
		t.Fatalf("token service not ready: %v", err)
	}
	// It takes its Lease and says so (the NoLeader alert sums keyward_leader).
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		v, err := scrapeMetric(ts.metrics, "keyward_leader")
		return v == 1, err
	})
	if err != nil {
		t.Errorf("keyward_leader of the token service never read 1: %v", err)
	}
	tok := saToken(t, ctx, w, registryAudience, false)

	code, body := ts.getToken(t, reg.Service, "repository:"+testregistry.Repository+":pull,push", tok)
	if code != http.StatusOK {
		t.Fatalf("GET /token: %d %s", code, body)
	}
	var answer struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &answer); err != nil {
		t.Fatal(err)
	}
	if code, challenge := pullStatus(t, reg, answer.Token); code != http.StatusOK {
		t.Fatalf("pull with the minted token: %d (%s)", code, challenge)
	}

	req, _ := http.NewRequest(http.MethodPost, "https://"+ts.listen+"/v1/credential",
		bytes.NewReader([]byte(`{"image":"`+reg.Service+`/`+testregistry.Repository+`:`+testregistry.Tag+`"}`)))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := ts.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `"username":"keyward"`) {
		t.Fatalf("POST /v1/credential: %d %s", resp.StatusCode, body)
	}
}

// TestTheTokenServiceWithoutAnActiveKeyIsUnreadyAndSignsNothing: until
// its Authority has an Active generation, /readyz says why and /token
// answers 503; once it has one, tokens are minted.
func TestTheTokenServiceWithoutAnActiveKeyIsUnreadyAndSignsNothing(t *testing.T) {
	ctx := testContext(t)
	signerName := "keyward.dev/" + uniqueName(t, "regtokens")
	reg := testregistry.Start(t, testregistry.Options{})
	w := registryWorkload(t, ctx, uniqueName(t, "ns"), uniqueName(t, "node"), "app")
	ts := startMintingTokenService(t, signerName, reg, w.Pod.Namespace)
	tok := saToken(t, ctx, w, registryAudience, false)

	code, body := httpGet(t, "http://"+ts.health+"/readyz")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, signerName) {
		t.Errorf("/readyz without an Authority: %d %q, want 503 naming %s", code, body, signerName)
	}
	if code, body := ts.getToken(t, reg.Service, "repository:"+testregistry.Repository+":pull", tok); code != http.StatusServiceUnavailable {
		t.Errorf("GET /token without an Authority: %d %s, want 503", code, body)
	}

	uri, caFile, _ := caInToken(t, uniqueName(t, "regtoken-key"))
	activeAuthority(t, signerName, uri, caFile)
	if err := waitReady(ts.health); err != nil {
		t.Fatalf("token service not ready once its Authority is Active: %v", err)
	}
	if code, body := ts.getToken(t, reg.Service, "repository:"+testregistry.Repository+":pull", tok); code != http.StatusOK {
		t.Errorf("GET /token with an Active generation: %d %s, want 200", code, body)
	}
}
