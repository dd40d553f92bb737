package kubeclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// discoveryServer answers certificates.k8s.io discovery with the given HTTP
// status per version; 200 lists the PodCertificateRequest resources.
func discoveryServer(t *testing.T, status map[string]int) discovery.DiscoveryInterface {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for v, code := range status {
			if r.URL.Path != "/apis/certificates.k8s.io/"+v {
				continue
			}
			if code != http.StatusOK {
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(code)
				_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Code: int32(code)})
				return
			}
			_ = json.NewEncoder(w).Encode(metav1.APIResourceList{
				TypeMeta:     metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
				GroupVersion: "certificates.k8s.io/" + v,
				APIResources: []metav1.APIResource{{Name: "podcertificaterequests", Namespaced: true}, {Name: "podcertificaterequests/status", Namespaced: true}},
			})
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	return discovery.NewDiscoveryClientForConfigOrDie(&rest.Config{Host: srv.URL})
}

func TestPodCertificateVersion(t *testing.T) {
	cases := []struct {
		name    string
		status  map[string]int
		want    string
		wantErr error // nil: no error; errAny: some error
	}{
		{name: "v1beta1 is read through when both are served, since only it shows pkixPublicKey requests", status: map[string]int{"v1": 200, "v1beta1": 200}, want: "v1beta1"},
		{name: "v1 is used when v1beta1 is not served", status: map[string]int{"v1": 200, "v1beta1": 404}, want: "v1"},
		{name: "v1beta1 is used when v1 is not served", status: map[string]int{"v1": 404, "v1beta1": 200}, want: "v1beta1"},
		{name: "neither served is ErrNoPodCertificates", status: map[string]int{"v1": 404, "v1beta1": 404}, wantErr: ErrNoPodCertificates},
		{name: "a failing v1beta1 discovery is an error, not a fallback to v1 that would hide requests", status: map[string]int{"v1": 200, "v1beta1": 503}, wantErr: errAny},
		{name: "a failing v1 discovery is an error when v1beta1 is not served", status: map[string]int{"v1": 503, "v1beta1": 404}, wantErr: errAny},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := PodCertificateVersion(discoveryServer(t, tc.status))
			switch {
			case tc.wantErr == nil && err != nil:
				t.Fatalf("error %v", err)
			case tc.wantErr == errAny && err == nil:
				t.Fatalf("got %q, want an error", got)
			case tc.wantErr != nil && tc.wantErr != errAny && !errors.Is(err, tc.wantErr):
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("version %q, want %q", got, tc.want)
			}
		})
	}
}

// A configured version is checked alone: served, not served (404, not an
// error), or discovery failing (an error).
func TestServesPodCertificates(t *testing.T) {
	d := discoveryServer(t, map[string]int{"v1": 200, "v1beta1": 404, "v1alpha9": 503})
	for _, tc := range []struct {
		version     string
		want, isErr bool
	}{{"v1", true, false}, {"v1beta1", false, false}, {"v1alpha9", false, true}} {
		got, err := ServesPodCertificates(d, tc.version)
		if got != tc.want || (err != nil) != tc.isErr {
			t.Errorf("ServesPodCertificates(%s) = %v, %v; want %v, error %v", tc.version, got, err, tc.want, tc.isErr)
		}
	}
}

var errAny = errors.New("any error")

// kubeconfigFor writes a kubeconfig that points at url.
func kubeconfigFor(t *testing.T, url string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["c"] = &clientcmdapi.Cluster{Server: url}
	cfg.AuthInfos["u"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["x"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "u"}
	cfg.CurrentContext = "x"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// The apiserver warns on every request through a deprecated version; the
// log gets one line per distinct warning, not one per request.
func TestConfigLogsEachWarningOnce(t *testing.T) {
	const deprecated = "certificates.k8s.io/v1beta1 PodCertificateRequest is deprecated in v1.37+, unavailable in v1.40+; use certificates.k8s.io/v1 PodCertificateRequest"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Warning", `299 - "`+deprecated+`"`)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(certv1beta1.PodCertificateRequestList{})
	}))
	defer srv.Close()
	cfg, err := Config(kubeconfigFor(t, srv.URL), 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(&logged))))
	client := kubernetes.NewForConfigOrDie(cfg)
	// A second client of a copied config (e.g. one for Events) shares
	// what has been logged.
	other := kubernetes.NewForConfigOrDie(rest.CopyConfig(cfg))
	for range 50 {
		for _, c := range []kubernetes.Interface{client, other} {
			if _, err := c.CertificatesV1beta1().PodCertificateRequests("ns").List(ctx, metav1.ListOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := strings.Count(logged.String(), deprecated); n != 1 {
		t.Fatalf("the warning was logged %d times after 100 requests, want once:\n%s", n, logged.String())
	}
}

// Built-in types travel as protobuf; a server that answers JSON is still
// understood.
func TestConfigSpeaksProtobuf(t *testing.T) {
	var accept, contentType string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		accept, contentType = r.Header.Get("Accept"), r.Header.Get("Content-Type")
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(&certv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}})
	}))
	defer srv.Close()
	cfg, err := Config(kubeconfigFor(t, srv.URL), 1000, 1000)
	if err != nil {
		t.Fatal(err)
	}
	got, err := kubernetes.NewForConfigOrDie(cfg).CertificatesV1().PodCertificateRequests("ns").UpdateStatus(context.Background(),
		&certv1.PodCertificateRequest{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}}, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("a JSON answer is not understood: %v", err)
	}
	if got.Name != "p" {
		t.Fatalf("decoded %+v", got)
	}
	if !strings.HasPrefix(accept, "application/vnd.kubernetes.protobuf") || !strings.Contains(accept, "application/json") {
		t.Fatalf("Accept %q, want protobuf first and JSON accepted", accept)
	}
	if contentType != "application/vnd.kubernetes.protobuf" {
		t.Fatalf("request body sent as %q, want protobuf", contentType)
	}
}
