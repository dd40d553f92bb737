package registrycredentials_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"maps"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/sirupsen/logrus"
	appsv1 "k8s.io/api/apps/v1"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kjson "k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	certv1ac "k8s.io/client-go/applyconfigurations/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	kubeletv1 "k8s.io/kubelet/config/v1"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/backends"
	registrycredentials "github.com/keyward/keyward/deploy/examples/registry-credentials"
	"github.com/keyward/keyward/deploy/rbac"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/registrytoken"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
	"github.com/keyward/keyward/testsupport/controlplane"

	// The token access controller and the in-memory storage driver
	// register themselves by name.
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

// The token service's identity, as token-service.yaml names it.
const (
	namespace      = "keyward"
	serviceAccount = "keyward-token-service"
	signerName     = "keyward.dev/registry-token"
)

func read(t *testing.T, name string) []byte {
	t.Helper()
	b, err := registrycredentials.Files.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// documents splits a multi-document YAML file, without empty or
// comment-only documents.
func documents(t *testing.T, data []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := yaml.Unmarshal(doc, &m); err != nil {
			t.Fatal(err)
		}
		if len(m) > 0 {
			docs = append(docs, doc)
		}
	}
}

// tokenServiceObjects decodes every document of token-service.yaml and of
// the RBAC deploy/rbac renders for its configuration (tokenServiceRBAC)
// strictly (unknown or duplicate fields are errors) into client-go's types.
func tokenServiceObjects(t *testing.T) []runtime.Object {
	t.Helper()
	return append(decodeStrict(t, "token-service.yaml", read(t, "token-service.yaml")),
		decodeStrict(t, "the rendered RBAC", tokenServiceRBAC(t))...)
}

