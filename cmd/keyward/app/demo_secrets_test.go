package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/keyward/keyward/demo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// jwtPattern is any JWT (service-account or registry token): a base64url
// JSON header and payload, each beginning with `{"`.
var jwtPattern = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}`)

// demoLeaks names, for every secret found in a source, what leaked where,
// without the secret itself. Besides the given secrets it looks for a
// private key PEM and for any JWT.
func demoLeaks(sources, secrets map[string]string) []string {
	var leaks []string
	for where, text := range sources {
		for what, secret := range secrets {
			if secret != "" && strings.Contains(text, secret) {
				leaks = append(leaks, fmt.Sprintf("%s leaked into %s", what, where))
			}
		}
		if strings.Contains(text, "PRIVATE KEY") {
			leaks = append(leaks, fmt.Sprintf("a private key PEM (\"PRIVATE KEY\") is in %s", where))
		}
		if m := jwtPattern.FindString(text); m != "" {
			leaks = append(leaks, fmt.Sprintf("a JWT (%.12s…) is in %s", m, where))
		}
	}
	slices.Sort(leaks)
	return leaks
}

// The leak scan finds each kind of secret it is given, a private key PEM
// and an unlisted JWT, names the source, and passes clean text: without
// this TestDemoOnce's scan could pass for finding nothing.
func TestDemoLeakScanFindsPlantedSecrets(t *testing.T) {
	jwt := "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2ln"
	sources := map[string]string{
		"signer.log":   "I1127 msg=\"login\" pin=\"s3cr3t-pin\"",
		"Events":       "reason: GateOverridden\n-----BEGIN EC PRIVATE KEY-----\n",
		"metrics http": "keyward_tokens_total 1\n# " + jwt,
		"clean":        "keyward_signer_up 1\nEvent Issued pod demo/demo-app",
	}
	got := demoLeaks(sources, map[string]string{"the token PIN": "s3cr3t-pin", "the SO-PIN": "not-anywhere"})
	want := []string{
		"a JWT (eyJhbGciOiJF…) is in metrics http",
		"a private key PEM (\"PRIVATE KEY\") is in Events",
		"the token PIN leaked into signer.log",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("leaks %q, want %q", got, want)
	}
}

// metricsURLPattern finds the metrics endpoints the demo prints (signer,
// approver, token service).
var metricsURLPattern = regexp.MustCompile(`metrics (http://\S+/metrics)`)

// collectDemoEmissions gathers, while the demo still runs, everything it
// emitted besides its own output, by where it is: each component's log,
// each metrics endpoint's scrape, every Event in every namespace, and the
// CertificateSigningRequests, PodCertificateRequests and Authorities with
// their status messages and conditions.
func collectDemoEmissions(ctx context.Context, r demo.Running, output string) (map[string]string, error) {
	sources := map[string]string{}
	var logs []string
	for _, d := range []string{r.Dir, r.ControlPlaneDir} {
		m, err := filepath.Glob(filepath.Join(d, "*.log"))
		if err != nil {
			return nil, err
		}
		logs = append(logs, m...)
	}
	for _, l := range logs {
		b, err := os.ReadFile(l)
		if err != nil {
			return nil, err
		}
		sources["log "+filepath.Base(l)] = string(b)
	}
	for _, m := range metricsURLPattern.FindAllStringSubmatch(output, -1) {
		body, err := scrape(ctx, m[1])
		if err != nil {
			return nil, err
		}
		sources["metrics "+m[1]] = body
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", filepath.Join(r.Dir, "admin.kubeconfig"))
	if err != nil {
		return nil, err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	lists := map[string]func() (any, error){
		"Events (all namespaces)": func() (any, error) { return kube.CoreV1().Events("").List(ctx, metav1.ListOptions{}) },
		"CertificateSigningRequests": func() (any, error) {
			return kube.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		},
		"PodCertificateRequests (all namespaces)": func() (any, error) {
			return kube.CertificatesV1().PodCertificateRequests("").List(ctx, metav1.ListOptions{})
		},
		"Authorities": func() (any, error) {
			return dyn.Resource(schema.GroupVersionResource{Group: "keyward.dev", Version: "v1alpha1", Resource: "authorities"}).List(ctx, metav1.ListOptions{})
		},
	}
	for where, list := range lists {
		obj, err := list()
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", where, err)
		}
		b, err := json.MarshalIndent(obj, "", " ")
		if err != nil {
			return nil, err
		}
		sources[where] = string(b)
	}
	return sources, nil
}

func scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("scraping %s: status %d, %v", url, resp.StatusCode, err)
	}
	return string(b), nil
}

// checkDemoSecrets fails t naming each secret the demo let out, after
// checking the collection saw what it should: the four keyward logs and
// the control plane's, three metrics endpoints, Events, the tokens the
// demo obtained.
func checkDemoSecrets(t *testing.T, r demo.Running, sources map[string]string, output string) {
	t.Helper()
	for _, want := range []string{"log signer.log", "log approver.log", "log token-service.log", "log registry.log",
		"log kube-apiserver.log", "log etcd.log", "Events (all namespaces)", "CertificateSigningRequests", "Authorities"} {
		if strings.TrimSpace(sources[want]) == "" {
			t.Errorf("the secret scan collected nothing from %s", want)
		}
	}
	var scraped []string
	for where, text := range sources {
		if strings.HasPrefix(where, "metrics ") {
			scraped = append(scraped, where)
			if !strings.Contains(text, "keyward_") {
				t.Errorf("%s has no keyward_ metric", where)
			}
		}
	}
	if len(scraped) != 3 {
		t.Errorf("scraped %q, want the signer's, the approver's and the token service's metrics", scraped)
	}
	secrets := r.Secrets.All()
	if secrets == nil {
		secrets = map[string]string{}
	}
	if len(secrets) < 6 {
		t.Errorf("the demo recorded %d credentials, want its two service-account tokens, the plugin's password and three registry tokens", len(secrets))
	}
	secrets["the token's user PIN"] = r.Token.PIN()
	secrets["the token's SO-PIN"] = r.Token.SOPIN()
	if r.Token.PIN() == "" || r.Token.SOPIN() == "" {
		t.Error("the demo's token has no PIN or SO-PIN to look for")
	}
	sources["demo output"] = output
	for _, l := range demoLeaks(sources, secrets) {
		t.Error(l)
	}
}
