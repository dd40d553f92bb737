package softhsmtests

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/cmd/keyward/app"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer"
	signerconfig "github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/signer/tokenservice"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
	"github.com/keyward/keyward/testsupport/servingcert"
	"github.com/keyward/keyward/testsupport/testregistry"
	authenticationv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
	credentialproviderapi "k8s.io/kubelet/pkg/apis/credentialprovider"
	"k8s.io/kubelet/pkg/apis/credentialprovider/install"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

// registryEnv is one end-to-end setting of issue 13, all real parts: the
// token-signing key's Authority made by `keyward ca init` (through the
// rotation tests' e2eRotation), the token service run in this process as
// `keyward token-service` runs it (its trust publisher moves the phases),
// a Distribution registry whose realm is the token service, and pods on a
// node that requests their tokens through NodeRestriction.
type registryEnv struct {
	t   *testing.T
	ctx context.Context
	rot *e2eRotation
	reg *testregistry.Registry
	// tokenURL is https://127.0.0.1:PORT; caFile/pool trust its
	// certificate.
	tokenURL string
	caFile   string
	pool     *x509.CertPool
	node     string
	// puller's service account may pull testregistry.Repository; other's
	// (another pod on the same node) may pull nothing.
	puller, other *controlplane.WorkloadObjects
	caA           tokenCA
}

// newRegistryEnv sets everything up with generation "a" of the token
// signer made by `keyward ca init --key-uri keyURI flags…`, its key opened
// by the token service through a backends registry built with opts.
func newRegistryEnv(t *testing.T, ctx context.Context, keyURI string, opts all.Options, flags ...string) *registryEnv {
	t.Helper()
	e := &registryEnv{t: t, ctx: ctx, rot: newE2ERotation(t, ctx, "regtok")}
	// The signer name the shipped RBAC lets the token service attest for.
	// Tests in this package run one at a time; each deletes its Authority.
	e.rot.signer = registryTokenSigner
	go buildKeyward()
	// The registry first (the token service's configuration names its
	// host), with its realm set by a restart once the token service runs.
	e.reg = testregistry.Start(t, testregistry.Options{})
	serving, err := servingcert.Write(e.t.TempDir(), "token-service")
	if err != nil {
		e.t.Fatal(err)
	}
	certFile, keyFile := serving.CertFile, serving.KeyFile
	e.caFile, e.pool = serving.CAFile, serving.Pool

	e.node = uniqueName(t, "node")
	ns := uniqueName(t, "ns")
	for _, w := range []struct {
		into    **controlplane.WorkloadObjects
		sa, pod string
	}{{&e.puller, "puller", "app"}, {&e.other, "other", "other"}} {
		*w.into, err = controlplane.CreateWorkload(ctx, cp.AdminClient(), controlplane.Workload{
			Namespace: ns, Node: e.node, ServiceAccount: w.sa, Pod: w.pod, SignerNames: []string{e.rot.signer},
		})
		if err != nil {
			t.Fatalf("creating workload: %v", err)
		}
	}
	// NodeRestriction: no pod volume references the audience, so the
	// node may not ask for it until RBAC lets it.
	if _, err := requestPodToken(ctx, nodeClient(t, e.node), e.puller, registryAudience); !apierrors.IsForbidden(err) {
		t.Fatalf("a node without request-serviceaccounts-token-audience: %v, want Forbidden", err)
	}
	allowNodeAudience(t, ctx, e.node, e.puller)

	cfg := &tsconfig.TokenServiceConfiguration{
		APIVersion: tsconfig.APIVersion, Kind: tsconfig.Kind,
		KubeClient:     tokenServiceKubeClient(t, ctx),
		LeaderElection: leaderElectionOff(),
		Listen:         tsconfig.Listen{Address: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		SignerName:    e.rot.signer,
		Issuer:        e.reg.Issuer,
		Audience:      registryAudience,
		TokenLifetime: metav1.Duration{Duration: 5 * time.Minute},
		KeyIdentifier: tsconfig.KeyIdentifierX5C,
		Registries:    []tsconfig.Registry{{Service: e.reg.Service, Hosts: []string{e.reg.Host}}},
		Rules: []tsconfig.Rule{{
			Namespaces: []string{ns}, ServiceAccounts: []string{"puller"},
			Repositories: []string{testregistry.Repository}, Actions: []string{tsconfig.ActionPull},
		}},
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		t.Fatalf("token service configuration invalid: %v", errs.ToAggregate())
	}
	e.tokenURL = "https://" + startTokenService(t, cfg, opts)

	// Generation a, made as an operator makes it; the token service's
	// trust publisher bootstraps it to Active once its key check passes.
	e.rot.caInit("a", keyURI, flags...)
	e.rot.waitPhases("A Active by bootstrap", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive})
	e.caA = e.rot.ca("a")
	// The registry trusts what the live ClusterTrustBundle publishes.
	view := e.rot.waitBundles("A Active", []tokenCA{e.caA}, []tokenCA{e.caA})
	e.restartRegistry(view.live)
	return e
}