func decodeStrict(t *testing.T, what string, data []byte) []runtime.Object {
	t.Helper()
	dec := kjson.NewSerializerWithOptions(kjson.DefaultMetaFactory, scheme.Scheme, scheme.Scheme, kjson.SerializerOptions{Yaml: true, Strict: true})
	var objs []runtime.Object
	for _, doc := range documents(t, data) {
		obj, _, err := dec.Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// tokenServiceRBAC is the token service's ServiceAccount and RBAC, as
// `keyward deploy rbac --token-service-config` renders them for the
// ConfigMap's configuration (token-service.yaml carries none).
func tokenServiceRBAC(t *testing.T) []byte {
	t.Helper()
	_, cfg := tokenServiceConfig(t, decodeStrict(t, "token-service.yaml", read(t, "token-service.yaml")))
	ts := rbac.FromTokenServiceConfig(cfg)
	out, err := rbac.RenderYAML(rbac.Input{Namespace: namespace, TokenService: &ts})
	if err != nil {
		t.Fatalf("rendering the token service's RBAC: %v", err)
	}
	return out
}

func find[T runtime.Object](t *testing.T, objs []runtime.Object) []T {
	t.Helper()
	var out []T
	for _, o := range objs {
		if o, ok := o.(T); ok {
			out = append(out, o)
		}
	}
	if len(out) == 0 {
		var zero T
		t.Fatalf("token-service.yaml holds no %T", zero)
	}
	return out
}

// tokenServiceConfig is the ConfigMap's TokenServiceConfiguration, decoded
// strictly.
func tokenServiceConfig(t *testing.T, objs []runtime.Object) (*corev1.ConfigMap, *tsconfig.TokenServiceConfiguration) {
	t.Helper()
	cm := find[*corev1.ConfigMap](t, objs)[0]
	cfg, err := tsconfig.Parse([]byte(cm.Data["config.yaml"]))
	if err != nil {
		t.Fatalf("the ConfigMap's config.yaml, as keyward token-service reads it: %v", err)
	}
	return cm, cfg
}

func port(t *testing.T, addr string) string {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("address %q: %v", addr, err)
	}
	return p
}

// The token service's manifests agree with its configuration: the
// Deployment runs `keyward token-service` on the ConfigMap's file with
// every file the configuration names on a mount, non-root on a read-only
// root filesystem, two replicas kept by a PodDisruptionBudget; the Service
// and probes point at the configured ports; the Lease it elects on is its
// own and the only one its Role updates; its attest grant is exactly the
// configured signer name.
func TestTokenServiceManifestsAgreeWithTheConfiguration(t *testing.T) {
	objs := tokenServiceObjects(t)
	cm, cfg := tokenServiceConfig(t, objs)
	dep := find[*appsv1.Deployment](t, objs)[0]
	spec := dep.Spec.Template.Spec
	c := spec.Containers[0]

	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		t.Errorf("replicas %v, want at least 2", dep.Spec.Replicas)
	}
	if spec.ServiceAccountName != serviceAccount {
		t.Errorf("the pods run as %q", spec.ServiceAccountName)
	}
	if sc := spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
		t.Error("the pod may run as root")
	}
	if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("the container's root filesystem is writable or it may escalate privileges")
	}

	volume := func(mountedAt string) *corev1.Volume {
		for _, m := range c.VolumeMounts {
			if mountedAt == m.MountPath || strings.HasPrefix(mountedAt, m.MountPath+"/") {
				i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
				if i < 0 {
					t.Fatalf("mount %s has no volume", m.Name)
				}
				return &spec.Volumes[i]
			}
		}
		return nil
	}
	args := strings.Join(c.Args, " ")
	cfgPath, ok := strings.CutPrefix(args, "token-service --config=")
	if !ok {
		t.Fatalf("args %q do not run token-service --config", args)
	}
	if v := volume(cfgPath); v == nil || v.ConfigMap == nil || v.ConfigMap.Name != cm.Name || filepath.Base(cfgPath) != "config.yaml" {
		t.Errorf("%s is not the ConfigMap %s's config.yaml", cfgPath, cm.Name)
	}
	tlsSecret := ""
	for _, f := range []string{cfg.Listen.TLSCertFile, cfg.Listen.TLSKeyFile} {
		v := volume(f)
		if v == nil || v.Secret == nil {
			t.Errorf("%s is on no Secret volume", f)
			continue
		}
		tlsSecret = v.Secret.SecretName
	}
	if tlsSecret == "" {
		t.Error("no TLS Secret")
	}

	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	for name, addr := range map[string]string{"https": cfg.Listen.Address, "metrics": cfg.MetricsAddress, "health": cfg.HealthAddress} {
		if got := ports[name]; got == 0 || port(t, addr) != strconv.Itoa(int(got)) {
			t.Errorf("container port %s is %d, the configuration listens on %s", name, got, addr)
		}
	}
	for what, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Port.String() != "health" {
			t.Errorf("the %s probe does not ask the health port: %+v", what, p)
		}
	}
	if p := c.ReadinessProbe; p != nil && p.HTTPGet != nil && p.HTTPGet.Path != "/readyz" {
		t.Errorf("readiness asks %s, want /readyz (fails until the key is open)", p.HTTPGet.Path)
	}

	svc := find[*corev1.Service](t, objs)[0]
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 443 || svc.Spec.Ports[0].TargetPort.String() != "https" {
		t.Errorf("the Service does not map 443 to the https port: %+v", svc.Spec.Ports)
	}
	labels := dep.Spec.Template.Labels
	selects := func(sel map[string]string) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return len(sel) > 0
	}
	if !selects(svc.Spec.Selector) {
		t.Errorf("the Service's selector %v does not select the pods %v", svc.Spec.Selector, labels)
	}
	pdb := find[*policyv1.PodDisruptionBudget](t, objs)[0]
	if pdb.Spec.Selector == nil || !selects(pdb.Spec.Selector.MatchLabels) || pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("the PodDisruptionBudget does not keep one of the pods: %+v", pdb.Spec)
	}

	if cfg.SignerName != signerName {
		t.Errorf("signerName %q, want %q", cfg.SignerName, signerName)
	}
	le := cfg.LeaderElection
	if le.Namespace != namespace || le.LeaseName == "" || le.LeaseName == "keyward-signer" {
		t.Errorf("leaderElection %s/%s: want its own Lease in %s, not the signer's", le.Namespace, le.LeaseName, namespace)
	}
	role := find[*rbacv1.Role](t, objs)[0]
	if role.Namespace != le.Namespace {
		t.Errorf("the leader election Role is in %s, the Lease in %s", role.Namespace, le.Namespace)
	}
	for _, r := range role.Rules {
		if slices.Contains(r.Verbs, "update") && !slices.Equal(r.ResourceNames, []string{le.LeaseName}) {
			t.Errorf("the Role updates Leases %v, want only %s", r.ResourceNames, le.LeaseName)
		}
	}
	cr := find[*rbacv1.ClusterRole](t, objs)[0]
	for _, r := range cr.Rules {
		if slices.Contains(r.Resources, "signers") && !slices.Equal(r.ResourceNames, []string{cfg.SignerName}) {
			t.Errorf("the ClusterRole grants %v on signers %v, want only %s", r.Verbs, r.ResourceNames, cfg.SignerName)
		}
	}
}

