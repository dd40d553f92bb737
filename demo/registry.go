package demo

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/keyward/keyward/trustpublisher/trustedit"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/keyward/keyward/backends"
	registrycredentials "github.com/keyward/keyward/deploy/examples/registry-credentials"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer"
	signerconfig "github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/tokenservice"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/servingcert"
	"github.com/keyward/keyward/testsupport/softhsm"
)

// The registry part of the demo (docs/registry-credentials.md): a token
// service signing registry tokens with a key in the SoftHSM2 token, a CNCF
// Distribution registry trusting it, and the kubelet credential provider
// plugin turning a pod's service-account token into a pull credential.
const (
	demoTokenSigner     = "keyward.dev/registry-token"
	demoTokenAuthority  = "registry-token"
	demoTokenGeneration = "tokens-1"
	demoAudience        = "keyward.dev/registry"
	demoRegistryService = "registry.keyward.demo"
	demoTokenIssuer     = "keyward-demo-token-service"
	demoShopNamespace   = "shop"
	demoPushAnnotation  = "keyward.dev/registry-push"
)

// demoRegistryEnv is what the registry part uses of the demo.
type demoRegistryEnv struct {
	out         io.Writer
	dir         string
	cp          *controlplane.ControlPlane
	cli         demoCLI
	authorities *authclient.Client
	token       *softhsm.Token
	backends    *backends.Registry
	node        kubernetes.Interface
	// registryBinary is bin/registry; plugin is the command that runs
	// `keyward credential-provider` (the keyward binary).
	registryBinary string
	plugin         []string
	// secrets records the tokens the demo obtains (nil: not recorded).
	secrets *Secrets
	// companions run beside the token service while it leads.
	companions func(*tsconfig.TokenServiceConfiguration) []signer.Companion
}

