package kubeclient

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
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
		{name: "v1 is preferred when both are served", status: map[string]int{"v1": 200, "v1beta1": 200}, want: "v1"},
		{name: "v1beta1 is used when v1 is not served", status: map[string]int{"v1": 404, "v1beta1": 200}, want: "v1beta1"},
		{name: "neither served is ErrNoPodCertificates", status: map[string]int{"v1": 404, "v1beta1": 404}, wantErr: ErrNoPodCertificates},
		{name: "a failing v1 discovery is an error, not a fallback to v1beta1", status: map[string]int{"v1": 503, "v1beta1": 200}, wantErr: errAny},
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

var errAny = errors.New("any error")