// restartRegistry writes the live bundle with `keyward trust bundle
// SIGNER --output FILE`, as an operator refreshes a registry's
// rootcertbundle, checks that it holds exactly want (DER roots, as
// waitBundles read them), and restarts the registry trusting it with the
// token service as its realm.
func (e *registryEnv) restartRegistry(want [][]byte) {
	e.t.Helper()
	path := filepath.Join(e.t.TempDir(), "rootcertbundle.pem")
	if out, err := keyward(e.t, "trust", "bundle", e.rot.signer, "--version", "live", "--output", path); err != nil {
		e.t.Fatalf("keyward trust bundle: %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	var certs []*x509.Certificate
	for block, rest := pem.Decode(b); block != nil; block, rest = pem.Decode(rest) {
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			e.t.Fatalf("keyward trust bundle wrote a bad certificate: %v", err)
		}
		certs = append(certs, c)
	}
	same := len(certs) == len(want)
	for _, c := range certs {
		same = same && slices.ContainsFunc(want, func(d []byte) bool { return bytes.Equal(d, c.Raw) })
	}
	if !same {
		e.t.Fatalf("keyward trust bundle wrote %d roots, not the %d of the live ClusterTrustBundle", len(certs), len(want))
	}
	e.reg.Restart(e.t, testregistry.Options{Realm: e.tokenURL + "/token", RootCerts: certs})
}

// allowNodeAudience applies the shipped node RBAC
// (deploy/examples/registry-credentials/node-rbac.yaml): NodeRestriction
// refuses a node a token for an audience no pod volume references unless
// the node may `request-serviceaccounts-token-audience` it. It waits until
// node may request w's token, and removes the RBAC when the test ends.
func allowNodeAudience(t *testing.T, ctx context.Context, node string, w *controlplane.WorkloadObjects) {
	t.Helper()
	manifest, err := os.ReadFile(nodeRBACFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying %s: %v", nodeRBACFile, err)
	}
	t.Cleanup(func() { removeNodeRBAC(t, context.Background(), cp.AdminClient(), manifest) })
	// RBAC decides from its informers' caches: wait until the grant is
	// seen.
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = requestPodToken(ctx, nodeClient(t, node), w, registryAudience)
		return last == nil, nil
	}); err != nil {
		t.Fatalf("the node, allowed the audience by %s, still may not request it: %v", nodeRBACFile, last)
	}
}

// podToken is the token kubelet asks for when it pulls w's image: a
// TokenRequest for w's service account, bound to w's pod, for audience,
// made by client (the node, unless a test says otherwise).
func podToken(t *testing.T, ctx context.Context, client kubernetes.Interface, w *controlplane.WorkloadObjects, audience string) string {
	t.Helper()
	tok, err := requestPodToken(ctx, client, w, audience)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func requestPodToken(ctx context.Context, client kubernetes.Interface, w *controlplane.WorkloadObjects, audience string) (string, error) {
	expiry := int64(600)
	tr, err := client.CoreV1().ServiceAccounts(w.Pod.Namespace).CreateToken(ctx, w.ServiceAccount.Name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences:         []string{audience},
			ExpirationSeconds: &expiry,
			BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: w.Pod.Name, UID: w.Pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("requesting a %s token for %s/%s bound to pod %s: %w", audience, w.Pod.Namespace, w.ServiceAccount.Name, w.Pod.Name, err)
	}
	return tr.Status.Token, nil
}

// kubeletCodecs are built as kubelet builds its own: the credential
// provider API group installed into a scheme, strict decoding.
var kubeletCodecs = func() serializer.CodecFactory {
	scheme := kruntime.NewScheme()
	install.Install(scheme)
	return serializer.NewCodecFactory(scheme, serializer.EnableStrict)
}()

var (
	keywardBinaryOnce sync.Once
	keywardBinaryPath string
	keywardBinaryErr  error
	// keywardLacksPlugin: the binary has no credential-provider command.
	keywardLacksPlugin bool
)

// keywardBinary is cmd/keyward built once per package run (in the control
// plane's work dir, which goes when the run ends): the plugin is run the
// way kubelet runs it, as a separate executable.
func keywardBinary(t *testing.T) string {
	t.Helper()
	buildKeyward()
	if keywardBinaryErr != nil {
		t.Fatal(keywardBinaryErr)
	}
	if keywardLacksPlugin {
		// A fatal error, not a skip: a skip would let make test pass with
		// the whole registry e2e unrun if the command went missing.
		t.Fatal("cmd/keyward has no credential-provider command; the registry e2e runs the plugin as kubelet does")
	}
	return keywardBinaryPath
}

// buildKeyward builds cmd/keyward once; newRegistryEnv starts it in the
// background so that it overlaps the setup.
func buildKeyward() {
	keywardBinaryOnce.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		keywardBinaryPath = filepath.Join(cp.Dir, "bin", "keyward")
		out, err := exec.Command(goTool, "build", "-o", keywardBinaryPath, "github.com/keyward/keyward/cmd/keyward").CombinedOutput()
		if err != nil {
			keywardBinaryErr = fmt.Errorf("building cmd/keyward: %w\n%s", err, out)
			return
		}
		out, err = exec.Command(keywardBinaryPath, "credential-provider", "--help").CombinedOutput()
		keywardLacksPlugin = err != nil && strings.Contains(string(out), `unknown command "credential-provider"`)
	})
}