// runRegistryDemo runs the registry part; the returned function stops what
// it started (the token service and the registry).
func runRegistryDemo(ctx context.Context, e demoRegistryEnv) (stop func(), err error) {
	var stops []func()
	var once sync.Once
	// stop may be called twice (here on an error, and by the caller's
	// defer): only the first call stops anything.
	stop = func() {
		once.Do(func() {
			for i := len(stops) - 1; i >= 0; i-- {
				stops[i]()
			}
		})
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	out := e.out
	fmt.Fprintln(out, "\n== registry credentials: image pulls with a pod's service-account token (KEP-4412) ==")

	// The shipped manifests: the token service's RBAC (its Deployment does
	// not run here: the demo has no kube-controller-manager, so it runs
	// the token service itself under that ServiceAccount) and the nodes'
	// grant to request tokens for the audience.
	for _, name := range []string{"token-service.yaml", "node-rbac.yaml"} {
		manifest, err := registrycredentials.Files.ReadFile(name)
		if err != nil {
			return stop, err
		}
		if err := controlplane.ApplyManifest(ctx, e.cp.AdminConfig(), manifest); err != nil {
			return stop, fmt.Errorf("applying deploy/examples/registry-credentials/%s: %w", name, err)
		}
	}
	fmt.Fprintln(out, "applied deploy/examples/registry-credentials/token-service.yaml and node-rbac.yaml")

	// The token-signing key is a CA generation of its own Authority: it
	// rotates through the same phases, and its root is what registries
	// trust.
	if _, err := e.authorities.Create(ctx, &v1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: demoTokenAuthority},
		Spec: v1alpha1.AuthoritySpec{SignerName: demoTokenSigner, Gates: v1alpha1.Gates{
			CanarySoak:        &metav1.Duration{Duration: demoCanarySoak},
			PropagationWindow: &metav1.Duration{Duration: demoPropagationWindow},
		}},
	}, metav1.CreateOptions{}); err != nil {
		return stop, fmt.Errorf("creating Authority %s: %w", demoTokenAuthority, err)
	}
	if err := e.cli.run(ctx, "ca", "init", "--signer", demoTokenSigner, "--generation", demoTokenGeneration,
		"--create-key", "--key-uri", demoKeyURI(e.token, "demo-registry-token-1"), "--pkcs11-module", e.cli.module,
		"--subject", "CN=keyward demo registry tokens "+demoTokenGeneration, "--lifetime", "8760h"); err != nil {
		return stop, err
	}

	// The registry's address is in the token service's configuration, so
	// it is chosen first.
	registryHost, err := freeLoopbackAddr()
	if err != nil {
		return stop, err
	}
	// The token service's TLS pair for 127.0.0.1; in a cluster it comes
	// from your usual issuer (docs/registry-credentials.md).
	serving, err := servingcert.Write(e.dir, "token-service")
	if err != nil {
		return stop, err
	}
	certFile, keyFile, caFile, caPool := serving.CertFile, serving.KeyFile, serving.CAFile, serving.Pool
	saCfg, err := e.cp.ServiceAccountConfig("keyward", "keyward-token-service")
	if err != nil {
		return stop, err
	}
	kubeconfig := filepath.Join(e.dir, "token-service.kubeconfig")
	if err := controlplane.WriteKubeconfig(saCfg, "keyward-token-service", kubeconfig); err != nil {
		return stop, err
	}
	off := false
	cfg := &tsconfig.TokenServiceConfiguration{
		APIVersion: tsconfig.APIVersion, Kind: tsconfig.Kind,
		KubeClient:     signerconfig.KubeClient{Kubeconfig: kubeconfig},
		LeaderElection: signerconfig.LeaderElection{Enabled: &off},
		Listen:         tsconfig.Listen{Address: "127.0.0.1:0", TLSCertFile: certFile, TLSKeyFile: keyFile},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		SignerName: demoTokenSigner, Issuer: demoTokenIssuer, Audience: demoAudience,
		Registries: []tsconfig.Registry{{Service: demoRegistryService, Hosts: []string{registryHost}}},
		Rules: []tsconfig.Rule{
			{Namespaces: []string{"*"}, Repositories: []string{"${namespace}/**"}},
			{Namespaces: []string{"*"}, ServiceAccountAnnotations: map[string]string{demoPushAnnotation: "true"},
				Repositories: []string{"${namespace}/**"}, Actions: []string{tsconfig.ActionPull, tsconfig.ActionPush}},
		},
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		return stop, errs.ToAggregate()
	}
	logFile, err := os.Create(filepath.Join(e.dir, "token-service.log"))
	if err != nil {
		return stop, err
	}
	stops = append(stops, func() { logFile.Close() })
	logger := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(logFile)))
	tsCtx, cancel := context.WithCancel(klog.NewContext(ctx, logger))
	done := make(chan error, 1)
	ready := make(chan [2]string, 1)
	go func() {
		done <- tokenservice.Run(tsCtx, tokenservice.Options{Config: cfg, Backends: e.backends, Identity: "demo-token-service",
			AlsoLead: e.companions(cfg),
			Ready:    func(listen, metrics, _ string) { ready <- [2]string{listen, metrics} }})
	}()
	stops = append(stops, func() { cancel(); <-done })
	var listen, metrics string
	select {
	case a := <-ready:
		listen, metrics = a[0], a[1]
	case err := <-done:
		done <- err
		return stop, fmt.Errorf("token service: %w", err)
	}
	realm := "https://" + listen + "/token"
	fmt.Fprintf(out, "token service running as keyward/keyward-token-service (audience %s, tokens for %s): %s, metrics http://%s/metrics, log %s\n",
		demoAudience, demoRegistryService, realm, metrics, logFile.Name())
	if err := waitGenerationActive(ctx, e.authorities, demoTokenAuthority, demoTokenGeneration); err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "trust publisher: generation %s of %s observed Active (the token service reported its key ready)\n", demoTokenGeneration, demoTokenSigner)

	// The registry trusts the live bundle of the token signer name, as a
	// file: Distribution reads its rootcertbundle once, at start.
	// The trust publisher writes the bundle beside the status that shows
	// the generation Active: wait until it holds the root.
	var roots []*x509.Certificate
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		roots, last = trustedit.KubeletView(ctx, e.cp.AdminClient(), demoTokenSigner, "live")
		return last == nil && len(roots) > 0, nil
	}); err != nil {
		return stop, fmt.Errorf("waiting for the live ClusterTrustBundle of %s to hold its root: %w (last read: %v)", demoTokenSigner, err, last)
	}
	rootFile := filepath.Join(e.dir, "registry-roots.pem")
	var pemRoots bytes.Buffer
	for _, c := range roots {
		_ = pem.Encode(&pemRoots, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	if err := os.WriteFile(rootFile, pemRoots.Bytes(), 0o600); err != nil {
		return stop, err
	}
	reg, err := startDemoRegistryAt(ctx, e.registryBinary, e.dir, registryHost, realm, demoRegistryService, demoTokenIssuer, rootFile, "ES256")
	if err != nil {
		return stop, err
	}
	stops = append(stops, reg.stop)
	fmt.Fprintf(out, "registry (CNCF Distribution %s) at http://%s, token auth: realm %s, service %s, rootcertbundle %s (%s), signingalgorithms [ES256]; log %s\n",
		"v3", registryHost, realm, demoRegistryService, rootFile, subjects(roots), reg.log.Name())

	// Two service accounts of namespace shop, a pod of each on the node:
	// ci may push (an administrator annotated it), web only pulls.
	admin := e.cp.AdminClient()
	if err := controlplane.EnsureNamespace(ctx, admin, demoShopNamespace); err != nil {
		return stop, err
	}
	image := registryHost + "/shop/hello:v1"
	ci, err := createDemoPod(ctx, admin, "ci", map[string]string{demoPushAnnotation: "true"}, image)
	if err != nil {
		return stop, err
	}
	web, err := createDemoPod(ctx, admin, "web", nil, image)
	if err != nil {
		return stop, err
	}
	client := newRegistryClient(registryHost, caPool)

	// ci pushes shop/hello:v1 with a token the token service grants it
	// from its own service-account token.
	ciToken, err := nodeTokenFor(ctx, e.node, ci)
	if err != nil {
		return stop, err
	}
	e.secrets.add("service-account token of shop/ci", ciToken)
	ch := challenge{realm: realm, service: demoRegistryService}
	push, access, err := client.fetchToken(ctx, ch, "repository:shop/hello:pull,push", tokenservice.Username, ciToken)
	if err != nil {
		return stop, err
	}
	e.secrets.add("registry token for shop/ci's push", push)
	digest, err := client.pushDemoImage(ctx, "shop/hello", "v1", push)
	if err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "shop/ci (annotated %s=true) pushed %s (%s) with a token granting %v\n", demoPushAnnotation, image, digest, access)

	// kubelet, about to pull web's image, asks the plugin.
	fmt.Fprintf(out, "\nnode demo-node pulls %s for pod shop/web:\n", image)
	st, err := client.getManifest(ctx, "shop/hello", "v1", "")
	if err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "  anonymous:             registry answered %d (Bearer realm=%q service=%q scope=%q)\n",
		st.status, st.challenge.realm, st.challenge.service, st.challenge.scope)
	if st.status == 200 {
		return stop, errors.New("the registry served an anonymous pull")
	}
	webToken, err := nodeTokenFor(ctx, e.node, web)
	if err != nil {
		return stop, err
	}
	e.secrets.add("service-account token of shop/web", webToken)
	fmt.Fprintf(out, "  kubelet:               TokenRequest for shop/web, audience %s, bound to pod web (NodeRestriction: allowed by node-rbac.yaml)\n", demoAudience)
	user, password, resp, err := runDemoPlugin(ctx, e.plugin, "https://"+listen, caFile, registryHost+"/shop/hello", webToken)
	if err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "  keyward credential-provider answered: %s\n", resp)
	e.secrets.add("credential-provider password for shop/web", password)
	pull, access, err := client.fetchToken(ctx, st.challenge, st.challenge.scope, user, password)
	if err != nil {
		return stop, err
	}
	e.secrets.add("registry token for shop/web's pull", pull)
	fmt.Fprintf(out, "  realm (token service): token granting %v\n", access)
	got, err := client.getManifest(ctx, "shop/hello", "v1", pull)
	if err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "  with the token:        registry answered %d, manifest %s\n", got.status, got.digest)
	if got.status != 200 || got.digest != digest {
		return stop, fmt.Errorf("the pull with the plugin's credential got %d %s, want 200 %s", got.status, got.digest, digest)
	}
	// A repository outside the policy: the token service drops the scope,
	// the registry refuses.
	ch = challenge{realm: realm, service: demoRegistryService}
	other, access, err := client.fetchToken(ctx, ch, "repository:payments/ledger:pull", user, password)
	if err != nil {
		return stop, err
	}
	e.secrets.add("registry token for payments/ledger (no grant)", other)
	got, err = client.getManifest(ctx, "payments/ledger", "v1", other)
	if err != nil {
		return stop, err
	}
	fmt.Fprintf(out, "  payments/ledger (not shop's): token granting %v, registry answered %d (%s)\n", access, got.status, got.challenge.errorCode)
	if got.status == 200 || len(access) != 0 {
		return stop, errors.New("a repository outside the policy was granted")
	}
	fmt.Fprintf(out, "audit (token service log, logger \"audit\"):\n")
	for _, line := range auditLines(logFile.Name()) {
		fmt.Fprintf(out, "  %s\n", line)
	}
	return stop, nil
}