// registryConfig is registry-config.yml as Distribution parses it.
func registryConfig(t *testing.T) *configuration.Configuration {
	t.Helper()
	// Parse lets REGISTRY_* variables override the file.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "REGISTRY_") {
			t.Setenv(k, "")
			os.Unsetenv(k)
		}
	}
	cfg, err := configuration.Parse(bytes.NewReader(read(t, "registry-config.yml")))
	if err != nil {
		t.Fatalf("Distribution refuses registry-config.yml: %v", err)
	}
	return cfg
}

// The registry configuration is valid for Distribution's own parser and
// its auth.token block agrees with the token service's configuration:
// the realm is an https /token, service is a configured registry,
// issuer is the token service's, the roots come from a file, and
// signingalgorithms is exactly the JWS algorithm of `keyward ca init`'s
// default key (ECDSAP256 → ES256): no HS*, nothing else.
func TestRegistryConfigAgreesWithTheTokenService(t *testing.T) {
	objs := tokenServiceObjects(t)
	_, ts := tokenServiceConfig(t, objs)
	cfg := registryConfig(t)

	if cfg.Auth.Type() != "token" {
		t.Fatalf("auth is %q, want token", cfg.Auth.Type())
	}
	p := cfg.Auth["token"]
	str := func(k string) string { s, _ := p[k].(string); return s }
	realm, err := url.Parse(str("realm"))
	if err != nil {
		t.Fatalf("realm: %v", err)
	}
	if realm.Scheme != "https" || realm.Host == "" || realm.Path != "/token" {
		t.Errorf("realm %s, want https://HOST/token", realm)
	}
	if !slices.ContainsFunc(ts.Registries, func(r tsconfig.Registry) bool { return r.Service == str("service") }) {
		t.Errorf("service %q is none of the token service's registries %+v", str("service"), ts.Registries)
	}
	if str("issuer") != ts.Issuer {
		t.Errorf("issuer %q, the token service signs as %q", str("issuer"), ts.Issuer)
	}
	if !filepath.IsAbs(str("rootcertbundle")) {
		t.Errorf("rootcertbundle %q is not a file path", str("rootcertbundle"))
	}
	if _, ok := p["jwks"]; ok {
		t.Error("the example sets jwks too: with x5c tokens only the rootcertbundle is needed")
	}
	if ts.KeyIdentifier != tsconfig.KeyIdentifierX5C {
		t.Errorf("keyIdentifier %q: the example's registry trusts x5c chains ending at the bundle", ts.KeyIdentifier)
	}
	want, err := registrytoken.JOSEAlgorithm(backends.ECDSAP256SHA256)
	if err != nil {
		t.Fatal(err)
	}
	algs, _ := p["signingalgorithms"].([]any)
	if len(algs) != 1 || algs[0] != want {
		t.Errorf("signingalgorithms %v, want exactly [%s]", p["signingalgorithms"], want)
	}
}