// pluginResult is what one run of `keyward credential-provider` did.
type pluginResult struct {
	response       *credentialproviderapi.CredentialProviderResponse
	stdout, stderr string
	exitCode       int
}

// runPlugin runs `keyward credential-provider` as kubelet does: a child
// process with the args of the kubelet's CredentialProviderConfig and a
// CredentialProviderRequest (credentialprovider.kubelet.k8s.io/v1) on
// stdin, carrying the pod's service-account token.
func (e *registryEnv) runPlugin(t *testing.T, image, saToken string) pluginResult {
	t.Helper()
	// Encoded as kubelet's exec plugin encodes it (pkg/credentialprovider/
	// plugin/plugin.go, k8s.io/kubernetes v1.37): the internal type through
	// the JSON serializer's encoder for v1, which sets kind and apiVersion
	// and ends with a newline.
	info, ok := kruntime.SerializerInfoForMediaType(kubeletCodecs.SupportedMediaTypes(), kruntime.ContentTypeJSON)
	if !ok {
		t.Fatal("no JSON serializer")
	}
	in, err := kruntime.Encode(kubeletCodecs.EncoderForVersion(info.Serializer, credentialproviderv1.SchemeGroupVersion),
		&credentialproviderapi.CredentialProviderRequest{Image: image, ServiceAccountToken: saToken})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.CommandContext(e.ctx, keywardBinary(t), "credential-provider",
		"--token-service-url", e.tokenURL, "--ca-file", e.caFile, "--timeout", "10s")
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	res := pluginResult{stdout: stdout.String(), stderr: stderr.String()}
	switch {
	case errors.As(err, &exit):
		res.exitCode = exit.ExitCode()
	case err != nil:
		t.Fatalf("running keyward credential-provider: %v", err)
	}
	if res.exitCode == 0 {
		// Read as kubelet reads it: strictly, into the internal type.
		obj, gvk, err := kubeletCodecs.UniversalDecoder().Decode(stdout.Bytes(), nil, nil)
		if err != nil {
			t.Fatalf("kubelet would not decode the plugin's stdout: %v\n%s", err, res.stdout)
		}
		r, ok := obj.(*credentialproviderapi.CredentialProviderResponse)
		if !ok || gvk.GroupVersion() != credentialproviderv1.SchemeGroupVersion {
			t.Fatalf("the plugin answered a %s (%T)", gvk, obj)
		}
		res.response = r
	}
	return res
}

// image is the reference kubelet hands the plugin for repo.
func (e *registryEnv) image(repo string) string {
	return e.reg.Host + "/" + repo + ":" + testregistry.Tag
}

