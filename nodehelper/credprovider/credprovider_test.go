package credprovider_test

import (
	"bytes"
	"crypto/x509"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/credprovider"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

var testNow = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

func newTestPlugin(t *testing.T, ts *tokenService, opts credprovider.Options) *credprovider.Plugin {
	t.Helper()
	opts.TokenServiceURL = ts.URL
	opts.RootCAs = x509.NewCertPool()
	opts.RootCAs.AddCert(ts.Certificate())
	opts.Now = func() time.Time { return testNow }
	p, err := credprovider.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCacheDurationEndsBeforeTheToken(t *testing.T) {
	cases := []struct {
		name      string
		tokenLeft time.Duration // JWT exp − now
		answerExp time.Duration // the token service's expiresAt − now
		max       time.Duration
		want      time.Duration
		wantErr   error
	}{
		{name: "a fresh token is cached for the maximum", tokenLeft: time.Hour, answerExp: time.Hour, want: 5 * time.Minute},
		{name: "a token with 5 minutes left is cached 30s less", tokenLeft: 5 * time.Minute, answerExp: 5 * time.Minute, max: 10 * time.Minute, want: 4*time.Minute + 30*time.Second},
		{name: "an earlier expiresAt from the token service wins", tokenLeft: time.Hour, answerExp: 2 * time.Minute, want: 90 * time.Second},
		{name: "31 seconds left leave one second", tokenLeft: 31 * time.Second, answerExp: 31 * time.Second, want: time.Second},
		{name: "30 seconds left are too few", tokenLeft: 30 * time.Second, answerExp: 30 * time.Second, wantErr: credprovider.ErrTokenExpiring},
		{name: "an expiresAt within the margin is too short", tokenLeft: time.Hour, answerExp: 20 * time.Second, wantErr: credprovider.ErrTokenExpiring},
		{name: "an expired token is refused", tokenLeft: -time.Minute, answerExp: time.Hour, wantErr: credprovider.ErrTokenExpiring},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := newTokenService(t, grant(testNow.Add(tc.answerExp)))
			p := newTestPlugin(t, ts, credprovider.Options{MaxCacheDuration: tc.max})
			token := fakeJWT(testNow.Add(tc.tokenLeft))
			resp, err := p.Provide(t.Context(), &credentialproviderv1.CredentialProviderRequest{Image: testImage, ServiceAccountToken: token})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("error %v, want %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got := resp.CacheDuration.Duration; got != tc.want {
				t.Errorf("cacheDuration %s, want %s", got, tc.want)
			}
		})
	}
}

func TestServerRefusalsKeepTheirStatus(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusUnauthorized, http.StatusForbidden, http.StatusNotFound, http.StatusServiceUnavailable} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			ts := newTokenService(t, refuse(status, "code", "why"))
			p := newTestPlugin(t, ts, credprovider.Options{})
			var out bytes.Buffer
			err := p.Run(t.Context(), bytes.NewReader(kubeletRequest(t, testImage, fakeJWT(testNow.Add(time.Hour)), nil)), &out)
			var serr *credprovider.ServerError
			if !errors.As(err, &serr) || serr.StatusCode != status || serr.Code != "code" || serr.Message != "why" {
				t.Fatalf("error %#v, want a ServerError %d code/why", err, status)
			}
			if out.Len() != 0 {
				t.Errorf("wrote %q on error", out.String())
			}
		})
	}
}

