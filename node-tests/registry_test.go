package nodetests

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/node"
	"github.com/keyward/keyward/testsupport/nodeimages"
	"github.com/keyward/keyward/testsupport/servingcert"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The registry scenario: CNCF Distribution (hack/registry, as `make demo`
// runs it) with token auth whose realm is keyward's token service, signing
// with a SoftHSM2 key; kubelet runs `keyward credential-provider`, and
// containerd pulls with what it returns.
const (
	registryTokenSigner = "keyward.dev/registry-token"
	registryAudience    = "keyward.dev/registry"
	registryService     = "registry.keyward.test"
	registryIssuer      = "keyward-node-tests"
	registryNamespace   = "node-registry"
	registryRepo        = registryNamespace + "/workload"
)

const tokenServiceConfig = `apiVersion: keyward.dev/v1alpha1
kind: TokenServiceConfiguration
kubeClient: {kubeconfig: %q}
leaderElection: {namespace: keyward, leaseDuration: 6s, renewDeadline: 4s, retryPeriod: 1s}
listen: {address: %q, tlsCertFile: %q, tlsKeyFile: %q}
metricsAddress: 127.0.0.1:0
healthAddress: 127.0.0.1:0
signerName: keyward.dev/registry-token
issuer: keyward-node-tests
audience: keyward.dev/registry
registries:
- service: registry.keyward.test
  hosts: [%q]
rules:
- namespaces: [node-registry]
  serviceAccounts: [puller]
  repositories: ["node-registry/*"]
`

const registryConfig = `version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage: {filesystem: {rootdirectory: %q}}
http: {addr: %q}
auth:
  token:
    realm: %q
    service: registry.keyward.test
    issuer: keyward-node-tests
    rootcertbundle: %q
    signingalgorithms: [ES256]
`

// credentialProviderConfig is kubelet's: the plugin is keyward's binary.
const credentialProviderConfig = `apiVersion: kubelet.config.k8s.io/v1
kind: CredentialProviderConfig
providers:
- name: keyward
  matchImages: [%q]
  defaultCacheDuration: 1m
  apiVersion: credentialprovider.kubelet.k8s.io/v1
  args: [credential-provider, --token-service-url=%s, --ca-file=%s, --timeout=10s, --cache-key-type=Image, --max-cache-duration=1m]
  tokenAttributes:
    serviceAccountTokenAudience: keyward.dev/registry
    requireServiceAccount: true
    cacheType: Token
`

// registrySetup is what the node needs before kubelet starts.
type registrySetup struct {
	host           string // 127.0.0.1:PORT, as image references name it
	providerCfg    string
	providerBin    string
	tokenCA        string
	tokenService   *controlplane.Process
	registry       *controlplane.Process
	pushedWorkload string
}

// setUpRegistry starts the token service and the registry, pushes the
// workload image, and writes kubelet's credential provider configuration.
func (e *clusterEnv) setUpRegistry(ctx context.Context) (*registrySetup, error) {
	r := &registrySetup{}
	dir := filepath.Join(e.dir, "registry")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ports, err := controlplane.FreePorts(2)
	if err != nil {
		return nil, err
	}
	r.host = fmt.Sprintf("127.0.0.1:%d", ports[0])
	tsAddr := fmt.Sprintf("127.0.0.1:%d", ports[1])
	tsURL := "https://" + tsAddr
	registryBin := filepath.Join(e.dir, "bin", "registry")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", registryBin, "github.com/keyward/keyward/hack/registry").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("building the registry: %v: %s", err, out)
	}
	// The token-signing CA, in the token: g1 Active once the token
	// service's key check passes.
	tokenRoot, err := e.caInit(ctx, registryTokenSigner, generation, "5m") // the token lifetime
	if err != nil {
		return nil, err
	}
	e.roots[registryTokenSigner] = tokenRoot

	// The token service, under its shipped RBAC.
	serving, err := servingcert.Write(dir, "token-service")
	if err != nil {
		return nil, err
	}
	r.tokenCA = serving.CAFile
	kc, err := e.serviceAccountKubeconfig("keyward-token-service")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "token-service.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(tokenServiceConfig, kc, tsAddr, serving.CertFile, serving.KeyFile, r.host)), 0o600); err != nil {
		return nil, err
	}
	rbac, err := e.run(ctx, "deploy", "rbac", "--namespace", keywardNamespace, "--token-service-config", cfg)
	if err != nil {
		return nil, err
	}
	if err := controlplane.ApplyManifest(ctx, e.cp.AdminConfig(), []byte(rbac)); err != nil {
		return nil, fmt.Errorf("applying the token service's RBAC: %w", err)
	}
	if r.tokenService, err = e.start("token-service", "token-service", "--config", cfg, "--pkcs11-module", e.token.ModulePath); err != nil {
		return nil, err
	}

	// The registry trusts the token CA's root and an admin key of the
	// test's, which pushes the workload image.
	admin, adminCert, err := selfSignedCA("node-tests registry admin")
	if err != nil {
		return nil, err
	}
	bundle := filepath.Join(dir, "rootcertbundle.pem")
	if err := os.WriteFile(bundle, append(certPEM(tokenRoot), certPEM(adminCert)...), 0o644); err != nil {
		return nil, err
	}
	// First with a realm by name, for the push: go-containerregistry
	// refuses a realm on a loopback address (it uses the admin token and
	// never asks the realm); then, on the same storage, with the token
	// service's address as the realm, for containerd.
	var err2 error
	start := func(realm string) error {
		regCfg := filepath.Join(dir, "registry.yml")
		if err := os.WriteFile(regCfg, []byte(fmt.Sprintf(registryConfig, filepath.Join(dir, "storage"), r.host, realm, bundle)), 0o600); err != nil {
			return err
		}
		if r.registry != nil {
			r.registry.Stop(5 * time.Second)
		}
		if r.registry, err2 = controlplane.StartProcess("registry", registryBin, []string{"serve", regCfg}, filepath.Join(dir, "registry.log")); err2 != nil {
			return err2
		}
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			resp, err := http.Get("http://" + r.host + "/v2/")
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusUnauthorized && strings.Contains(resp.Header.Get("Www-Authenticate"), realm), nil
		}); err != nil {
			return fmt.Errorf("the registry at %s did not answer: %v; %s", r.host, err, controlplane.Tail(filepath.Join(dir, "registry.log"), 10))
		}
		return nil
	}
	if err := start("https://token.keyward.test/token"); err != nil {
		return nil, err
	}
	now := time.Now()
	tok, err := registrytoken.Mint(ctx, admin, registrytoken.Token{
		Issuer: registryIssuer, Audience: registryService, Subject: "node-tests-admin",
		Access:    []registrytoken.Access{{Type: "repository", Name: registryRepo, Actions: []string{"pull", "push"}}},
		NotBefore: now, Expiry: now.Add(5 * time.Minute), Chain: []*x509.Certificate{adminCert},
	})
	if err != nil {
		return nil, err
	}
	// An image of its own (the workload with one more label): kubelet
	// v1.37 records that an image ID was pulled with credentials, and then
	// refuses it to pods that use the pre-loaded copy with pullPolicy
	// Never (ErrImageNeverPull; imagePullCredentialsVerificationPolicy
	// NeverVerifyPreloadedImages, KEP-2535).
	cf, err := e.images.Workload.ConfigFile()
	if err != nil {
		return nil, err
	}
	c := *cf.Config.DeepCopy()
	c.Labels = map[string]string{nodeimages.Label: "workload-from-registry"}
	img, err := mutate.Config(e.images.Workload, c)
	if err != nil {
		return nil, err
	}
	r.pushedWorkload = r.host + "/" + registryRepo + ":v1"
	if err := nodeimages.Push(ctx, img, r.pushedWorkload, authn.FromConfig(authn.AuthConfig{RegistryToken: tok}), nil); err != nil {
		return nil, fmt.Errorf("pushing the workload image: %w", err)
	}
	if err := start(tsURL + "/token"); err != nil {
		return nil, err
	}

	// Nodes may ask for pod tokens for the audience (the example's RBAC).
	nodeRBAC, err := os.ReadFile("../deploy/examples/registry-credentials/node-rbac.yaml")
	if err != nil {
		return nil, err
	}
	if err := controlplane.ApplyManifest(ctx, e.cp.AdminConfig(), nodeRBAC); err != nil {
		return nil, err
	}
	r.providerBin = filepath.Dir(e.keyward)
	r.providerCfg = filepath.Join(dir, "credential-provider.yaml")
	return r, os.WriteFile(r.providerCfg, []byte(fmt.Sprintf(credentialProviderConfig, r.host, tsURL, r.tokenCA)), 0o644)
}