// credential is what the plugin answers kubelet for w's pull of the
// test image with a token the node requested: the username and password
// kubelet hands containerd for the registry's host.
func (e *registryEnv) credential(t *testing.T, w *controlplane.WorkloadObjects) (string, string) {
	t.Helper()
	res := e.runPlugin(t, e.image(testregistry.Repository), podToken(t, e.ctx, nodeClient(t, e.node), w, registryAudience))
	if res.exitCode != 0 {
		t.Fatalf("keyward credential-provider exited %d: %s", res.exitCode, res.stderr)
	}
	r := res.response
	if r.CacheDuration == nil || r.CacheDuration.Duration <= 0 {
		t.Errorf("the plugin's cacheDuration %v is not positive", r.CacheDuration)
	}
	a, ok := r.Auth[e.reg.Host]
	if !ok || len(r.Auth) != 1 {
		t.Fatalf("the plugin's auth %v does not hold exactly the registry's host %s", slices.Collect(maps.Keys(r.Auth)), e.reg.Host)
	}
	if a.Username == "" || a.Password == "" {
		t.Fatalf("the plugin's credential for %s is empty", e.reg.Host)
	}
	return a.Username, a.Password
}

// pull pulls repo:Tag through containerd's resolver with username and
// password, as containerd does with what kubelet hands it.
func (e *registryEnv) pull(repo, username, password string) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 20*time.Second)
	defer cancel()
	return testregistry.Pull(ctx, e.reg.Host, repo, testregistry.Tag, username, password, e.pool)
}

// registryToken asks the token endpoint directly (GET with Basic, as
// containerd's fallback does) for a pull token of the test repository.
func (e *registryEnv) registryToken(t *testing.T, password string) (string, int) {
	t.Helper()
	return e.registryTokenFor(t, password, testregistry.Repository)
}

// registryTokenFor is registryToken for a pull of repo.
func (e *registryEnv) registryTokenFor(t *testing.T, password, repo string) (string, int) {
	t.Helper()
	q := url.Values{"service": {e.reg.Service}, "scope": {"repository:" + repo + ":pull"}}
	req, err := http.NewRequestWithContext(e.ctx, http.MethodGet, e.tokenURL+"/token?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.SetBasicAuth("keyward", password)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfigFor(e.pool)}}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL.Path, err)
	}
	defer resp.Body.Close()
	var body struct {
		Token string `json:"token"`
	}
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return "", resp.StatusCode
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.Token == "" {
		t.Fatalf("the token endpoint's answer: %v (token %q)", err, body.Token)
	}
	return body.Token, resp.StatusCode
}