// waitGenerationActive waits until Authority name shows gen observed
// Active.
func waitGenerationActive(ctx context.Context, ac *authclient.Client, name, gen string) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		a, err := ac.Get(ctx, name)
		if err != nil {
			return false, nil // transient: poll again
		}
		st, ok := statusOf(a, gen)
		return ok && st.Phase == v1alpha1.PhaseActive, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for Authority %s to show %s Active: %w", name, gen, err)
	}
	return nil
}

// createDemoPod creates service account sa (with annotations) in the shop
// namespace and a pod of it on demo-node running image.
func createDemoPod(ctx context.Context, admin kubernetes.Interface, sa string, annotations map[string]string, image string) (*corev1.Pod, error) {
	if _, err := admin.CoreV1().ServiceAccounts(demoShopNamespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: sa, Annotations: annotations},
	}, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("creating service account %s/%s: %w", demoShopNamespace, sa, err)
	}
	automount := false
	pod, err := admin.CoreV1().Pods(demoShopNamespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
		Spec: corev1.PodSpec{
			NodeName: "demo-node", ServiceAccountName: sa, AutomountServiceAccountToken: &automount,
			Containers: []corev1.Container{{Name: "app", Image: image}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("creating pod %s/%s: %w", demoShopNamespace, sa, err)
	}
	return pod, nil
}

// nodeTokenFor is the TokenRequest kubelet makes for the plugin: pod's
// service account, audience demoAudience, bound to the pod, asked by the
// node (NodeRestriction checks the node may request that audience).
func nodeTokenFor(ctx context.Context, node kubernetes.Interface, pod *corev1.Pod) (string, error) {
	expiry := int64(600)
	tr, err := node.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{
			Audiences: []string{demoAudience}, ExpirationSeconds: &expiry,
			BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("the node requesting a %s token for %s/%s: %w", demoAudience, pod.Namespace, pod.Spec.ServiceAccountName, err)
	}
	return tr.Status.Token, nil
}

// runDemoPlugin runs `keyward credential-provider` as kubelet does, with a
// CredentialProviderRequest for image on stdin, and returns the credential
// for the image's registry and the response as shown (password hidden).
func runDemoPlugin(ctx context.Context, plugin []string, url, caFile, image, saToken string) (user, password, shown string, err error) {
	req, err := json.Marshal(map[string]any{
		"kind": "CredentialProviderRequest", "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
		"image": image, "serviceAccountToken": saToken,
	})
	if err != nil {
		return "", "", "", err
	}
	args := append(append([]string{}, plugin[1:]...), "credential-provider", "--token-service-url", url, "--ca-file", caFile)
	cmd := exec.CommandContext(ctx, plugin[0], args...)
	cmd.Stdin = bytes.NewReader(append(req, '\n'))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", "", "", fmt.Errorf("keyward credential-provider: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	var resp struct {
		CacheKeyType  string `json:"cacheKeyType"`
		CacheDuration string `json:"cacheDuration"`
		Auth          map[string]struct {
			Username string `json:"username"`
			Password string `json:"password"`
		} `json:"auth"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &resp); err != nil {
		return "", "", "", fmt.Errorf("keyward credential-provider's answer: %w", err)
	}
	host, _, _ := strings.Cut(image, "/")
	a, ok := resp.Auth[host]
	if !ok {
		return "", "", "", fmt.Errorf("keyward credential-provider answered no credential for %s: %s", host, stdout.String())
	}
	if a.Password != saToken {
		return "", "", "", fmt.Errorf("keyward credential-provider answered for %s a password that is not the pod's service-account token", host)
	}
	shown = fmt.Sprintf("auth[%s] = {username: %q, password: <the service-account token, %d bytes>}, cacheKeyType %s, cacheDuration %s",
		host, a.Username, len(a.Password), resp.CacheKeyType, resp.CacheDuration)
	return a.Username, a.Password, shown, nil
}

// auditLines are the token service's audit lines so far.
func auditLines(logPath string) []string {
	b, err := os.ReadFile(logPath)
	if err != nil {
		return []string{err.Error()}
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "Registry token granted") || strings.Contains(l, "Registry token refused") {
			lines = append(lines, l)
		}
	}
	return lines
}

// freeLoopbackAddr is a 127.0.0.1 address with a port free now.
func freeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