// A registry built from registry-config.yml (storage swapped for memory,
// the roots file for one holding a test key's certificate, TLS left to the
// test server) accepts a token minted by registrytoken with the trusted
// P-256 key (x5c or kid), and refuses a token signed with RS256 by an RSA
// key whose certificate it also trusts — signingalgorithms, not the keys,
// refuses that one — an HS256 token, an expired token and a token for
// another service.
func TestRegistryConfigAcceptsOnlyTheAuthoritysAlgorithm(t *testing.T) {
	cfg := registryConfig(t)
	params := cfg.Auth["token"]

	ecKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	ecCert, rsaCert := selfSigned(t, ecKey), selfSigned(t, rsaKey)
	var bundle bytes.Buffer
	for _, c := range []*x509.Certificate{ecCert, rsaCert} {
		if err := pem.Encode(&bundle, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}); err != nil {
			t.Fatal(err)
		}
	}
	roots := filepath.Join(t.TempDir(), "roots.pem")
	if err := os.WriteFile(roots, bundle.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	params["rootcertbundle"] = roots
	cfg.Storage = configuration.Storage{
		"inmemory":    configuration.Parameters{},
		"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
	}
	cfg.HTTP.TLS = configuration.TLS{}
	cfg.HTTP.Secret = hex.EncodeToString(ecCert.SubjectKeyId) + "-test-secret"
	cfg.Log.AccessLog.Disabled = true
	if os.Getenv("KEYWARD_TEST_REGISTRY_LOG") == "" {
		logrus.SetOutput(io.Discard)
	}
	srv := startRegistry(t, cfg)

	issuer, service := params["issuer"].(string), params["service"].(string)
	now := time.Now()
	mint := func(key crypto.Signer, cert *x509.Certificate, mutate func(*registrytoken.Token)) string {
		tok := registrytoken.Token{Issuer: issuer, Audience: service, Subject: "system:serviceaccount:team-a:default",
			NotBefore: now, Expiry: now.Add(5 * time.Minute), Chain: []*x509.Certificate{cert}}
		if mutate != nil {
			mutate(&tok)
		}
		s, err := registrytoken.Mint(context.Background(), key, tok)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	kid, err := registrytoken.Thumbprint(ecKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		token string
		want  int
	}{
		{"an ES256 token with x5c is accepted", mint(ecKey, ecCert, nil), http.StatusOK},
		{"an ES256 token with kid is accepted", mint(ecKey, ecCert, func(tok *registrytoken.Token) { tok.Chain, tok.KeyID = nil, kid }), http.StatusOK},
		{"an RS256 token from a trusted key is refused", mint(rsaKey, rsaCert, nil), http.StatusUnauthorized},
		{"an HS256 token is refused", hs256(t, issuer, service, ecCert), http.StatusUnauthorized},
		{"an expired token is refused", mint(ecKey, ecCert, func(tok *registrytoken.Token) {
			tok.NotBefore, tok.Expiry = now.Add(-time.Hour), now.Add(-30*time.Minute)
		}), http.StatusUnauthorized},
		{"a token for another service is refused", mint(ecKey, ecCert, func(tok *registrytoken.Token) { tok.Audience = "other.example.com" }), http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest(http.MethodGet, srv.URL+"/v2/", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET /v2/: %s, want %d", resp.Status, tc.want)
			}
		})
	}
}

// startRegistry serves a Distribution registry built from cfg until the
// test ends; NewApp panics on a bad configuration, which this turns into a
// test failure.
func startRegistry(t *testing.T, cfg *configuration.Configuration) *httptest.Server {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	app := func() (app *handlers.App) {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("Distribution refuses the configuration: %v", p)
			}
		}()
		return handlers.NewApp(ctx, cfg)
	}()
	srv := httptest.NewServer(app)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		_ = app.Shutdown()
	})
	return srv
}