// signingCertificate is the leaf of a registry token's x5c header.
func signingCertificate(t *testing.T, jwt string) *x509.Certificate {
	t.Helper()
	head, _, ok := strings.Cut(jwt, ".")
	if !ok {
		t.Fatalf("not a JWS: %q", jwt)
	}
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		X5C []string `json:"x5c"`
	}
	if err := json.Unmarshal(raw, &h); err != nil || len(h.X5C) == 0 {
		t.Fatalf("token header %s has no x5c (%v)", raw, err)
	}
	der, err := base64.StdEncoding.DecodeString(h.X5C[0])
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// registryStatus is the registry's answer to a manifest GET with tok.
func registryStatus(t *testing.T, reg *testregistry.Registry, tok string) int {
	t.Helper()
	resp := reg.GetManifest(t, testregistry.Repository, tok)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// TestRegistryCredentialsEndToEnd: a node requests its pod's token for the
// registry audience through NodeRestriction, `keyward credential-provider`
// (a child process, fed as kubelet feeds it) turns it into a credential,
// and containerd's resolver pulls with it through the token service's
// realm, the token signed in SoftHSM; what the policy does not grant, and
// tokens not meant for the token service, are refused.
func TestRegistryCredentialsEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	e := newRegistryEnv(t, ctx, tokenKeyURI(uniqueName(t, "regtok-a")), all.Options{})
	user, password := e.credential(t, e.puller)

	t.Run("the plugin's credential pulls the image", func(t *testing.T) {
		dgst, err := e.pull(testregistry.Repository, user, password)
		if err != nil {
			t.Fatalf("pull with the plugin's credential: %v", err)
		}
		if dgst != e.reg.ManifestDigest {
			t.Fatalf("pulled %s, pushed %s", dgst, e.reg.ManifestDigest)
		}
		tok, code := e.registryToken(t, password)
		if code != http.StatusOK {
			t.Fatalf("token endpoint: status %d", code)
		}
		if c := signingCertificate(t, tok); !c.Equal(e.caA.root) {
			t.Errorf("the token is signed by %s, want generation a's %s", c.Subject, e.caA.root.Subject)
		}
	})
	t.Run("an anonymous pull is refused", func(t *testing.T) {
		if _, err := e.pull(testregistry.Repository, "", ""); !errors.Is(err, testregistry.ErrTokenRefused) {
			t.Fatalf("anonymous pull: %v, want %v", err, testregistry.ErrTokenRefused)
		}
	})
	t.Run("a repository outside the policy is refused by the registry", func(t *testing.T) {
		// The token service drops the scope (200, no access); the registry
		// then refuses, rather than answering 404 for a repository it
		// does not hold.
		if _, err := e.pull("keyward/other", user, password); !errors.Is(err, testregistry.ErrRegistryRefused) {
			t.Fatalf("pull of keyward/other: %v, want %v", err, testregistry.ErrRegistryRefused)
		}
		tok, code := e.registryTokenFor(t, password, "keyward/other")
		if code != http.StatusOK {
			t.Fatalf("token for keyward/other: status %d, want 200 with the scope dropped", code)
		}
		if access := tokenAccess(t, tok); len(access) != 0 {
			t.Errorf("token for keyward/other grants %+v, want nothing", access)
		}
	})

	admin := cp.AdminClient()
	for _, tc := range []struct {
		name string
		tok  func() string
		// want are words the plugin's message must hold.
		want []string
	}{
		{name: "another pod's service account, which the policy grants nothing, is refused",
			tok:  func() string { return podToken(t, ctx, nodeClient(t, e.node), e.other, registryAudience) },
			want: []string{e.other.Pod.Namespace, "other", testregistry.Repository}},
		{name: "a token for another audience is refused",
			tok:  func() string { return podToken(t, ctx, admin, e.puller, "keyward.dev/not-the-registry") },
			want: []string{"audience"}},
		{name: "a token bound to a pod that is gone is refused",
			tok: func() string {
				gone, err := controlplane.CreateWorkload(ctx, admin, controlplane.Workload{
					Namespace: e.puller.Pod.Namespace, Node: e.node, ServiceAccount: "puller", Pod: "gone", SignerNames: []string{e.rot.signer},
				})
				if err != nil {
					t.Fatal(err)
				}
				tok := podToken(t, ctx, nodeClient(t, e.node), gone, registryAudience)
				// A pod on a node is deleted gracefully (it stays, terminating,
				// until its kubelet confirms); gone means gone at once.
				zero := int64(0)
				if err := admin.CoreV1().Pods(gone.Pod.Namespace).Delete(ctx, gone.Pod.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
					t.Fatal(err)
				}
				return tok
			},
			want: []string{"gone", "no longer exists"}},
		{name: "a token that is not a service-account token is refused",
			tok:  func() string { return "not-a-token" },
			want: []string{"serviceAccountToken"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := e.runPlugin(t, e.image(testregistry.Repository), tc.tok())
			if res.exitCode != 1 {
				t.Fatalf("the plugin exited %d, want 1 (stdout %q, stderr %q)", res.exitCode, res.stdout, res.stderr)
			}
			if res.stdout != "" {
				t.Errorf("the plugin wrote to stdout on refusal: %q", res.stdout)
			}
			// This is about the message a node operator reads.
			msg := strings.TrimSpace(res.stderr)
			if !strings.HasPrefix(msg, "keyward credential-provider: ") || strings.Contains(msg, "\n") {
				t.Errorf("stderr is not one line starting with the command's name: %q", res.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the refusal %q does not name %q", msg, w)
				}
			}
			t.Logf("refusal: %s", msg)
		})
	}

	t.Run("an expired token signed by the token key is refused by the registry", func(t *testing.T) {
		reg, err := all.NewRegistry(all.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close()
		key, err := reg.Open(ctx, backends.OpenRequest{URI: e.caA.uri})
		if err != nil {
			t.Fatalf("opening generation a's key in SoftHSM: %v", err)
		}
		defer key.Close()
		mint := func(notBefore, expiry time.Time) string {
			tok, err := registrytoken.Mint(ctx, key, registrytoken.Token{
				Issuer: e.reg.Issuer, Audience: e.reg.Service, Subject: "system:serviceaccount:" + e.puller.Pod.Namespace + ":puller",
				Access:    []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
				NotBefore: notBefore, Expiry: expiry, Chain: []*x509.Certificate{e.caA.root},
			})
			if err != nil {
				t.Fatalf("minting in SoftHSM: %v", err)
			}
			return tok
		}
		now := time.Now()
		if code := registryStatus(t, e.reg, mint(now, now.Add(time.Minute))); code != http.StatusOK {
			t.Fatalf("the same token unexpired: status %d, want 200", code)
		}
		// Past the registry's 60 s leeway.
		if code := registryStatus(t, e.reg, mint(now.Add(-10*time.Minute), now.Add(-5*time.Minute))); code != http.StatusUnauthorized {
			t.Fatalf("an expired token: status %d, want 401", code)
		}
	})
}

// puller pulls without pause until stopped, counting successes and
// keeping every failure.
type puller struct {
	ok       atomic.Int64
	mu       sync.Mutex
	failures []error
	stop     chan struct{}
	done     chan struct{}
}

func startPuller(e *registryEnv, user, password string) *puller {
	p := &puller{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			default:
			}
			dgst, err := e.pull(testregistry.Repository, user, password)
			if err == nil && dgst != e.reg.ManifestDigest {
				err = fmt.Errorf("pulled %s, pushed %s", dgst, e.reg.ManifestDigest)
			}
			if err != nil {
				p.mu.Lock()
				p.failures = append(p.failures, fmt.Errorf("%s: %w", time.Now().Format("15:04:05.000"), err))
				p.mu.Unlock()
				continue
			}
			p.ok.Add(1)
		}
	}()
	return p
}

