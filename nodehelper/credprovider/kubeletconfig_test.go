package credprovider_test

import (
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/credprovider"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/validation"
	kubeletconfigv1 "k8s.io/kubelet/config/v1"
)

var kubeletConfigFile = filepath.Join("..", "..", "deploy", "examples", "registry-credentials", "kubelet-credential-provider-config.yaml")

// loadShippedKubeletConfig decodes the example file strictly (unknown or
// duplicate fields fail, as in kubelet) with kubelet's own v1 config types.
func loadShippedKubeletConfig(t *testing.T) *kubeletconfigv1.CredentialProvider {
	t.Helper()
	data, err := os.ReadFile(kubeletConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	scheme := runtime.NewScheme()
	if err := kubeletconfigv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj, gvk, err := serializer.NewCodecFactory(scheme, serializer.EnableStrict).UniversalDeserializer().Decode(data, nil, nil)
	if err != nil {
		t.Fatalf("decoding %s strictly: %v", kubeletConfigFile, err)
	}
	cfg, ok := obj.(*kubeletconfigv1.CredentialProviderConfig)
	if !ok || gvk.GroupVersion() != kubeletconfigv1.SchemeGroupVersion {
		t.Fatalf("%s decodes to %s %T", kubeletConfigFile, gvk, obj)
	}
	if len(cfg.Providers) != 1 {
		t.Fatalf("%d providers, want 1", len(cfg.Providers))
	}
	return &cfg.Providers[0]
}

// TestShippedKubeletConfigIsWhatKubeletAndThePluginNeed checks the example
// against kubelet's own validation rules (pkg/credentialprovider/plugin/
// config.go, k8s.io/kubernetes v1.37) and against this plugin's needs.
func TestShippedKubeletConfigIsWhatKubeletAndThePluginNeed(t *testing.T) {
	p := loadShippedKubeletConfig(t)

	if p.Name == "" || strings.ContainsAny(p.Name, "/ ") || p.Name == "." || p.Name == ".." {
		t.Errorf("name %q: kubelet wants a file name in its plugin bin dir", p.Name)
	}
	if p.APIVersion != credprovider.APIVersion {
		t.Errorf("apiVersion %q, want %s (tokenAttributes needs it)", p.APIVersion, credprovider.APIVersion)
	}
	if len(p.MatchImages) == 0 {
		t.Error("matchImages is empty")
	}
	for _, m := range p.MatchImages {
		if _, err := url.Parse("https://" + m); err != nil || strings.Contains(m, "://") {
			t.Errorf("matchImages %q is not a schemeless URL", m)
		}
	}
	if p.DefaultCacheDuration == nil || p.DefaultCacheDuration.Duration < 0 {
		t.Errorf("defaultCacheDuration %v: kubelet requires it, >= 0", p.DefaultCacheDuration)
	}

	ta := p.TokenAttributes
	if ta == nil {
		t.Fatal("no tokenAttributes: kubelet would send no service-account token")
	}
	if ta.ServiceAccountTokenAudience != "keyward.dev/registry" {
		t.Errorf("serviceAccountTokenAudience %q, want keyward.dev/registry (node-rbac.yaml grants that one)", ta.ServiceAccountTokenAudience)
	}
	if ta.RequireServiceAccount == nil || !*ta.RequireServiceAccount {
		t.Error("requireServiceAccount must be true")
	}
	// The plugin answers with the token as the password; kubelet accepts
	// that only with cacheType Token.
	if ta.CacheType != kubeletconfigv1.TokenServiceAccountTokenCacheType {
		t.Errorf("cacheType %q, want %s", ta.CacheType, kubeletconfigv1.TokenServiceAccountTokenCacheType)
	}
	keys := append(append([]string(nil), ta.RequiredServiceAccountAnnotationKeys...), ta.OptionalServiceAccountAnnotationKeys...)
	seen := map[string]bool{}
	for _, k := range keys {
		if errs := validation.IsQualifiedName(strings.ToLower(k)); len(errs) > 0 || seen[k] {
			t.Errorf("annotation key %q: %v (or listed twice)", k, errs)
		}
		seen[k] = true
	}

	if len(p.Args) == 0 || p.Args[0] != "credential-provider" {
		t.Fatalf("args %q must start with the credential-provider subcommand", p.Args)
	}
	for _, want := range []string{"--token-service-url=https://", "--ca-file="} {
		if !hasArgPrefix(p.Args, want) {
			t.Errorf("args %q lack %s…", p.Args, want)
		}
	}
}

// TestShippedKubeletConfigArgsRunThePlugin runs the binary with the
// example's args (the URL and CA file pointed at a test token service) on
// a request as kubelet writes it, and judges the answer as kubelet would
// under the example's cacheType.
func TestShippedKubeletConfigArgsRunThePlugin(t *testing.T) {
	p := loadShippedKubeletConfig(t)
	exp := time.Now().Add(time.Hour)
	ts := newTokenService(t, grant(exp))

	args := make([]string, 0, len(p.Args))
	for _, a := range p.Args[1:] {
		switch {
		case strings.HasPrefix(a, "--token-service-url="):
			a = "--token-service-url=" + ts.URL
		case strings.HasPrefix(a, "--ca-file="):
			a = "--ca-file=" + ts.caFile
		}
		args = append(args, a)
	}
	image := p.MatchImages[0] + "/team/app"
	token := fakeJWT(exp)
	run := runPlugin(t, kubeletRequest(t, image, token, nil), args...)
	if run.exit != 0 {
		t.Fatalf("exit %d: %s", run.exit, run.stderr)
	}
	resp, err := kubeletDecode([]byte(run.stdout))
	if err != nil {
		t.Fatal(err)
	}
	// Kubelet's rule: an answer whose password is the token it sent is
	// refused unless cacheType is Token.
	for key, auth := range resp.Auth {
		if auth.Password == token && p.TokenAttributes.CacheType != kubeletconfigv1.TokenServiceAccountTokenCacheType {
			t.Errorf("auth[%s] echoes the token and cacheType is %q: kubelet would refuse it", key, p.TokenAttributes.CacheType)
		}
	}
	if _, ok := resp.Auth[p.MatchImages[0]]; !ok {
		t.Errorf("auth %v has no entry for %s", resp.Auth, p.MatchImages[0])
	}
}

func hasArgPrefix(args []string, prefix string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, prefix) {
			return true
		}
	}
	return false
}