// hs256 is a token MACed with HS256 (key: the trusted certificate's DER,
// which an attacker knows), carrying that certificate in x5c.
func hs256(t *testing.T, issuer, service string, cert *x509.Certificate) string {
	t.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	h, err := json.Marshal(map[string]any{"alg": "HS256", "typ": "JWT", "x5c": []string{base64.StdEncoding.EncodeToString(cert.Raw)}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().Unix()
	c, err := json.Marshal(map[string]any{"iss": issuer, "aud": service, "sub": "x", "nbf": now, "iat": now, "exp": now + 300, "jti": "x", "access": []any{}})
	if err != nil {
		t.Fatal(err)
	}
	in := b64(h) + "." + b64(c)
	mac := hmac.New(sha256.New, cert.Raw)
	mac.Write([]byte(in))
	return in + "." + b64(mac.Sum(nil))
}

func selfSigned(t *testing.T, key crypto.Signer) *x509.Certificate {
	t.Helper()
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(now.UnixNano()), NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

// Against a real apiserver (Node,RBAC authorization): every object of
// token-service.yaml passes a server-side dry run, then applies; the
// apiserver's own authorizer (SubjectAccessReviews) grants the token
// service's identity exactly what it needs and refuses the rest; and as
// that identity a ClusterTrustBundle for its signer name is admitted, one
// for another name refused.
func TestTokenServiceAppliesWithLeastPrivilege(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	admin := cp.AdminClient()
	if err := controlplane.EnsureNamespace(ctx, admin, namespace); err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), tokenServiceRBAC(t)); err != nil {
		t.Fatalf("applying the rendered RBAC: %v", err)
	}
	manifest := read(t, "token-service.yaml")
	if err := controlplane.DryRunManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("server-side dry run: %v", err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatal(err)
	}

	// The doc's projected volume for an in-cluster registry is admitted,
	// and puts the bundle where registry-config.yml reads it.
	var vols struct {
		Volumes []corev1.Volume `json:"volumes"`
	}
	if err := yaml.UnmarshalStrict(docBlock(t, "clusterTrustBundle:"), &vols); err != nil || len(vols.Volumes) != 1 {
		t.Fatalf("the doc's projected volume: %v (%d volumes)", err, len(vols.Volumes))
	}
	ctbVol := vols.Volumes[0]
	bundlePath, _ := registryConfig(t).Auth["token"]["rootcertbundle"].(string)
	mountDir := filepath.Dir(bundlePath)
	// By signer name and the live label, not by name: kubelet v1.37 keeps
	// a by-name projection stale for its cache TTL (docs/rotation.md,
	// node-tests TestCARotationUnderLiveMTLS).
	liveLabel := map[string]string{v1alpha1.BundleVersionLabel("keyward.dev"): "live"}
	if src := ctbVol.Projected.Sources[0].ClusterTrustBundle; src == nil || src.Name != nil || src.SignerName == nil || *src.SignerName != signerName ||
		src.LabelSelector == nil || !maps.Equal(src.LabelSelector.MatchLabels, liveLabel) || len(src.LabelSelector.MatchExpressions) > 0 || mountDir+"/"+src.Path != bundlePath {
		t.Errorf("the doc's volume does not project %s's bundle labelled %v (by signer name) to %s mounted at %s: %+v", signerName, liveLabel, bundlePath, mountDir, src)
	}
	// No controller manager makes default ServiceAccounts here.
	if _, err := admin.CoreV1().ServiceAccounts(namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: "registry"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "registry"},
		Spec: corev1.PodSpec{
			ServiceAccountName: "registry",
			Containers: []corev1.Container{{Name: "registry", Image: "registry:3",
				VolumeMounts: []corev1.VolumeMount{{Name: ctbVol.Name, MountPath: mountDir, ReadOnly: true}}}},
			Volumes: []corev1.Volume{ctbVol},
		},
	}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a registry pod with the doc's volume: %v", err)
	}

	user := "system:serviceaccount:" + namespace + ":" + serviceAccount
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}
	type attrs = authzv1.ResourceAttributes
	for _, tc := range []struct {
		name string
		a    attrs
		want bool
	}{
		{"it may create TokenReviews", attrs{Group: "authentication.k8s.io", Resource: "tokenreviews", Verb: "create"}, true},
		{"it may get a pod in any namespace", attrs{Namespace: "team-a", Resource: "pods", Verb: "get", Name: "web-0"}, true},
		{"it may get a ServiceAccount in any namespace", attrs{Namespace: "team-a", Resource: "serviceaccounts", Verb: "get", Name: "default"}, true},
		{"it may attest its signer name", attrs{Group: "certificates.k8s.io", Resource: "signers", Verb: "attest", Name: signerName}, true},
		{"it may watch Authorities", attrs{Group: "keyward.dev", Resource: "authorities", Verb: "watch"}, true},
		{"it may patch an Authority's status", attrs{Group: "keyward.dev", Resource: "authorities", Subresource: "status", Verb: "patch", Name: "keyward.dev.registry-token"}, true},
		{"it may apply a ClusterTrustBundle", attrs{Group: "certificates.k8s.io", Resource: "clustertrustbundles", Verb: "patch", Name: "keyward.dev:registry-token:live"}, true},
		{"it may create its own ClusterTrustBundle (server-side apply)", attrs{Group: "certificates.k8s.io", Resource: "clustertrustbundles", Verb: "create", Name: "keyward.dev:registry-token:canary"}, true},
		{"it may not delete another signer's ClusterTrustBundle", attrs{Group: "certificates.k8s.io", Resource: "clustertrustbundles", Verb: "delete", Name: "keyward.dev:pod-identity:live"}, false},
		{"it may not patch another signer's Authority status", attrs{Group: "keyward.dev", Resource: "authorities", Subresource: "status", Verb: "patch", Name: "keyward.dev.pod-identity"}, false},
		{"it may renew its Lease", attrs{Namespace: namespace, Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Name: "keyward-token-service"}, true},
		{"it may create Events", attrs{Namespace: "default", Resource: "events", Verb: "create"}, true},

		{"it may not list pods", attrs{Namespace: "team-a", Resource: "pods", Verb: "list"}, false},
		{"it may not list pods cluster-wide", attrs{Resource: "pods", Verb: "list"}, false},
		{"it may not watch pods", attrs{Resource: "pods", Verb: "watch"}, false},
		{"it may not list ServiceAccounts", attrs{Resource: "serviceaccounts", Verb: "list"}, false},
		{"it may not get Secrets", attrs{Namespace: "team-a", Resource: "secrets", Verb: "get", Name: "registry-pull"}, false},
		{"it may not list Secrets", attrs{Resource: "secrets", Verb: "list"}, false},
		{"it may not create service-account tokens", attrs{Namespace: "team-a", Resource: "serviceaccounts", Subresource: "token", Verb: "create", Name: "default"}, false},
		{"it may not attest another signer name", attrs{Group: "certificates.k8s.io", Resource: "signers", Verb: "attest", Name: "keyward.dev/pod-identity"}, false},
		{"it may not attest the whole domain", attrs{Group: "certificates.k8s.io", Resource: "signers", Verb: "attest", Name: "keyward.dev/*"}, false},
		{"it may not sign for its signer name", attrs{Group: "certificates.k8s.io", Resource: "signers", Verb: "sign", Name: signerName}, false},
		{"it may not update PodCertificateRequest status", attrs{Group: "certificates.k8s.io", Resource: "podcertificaterequests", Subresource: "status", Verb: "update"}, false},
		{"it may not create Authorities", attrs{Group: "keyward.dev", Resource: "authorities", Verb: "create"}, false},
		{"it may not update Authorities", attrs{Group: "keyward.dev", Resource: "authorities", Verb: "update", Name: "keyward.dev.registry-token"}, false},
		{"it may not renew the signer's Lease", attrs{Namespace: namespace, Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Name: "keyward-signer"}, false},
		{"it may not create Leases in other namespaces", attrs{Namespace: "team-a", Group: "coordination.k8s.io", Resource: "leases", Verb: "create"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := tc.a
			r, err := admin.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
				Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &a},
			}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if r.Status.Allowed != tc.want {
				t.Errorf("allowed = %v, want %v (%s)", r.Status.Allowed, tc.want, r.Status.Reason)
			}
		})
	}

	// As the token service itself: the apiserver's ClusterTrustBundle
	// admission (attest on spec.signerName) and the RBAC above together.
	sa, err := cp.ServiceAccountConfig(namespace, serviceAccount)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(sa)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	root := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: selfSigned(t, key).Raw})
	ctb := func(signer string) *certv1.ClusterTrustBundle {
		return &certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(signer, "/", ":") + ":live"},
			Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: string(root)},
		}
	}
	// As the trust publisher publishes: server-side apply (a plain create
	// carries no name to authorize, and the grant names its bundles).
	own := ctb(signerName)
	apply := certv1ac.ClusterTrustBundle(own.Name).
		WithSpec(certv1ac.ClusterTrustBundleSpec().WithSignerName(signerName).WithTrustBundle(own.Spec.TrustBundle))
	if _, err := cs.CertificatesV1().ClusterTrustBundles().Apply(ctx, apply, metav1.ApplyOptions{FieldManager: "keyward-trustpublisher", Force: true}); err != nil {
		t.Errorf("publishing its own signer's bundle: %v", err)
	}
	if _, err := cs.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb("keyward.dev/pod-identity"), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("publishing another signer's bundle: got %v, want Forbidden", err)
	}
	if _, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: "not-a-token", Audiences: []string{"keyward.dev/registry"}},
	}, metav1.CreateOptions{}); err != nil {
		t.Errorf("creating a TokenReview: %v", err)
	}
}