// more waits until at least one more pull succeeded after this call.
func (p *puller) more(t *testing.T, ctx context.Context, what string) {
	t.Helper()
	from := p.ok.Load()
	if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return p.ok.Load() > from, nil
	}); err != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		t.Fatalf("no pull succeeded %s: %v; %d failed, the last: %v", what, err, len(p.failures), p.failures[max(0, len(p.failures)-1):])
	}
}

func (p *puller) finish() (int64, []error) {
	close(p.stop)
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ok.Load(), p.failures
}

// TestRegistryTokenKeyRotationDoesNotInterruptPulls: the token-signing
// key rotates a → b as a CA does (docs/rotation.md; gates compressed as
// in the rotation tests) while a goroutine pulls without pause through
// containerd's resolver; the registry is restarted with the live bundle
// whenever it changes. No pull fails; once b is Active new tokens carry
// b's certificate; after a is retired and the registry restarted without
// it, a token a signed is refused and new ones pull.
func TestRegistryTokenKeyRotationDoesNotInterruptPulls(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	prefix := uniqueName(t, "regrot")
	e := newRegistryEnv(t, ctx, tokenKeyURI(prefix+"-a"), all.Options{})
	r := e.rot
	user, password := e.credential(t, e.puller)
	tokA, code := e.registryToken(t, password)
	if code != http.StatusOK || !signingCertificate(t, tokA).Equal(e.caA.root) {
		t.Fatalf("before the rotation: status %d, want a token signed by generation a", code)
	}

	p := startPuller(e, user, password)
	p.more(t, ctx, "before the rotation")

	r.caInit("b", tokenKeyURI(prefix+"-b"))
	r.waitPhases("B Staged", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhaseStaged})
	caB := r.ca("b")
	p.more(t, ctx, "with b Staged")

	r.trust("promote", "b")
	r.waitPhases("B Promoted", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhasePromoted})
	view := r.waitBundles("B Promoted", []tokenCA{e.caA, caB}, []tokenCA{e.caA, caB})
	e.restartRegistry(view.live)
	p.more(t, ctx, "after the registry restarted trusting a and b")

	r.trust("activate", "b")
	r.waitPhases("B Active, A Promoted", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhasePromoted, "b": kwv1alpha1.PhaseActive})
	// The token service applies the activation it reads from the
	// Authority a moment after status shows it.
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		tok, code := e.registryToken(t, password)
		return code == http.StatusOK && signingCertificate(t, tok).Equal(caB.root), nil
	}); err != nil {
		t.Fatalf("no token signed by generation b after its activation: %v", err)
	}
	p.more(t, ctx, "with b Active")

	// Retire a: its tokens' reservation (lastIssuedNotAfter) holds
	// LeavesValid for minutes; forced with a reason, as an operator who
	// knows the registry already trusts b would.
	const reason = "registry e2e: a's tokens expire within minutes"
	for _, verb := range []string{"retire", "finish"} {
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
			out, err := keyward(t, "trust", verb, r.signer, "a")
			if err == nil {
				return true, nil
			}
			var gate *app.GateError
			if !errors.As(err, &gate) {
				return false, fmt.Errorf("keyward trust %s a: %w\n%s", verb, err, out)
			}
			if gate.Step.Gate == kwv1alpha1.GateLeavesValid {
				t.Logf("keyward trust %s a refused by %s (the token service's reservation for a's tokens); forcing", verb, gate.Step.Gate)
				if out, err := keyward(t, "trust", verb, r.signer, "a", "--force", "--reason", reason); err != nil {
					return false, fmt.Errorf("keyward trust %s a --force: %w\n%s", verb, err, out)
				}
				return true, nil
			}
			return false, nil
		}); err != nil {
			t.Fatalf("%s a: %v", verb, err)
		}
		if verb == "retire" {
			r.waitPhases("A Retiring", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseRetiring, "b": kwv1alpha1.PhaseActive})
			p.more(t, ctx, "with a Retiring")
		}
	}
	r.waitPhases("A Retired", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseRetired, "b": kwv1alpha1.PhaseActive})
	view = r.waitBundles("A Retired", []tokenCA{caB}, []tokenCA{caB})
	e.restartRegistry(view.live)
	p.more(t, ctx, "after the registry restarted trusting b alone")

	ok, failures := p.finish()
	if len(failures) > 0 {
		t.Errorf("%d of %d pulls failed during the rotation:", len(failures), ok+int64(len(failures)))
		for _, f := range failures {
			t.Errorf("  %v", f)
		}
	}
	t.Logf("%d pulls through the rotation, none failed", ok)

	if code := registryStatus(t, e.reg, tokA); code != http.StatusUnauthorized {
		t.Errorf("a token signed by retired generation a (still unexpired): status %d, want 401", code)
	}
	tokB, code := e.registryToken(t, password)
	if code != http.StatusOK || !signingCertificate(t, tokB).Equal(caB.root) {
		t.Fatalf("after the rotation: status %d, want a token signed by generation b", code)
	}
	if code := registryStatus(t, e.reg, tokB); code != http.StatusOK {
		t.Errorf("a new token: status %d, want 200", code)
	}
}