// nodeRegistries is containerd's view of the registry: plain HTTP on
// loopback, the token service's CA for the realm.
func (r *registrySetup) nodeRegistries() map[string]node.Registry {
	return map[string]node.Registry{r.host: {URL: "http://" + r.host, CAFile: r.tokenCA}}
}

func (r *registrySetup) stop() {
	for _, p := range []*controlplane.Process{r.tokenService, r.registry} {
		if p != nil {
			p.Stop(5 * time.Second)
		}
	}
}

// A pod's image comes from the registry through kubelet's credential
// provider: kubelet asks the apiserver for the pod's service-account token
// (audience keyward.dev/registry), runs `keyward credential-provider`, and
// containerd pulls with the answer, the token service issuing the registry
// token at the realm. The pulled image runs. A service account the token
// service's rules do not grant gets ErrImagePull, and the pod's events say
// why.
func TestImagePullThroughTheCredentialProvider(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	reg := env.registry
	for _, sa := range []string{"puller", "stranger"} {
		if err := controlplane.EnsureNamespace(ctx, env.admin, registryNamespace); err != nil {
			t.Fatal(err)
		}
		if _, err := env.admin.CoreV1().ServiceAccounts(registryNamespace).Create(ctx, &corev1.ServiceAccount{
			ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pod := func(name, sa string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: registryNamespace},
			Spec: corev1.PodSpec{
				NodeName: nodeName, HostNetwork: true, ServiceAccountName: sa, AutomountServiceAccountToken: new(false),
				RestartPolicy: corev1.RestartPolicyNever, TerminationGracePeriodSeconds: new(int64(1)),
				Containers: []corev1.Container{{Name: "workload", Image: reg.pushedWorkload, ImagePullPolicy: corev1.PullAlways, Args: []string{"sleep"}}},
			},
		}
	}
	for _, p := range []*corev1.Pod{pod("pulled", "puller"), pod("refused", "stranger")} {
		if _, err := env.admin.CoreV1().Pods(registryNamespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = env.admin.CoreV1().Pods(registryNamespace).Delete(context.Background(), p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
		})
	}

	running := waitPodPhase(t, ctx, registryNamespace, "pulled", 90*time.Second, corev1.PodRunning)
	st := running.Status.ContainerStatuses[0]
	if !strings.HasPrefix(st.ImageID, reg.host+"/"+registryRepo+"@sha256:") {
		t.Errorf("running container's image %s (%s), want one pulled from %s", st.Image, st.ImageID, reg.host)
	}

	var seen []string
	if err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		p, err := env.admin.CoreV1().Pods(registryNamespace).Get(ctx, "refused", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		seen = seen[:0]
		for _, e := range podEvents(ctx, registryNamespace, "refused") {
			seen = append(seen, e.Reason+": "+e.Message)
		}
		for _, c := range p.Status.ContainerStatuses {
			if w := c.State.Waiting; w != nil && (w.Reason == "ErrImagePull" || w.Reason == "ImagePullBackOff") {
				return len(seen) > 0, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("pod of a service account without a grant: not ErrImagePull: %v; events %q", err, seen)
	}
	t.Logf("service account without a grant: events %q", seen)
	// kubelet puts a plugin's refusal in its log, not in the pod's events
	// (those show containerd's anonymous try at the realm): keyward's
	// reason is there, naming the account and the repository.
	log, err := os.ReadFile(env.node.KubeletLog)
	if err != nil {
		t.Fatal(err)
	}
	want := `the policy grants service account node-registry/stranger no pull of repository "node-registry/workload"`
	if !strings.Contains(string(log), want) {
		t.Errorf("kubelet's log lacks the credential provider's refusal %q", want)
	}
	if !slices.ContainsFunc(seen, func(e string) bool { return strings.Contains(e, "ErrImagePull") }) ||
		!slices.ContainsFunc(seen, func(e string) bool {
			return strings.Contains(e, "/token?scope=repository%3A"+url.QueryEscape(registryRepo))
		}) {
		t.Errorf("events %q do not show ErrImagePull and the realm's refusal", seen)
	}
}

// selfSignedCA makes a throwaway ECDSA P-256 CA named cn, valid a day.
func selfSignedCA(cn string) (*ecdsa.PrivateKey, *x509.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, err
	}
	c, err := x509.ParseCertificate(der)
	return key, c, err
}