func TestReadRequestRefusesBadInput(t *testing.T) {
	token := fakeJWT(testNow.Add(time.Hour))
	cases := []struct {
		name  string
		stdin string
	}{
		{name: "not JSON", stdin: "{"},
		{name: "a JSON array", stdin: "[]"},
		{name: "no apiVersion", stdin: `{"kind":"CredentialProviderRequest","image":"a.example/b","serviceAccountToken":"` + token + `"}`},
		{name: "the v1alpha1 apiVersion", stdin: `{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1alpha1","image":"a.example/b","serviceAccountToken":"` + token + `"}`},
		{name: "no kind", stdin: `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"a.example/b","serviceAccountToken":"` + token + `"}`},
		{name: "no token", stdin: `{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"a.example/b"}`},
		{name: "more than 1 MiB", stdin: `{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"` + strings.Repeat("a", credprovider.MaxRequestBytes) + `"}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := credprovider.ReadRequest(strings.NewReader(tc.stdin)); !errors.Is(err, credprovider.ErrBadRequest) {
				t.Errorf("error %v, want ErrBadRequest", err)
			}
		})
	}
}

func TestReadRequestAcceptsWhatKubeletWrites(t *testing.T) {
	token := fakeJWT(testNow.Add(time.Hour))
	req, err := credprovider.ReadRequest(bytes.NewReader(kubeletRequest(t, testImage, token, map[string]string{"k": "v"})))
	if err != nil {
		t.Fatal(err)
	}
	if req.Image != testImage || req.ServiceAccountToken != token || req.ServiceAccountAnnotations["k"] != "v" {
		t.Errorf("read %+v", req)
	}
}

func TestNewValidatesOptions(t *testing.T) {
	cases := []struct {
		name string
		opts credprovider.Options
	}{
		{name: "no URL", opts: credprovider.Options{}},
		{name: "an http URL", opts: credprovider.Options{TokenServiceURL: "http://ts.example"}},
		{name: "a URL with a query", opts: credprovider.Options{TokenServiceURL: "https://ts.example/?a=b"}},
		{name: "a URL with credentials", opts: credprovider.Options{TokenServiceURL: "https://u:p@ts.example"}},
		{name: "a negative timeout", opts: credprovider.Options{TokenServiceURL: "https://ts.example", Timeout: -time.Second}},
		{name: "the Global cache key type", opts: credprovider.Options{TokenServiceURL: "https://ts.example", CacheKeyType: "Global"}},
		{name: "a sub-second max cache duration", opts: credprovider.Options{TokenServiceURL: "https://ts.example", MaxCacheDuration: time.Millisecond}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := credprovider.New(tc.opts); err == nil {
				t.Error("New accepted the options")
			}
		})
	}
}

// TestKubeletRequestWireFormat pins what kubelet v1.37 writes on the
// plugin's stdin (its JSON serializer: kind, apiVersion, then the fields;
// serviceAccountToken only with tokenAttributes; a trailing newline), and
// that the plugin reads it.
func TestKubeletRequestWireFormat(t *testing.T) {
	token := fakeJWT(testNow.Add(time.Hour))
	got := string(kubeletRequest(t, "a.example/b", token, map[string]string{"k": "v"}))
	want := `{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1",` +
		`"image":"a.example/b","serviceAccountToken":"` + token + `","serviceAccountAnnotations":{"k":"v"}}` + "\n"
	if got != want {
		t.Fatalf("kubelet writes\n%s\nwant\n%s", got, want)
	}
	if _, err := credprovider.ReadRequest(strings.NewReader(want)); err != nil {
		t.Error(err)
	}
	noToken := string(kubeletRequest(t, "a.example/b", "", nil))
	if want := `{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"a.example/b"}` + "\n"; noToken != want {
		t.Errorf("without tokenAttributes kubelet writes\n%s\nwant\n%s", noToken, want)
	}
}

// containerd's CRI (internal/cri/server/images/image_pull.go ParseAuth, v2.4.2)
// ignores the password of an auth entry whose username is empty, so such an
// answer would make kubelet cache a credential that pulls anonymously.
func TestAnswerWithoutUsernameIsRefused(t *testing.T) {
	ts := newTokenService(t, func(w http.ResponseWriter, _ *http.Request, image string) {
		host, _, _ := strings.Cut(image, "/")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"registry":"` + host + `","service":"registry.example","username":""}`))
	})
	p := newTestPlugin(t, ts, credprovider.Options{})
	var out bytes.Buffer
	err := p.Run(t.Context(), bytes.NewReader(kubeletRequest(t, testImage, fakeJWT(testNow.Add(time.Hour)), nil)), &out)
	if !errors.Is(err, credprovider.ErrBadAnswer) {
		t.Fatalf("error %v, want ErrBadAnswer", err)
	}
	if out.Len() != 0 {
		t.Errorf("wrote %q on error", out.String())
	}
}