// TestRegistryTokensSignedInKMS: the same minting with the token key in
// Cloud KMS (ES256) or AWS KMS (RS256 from an RSA-3072 key) — the
// wire-level fakes through the real SDKs — made by `keyward ca init`: the
// plugin's credential pulls, and the fake served the token's signature.
func TestRegistryTokensSignedInKMS(t *testing.T) {
	fakes := startKMSFakes(t)
	// ca init reads AWS credentials the SDK's default way: the environment.
	kmstest.AWSEnv(t, awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey)
	for _, tc := range []struct {
		name, uri, alg string
		flags          []string
		signs          func() int
	}{
		{"gcpkms", "gcpkms:" + fakes.cryptoKey, "ES256", []string{"--algorithm", "ECDSAP256", "--gcpkms-emulator", fakes.gcp.Addr()},
			func() int { return fakes.gcp.Calls(gcpkmsfake.AsymmetricSign) }},
		{"awskms", "awskms:region=eu-west-1?endpoint=" + fakes.aws.URL(), "RS256", []string{"--algorithm", "RSA3072"},
			func() int { return fakes.aws.Calls(awskmsfake.Sign) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			e := newRegistryEnv(t, ctx, tc.uri, fakes.opts, tc.flags...)
			if !strings.HasPrefix(e.caA.uri, tc.name+":") {
				t.Fatalf("generation a's key URI %s is not a %s URI", e.caA.uri, tc.name)
			}
			user, password := e.credential(t, e.puller)
			before := tc.signs()
			dgst, err := e.pull(testregistry.Repository, user, password)
			if err != nil {
				t.Fatalf("pull with a token signed in %s: %v", tc.name, err)
			}
			if dgst != e.reg.ManifestDigest {
				t.Fatalf("pulled %s, pushed %s", dgst, e.reg.ManifestDigest)
			}
			if tc.signs() == before {
				t.Errorf("a pull succeeded but the %s fake served no signature", tc.name)
			}
			tok, _ := e.registryToken(t, password)
			if alg := tokenAlgorithm(t, tok); alg != tc.alg {
				t.Errorf("the token is signed with %s, want %s", alg, tc.alg)
			}
		})
	}
}