// docBlocks returns the fenced ```yaml blocks of docs/registry-credentials.md,
// each without the indentation of its fence.
func docBlocks(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("../../../docs/registry-credentials.md")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []string
	var cur []string
	indent, in := "", false
	for _, l := range strings.Split(string(doc), "\n") {
		trimmed := strings.TrimLeft(l, " ")
		switch {
		case !in && trimmed == "```yaml":
			in, indent, cur = true, l[:len(l)-len(trimmed)], nil
		case in && trimmed == "```":
			in = false
			blocks = append(blocks, strings.Join(cur, "\n")+"\n")
		case in:
			cur = append(cur, strings.TrimPrefix(l, indent))
		}
	}
	return blocks
}

func docBlock(t *testing.T, marker string) []byte {
	t.Helper()
	for _, b := range docBlocks(t) {
		if strings.Contains(b, marker) {
			return []byte(b)
		}
	}
	t.Fatalf("docs/registry-credentials.md has no yaml block holding %q", marker)
	return nil
}

// The configuration and the registry's auth block that
// docs/registry-credentials.md shows are the example's, value for value.
func TestDocShowsTheExample(t *testing.T) {
	_, want := tokenServiceConfig(t, tokenServiceObjects(t))
	got, err := tsconfig.Parse(docBlock(t, "kind: TokenServiceConfiguration"))
	if err != nil {
		t.Fatalf("the doc's configuration: %v", err)
	}
	if !equalJSON(t, got, want) {
		t.Errorf("the doc's configuration differs from token-service.yaml's:\n%s", docBlock(t, "kind: TokenServiceConfiguration"))
	}
	var doc struct {
		Auth configuration.Auth `json:"auth"`
	}
	if err := yaml.UnmarshalStrict(docBlock(t, "realm:"), &doc); err != nil {
		t.Fatalf("the doc's auth block: %v", err)
	}
	if !equalJSON(t, doc.Auth, registryConfig(t).Auth) {
		t.Errorf("the doc's auth block differs from registry-config.yml's: %v", doc.Auth)
	}
}

func equalJSON(t *testing.T, a, b any) bool {
	t.Helper()
	ja, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Equal(ja, jb)
}

// The kubelet's CredentialProviderConfig (kubelet-credential-provider-config.yaml)
// agrees with the token service and the registry: it asks for tokens of the
// token service's audience, caches per token (the credential is the token),
// sends only images of configured registry hosts to the plugin, and points
// the plugin at the host the registry names as its realm.
func TestKubeletConfigAgreesWithTheTokenService(t *testing.T) {
	data, err := registrycredentials.Files.ReadFile("kubelet-credential-provider-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kc kubeletv1.CredentialProviderConfig
	if err := yaml.UnmarshalStrict(data, &kc); err != nil {
		t.Fatalf("kubelet-credential-provider-config.yaml: %v", err)
	}
	_, ts := tokenServiceConfig(t, tokenServiceObjects(t))
	realm, err := url.Parse(registryConfig(t).Auth["token"]["realm"].(string))
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(kc.Providers, func(p kubeletv1.CredentialProvider) bool {
		return len(p.Args) > 0 && p.Args[0] == "credential-provider"
	})
	if i < 0 {
		t.Fatal("no provider runs keyward credential-provider")
	}
	p := kc.Providers[i]
	ta := p.TokenAttributes
	if ta == nil || ta.ServiceAccountTokenAudience != ts.Audience {
		t.Errorf("tokenAttributes %+v: want serviceAccountTokenAudience %q", ta, ts.Audience)
	} else if ta.CacheType != kubeletv1.TokenServiceAccountTokenCacheType || ta.RequireServiceAccount == nil || !*ta.RequireServiceAccount {
		t.Errorf("tokenAttributes %+v: want cacheType Token and requireServiceAccount", ta)
	}
	var hosts []string
	for _, r := range ts.Registries {
		hosts = append(hosts, r.Hosts...)
		if len(r.Hosts) == 0 {
			hosts = append(hosts, r.Service)
		}
	}
	for _, m := range p.MatchImages {
		if !slices.Contains(hosts, m) {
			t.Errorf("matchImages %q is no configured registry host %v: the kubelet would hand the pod's token to it", m, hosts)
		}
	}
	var base string
	for _, a := range p.Args {
		if v, ok := strings.CutPrefix(a, "--token-service-url="); ok {
			base = v
		}
	}
	if base+"/token" != realm.String() {
		t.Errorf("the plugin calls %s, the registry sends clients to %s: one token service, one name", base, realm)
	}
}

// kustomization.yaml lists every manifest of Kubernetes objects in the
// example (not the kubelet's configuration, which goes to the nodes).
func TestKustomizationListsEveryManifest(t *testing.T) {
	var kust struct {
		APIVersion string   `json:"apiVersion"`
		Kind       string   `json:"kind"`
		Resources  []string `json:"resources"`
	}
	if err := yaml.UnmarshalStrict(read(t, "kustomization.yaml"), &kust); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	all, err := fs.Glob(registrycredentials.Files, "*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range all {
		if n == "kustomization.yaml" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
		}
		if err := yaml.Unmarshal(documents(t, read(t, n))[0], &head); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
		if strings.HasPrefix(head.APIVersion, "kubelet.config.k8s.io/") {
			continue
		}
		if !slices.Contains(kust.Resources, n) {
			t.Errorf("kustomization.yaml does not list %s", n)
		}
	}
}