// tokenAccess is a registry token's access claim.
func tokenAccess(t *testing.T, jwt string) []registrytoken.Access {
	t.Helper()
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWS: %q", jwt)
	}
	raw, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Access []registrytoken.Access `json:"access"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.Access
}

// tokenAlgorithm is a JWS's alg header.
func tokenAlgorithm(t *testing.T, jwt string) string {
	t.Helper()
	head, _, _ := strings.Cut(jwt, ".")
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Alg string `json:"alg"`
	}
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatal(err)
	}
	return h.Alg
}

func tlsConfigFor(pool *x509.CertPool) *tls.Config {
	return &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
}

// The token service's signer name and identity as the shipped, generated
// deploy/kustomize/components/token-service/rbac.yaml (applied by TestMain)
// grants them.
const (
	registryTokenSigner       = "keyward.dev/registry-token"
	tokenServiceAccount       = "keyward-token-service"
	tokenServiceManifestsFile = "../deploy/examples/registry-credentials/token-service.yaml"
)

// tokenServiceKubeClient applies the shipped token service manifest (its
// ConfigMap; the Deployment, Service and PDB stay inert without
// controllers) and talks to the apiserver as its ServiceAccount, so only the
// shipped RBAC (deploy/kustomize/components/token-service/rbac.yaml, applied by TestMain, plus
// the test-only Lease grant for per-test Lease names) grants it anything.
func tokenServiceKubeClient(t *testing.T, ctx context.Context) signerconfig.KubeClient {
	t.Helper()
	manifest, err := os.ReadFile(tokenServiceManifestsFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying %s: %v", tokenServiceManifestsFile, err)
	}
	cfg, err := cp.ServiceAccountConfig(signerNamespace, tokenServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "token-service.kubeconfig")
	if err := controlplane.WriteKubeconfig(cfg, tokenServiceAccount, path); err != nil {
		t.Fatal(err)
	}
	return signerconfig.KubeClient{Kubeconfig: path, QPS: 200, Burst: 400}
}

func leaderElectionOff() signerconfig.LeaderElection {
	off := false
	return signerconfig.LeaderElection{Enabled: &off}
}

// startTokenService runs the token service in this process, as `keyward
// token-service` runs it (the trust publisher for its signer name while it
// leads), with cfg and backends built with opts, until the test ends. It
// returns the HTTPS endpoint's address.
func startTokenService(t *testing.T, cfg *tsconfig.TokenServiceConfiguration, opts all.Options) string {
	t.Helper()
	return runTokenService(t, cfg, opts, inProcessTokenService{
		identity: "token-service-0", alsoLead: app.TokenServiceCompanions(cfg), verbosity: 2,
	})
}

// inProcessTokenService is how runTokenService runs the token service.
type inProcessTokenService struct {
	identity  string
	alsoLead  []signer.Companion
	verbosity int
	// logTail, if positive, is how many of the log's last lines a failed
	// test shows; otherwise it shows the whole log.
	logTail int
	// ready, if set, is told the listeners' addresses and the log file.
	ready func(listen, metrics, health, logPath string)
}

// runTokenService runs the token service in this process with cfg and
// backends built with opts until tb ends, logging to a file that a failed
// tb shows; it returns the HTTPS endpoint's address.
func runTokenService(tb testing.TB, cfg *tsconfig.TokenServiceConfiguration, opts all.Options, how inProcessTokenService) string {
	tb.Helper()
	reg, err := all.NewRegistry(opts)
	if err != nil {
		tb.Fatal(err)
	}
	logPath := filepath.Join(tb.TempDir(), "token-service.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		tb.Fatal(err)
	}
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile), textlogger.Verbosity(how.verbosity)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	addrs := make(chan string, 1)
	go func() {
		done <- tokenservice.Run(ctx, tokenservice.Options{Config: cfg, Backends: reg, Identity: how.identity,
			AlsoLead: how.alsoLead,
			Ready: func(listen, metrics, health string) {
				if how.ready != nil {
					how.ready(listen, metrics, health, logPath)
				}
				addrs <- listen
			}})
	}()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil && !errors.Is(err, context.Canceled) {
				tb.Errorf("the token service stopped: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Errorf("the token service did not stop within 30s")
		}
		reg.Close()
		logFile.Close()
		if !tb.Failed() {
			return
		}
		log, _ := os.ReadFile(logPath)
		if how.logTail <= 0 {
			tb.Logf("token service log:\n%s", log)
			return
		}
		lines := strings.Split(strings.TrimSpace(string(log)), "\n")
		n := min(len(lines), how.logTail)
		tb.Logf("token service log, last %d lines:\n%s", n, strings.Join(lines[len(lines)-n:], "\n"))
	})
	select {
	case addr := <-addrs:
		return addr
	case err := <-done:
		tb.Fatalf("the token service did not start: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("the token service did not bind its listeners within 30s")
	}
	return ""
}