// The policy examples docs/registry-credentials.md tables ("Policy") are
// what the example's rules grant.
func TestDocumentedPolicyExamples(t *testing.T) {
	_, cfg := tokenServiceConfig(t, tokenServiceObjects(t))
	p, err := policy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../../docs/registry-credentials.md")
	if err != nil {
		t.Fatal(err)
	}
	push := map[string]string{"keyward.dev/registry-push": "true"}
	for _, tc := range []struct {
		name        string
		ns, sa      string
		annotations map[string]string
		scope       string
		want        string // granted, as repository:actions; "" for nothing
	}{
		{"a service account pulls its namespace's images", "team-a", "default", nil, "repository:team-a/web:pull", "team-a/web:pull"},
		{"push is dropped without the annotation", "team-a", "default", nil, "repository:team-a/web:pull,push", "team-a/web:pull"},
		{"an annotated service account pushes", "team-a", "ci", push, "repository:team-a/web:pull,push", "team-a/web:pull,push"},
		{"another namespace's images are dropped", "team-a", "default", nil, "repository:team-b/web:pull", ""},
		{"the namespace's own name is not below it", "team-a", "default", nil, "repository:team-a:pull", ""},
		{"base images are for everyone", "x", "y", nil, "repository:base/debian:pull", "base/debian:pull"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(doc, []byte("`"+tc.scope+"`")) {
				t.Errorf("the doc's table no longer shows %s", tc.scope)
			}
			scopes, errs := policy.ParseScopes([]string{tc.scope})
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			granted, _ := p.Grant(policy.Identity{Namespace: tc.ns, ServiceAccount: tc.sa, Annotations: tc.annotations}, cfg.Registries[0].Service, scopes)
			var got string
			for _, g := range granted {
				got = g.Name + ":" + strings.Join(g.Actions, ",")
			}
			if len(granted) > 1 || got != tc.want {
				t.Errorf("granted %+v, want %q", granted, tc.want)
			}
		})
	}
}
