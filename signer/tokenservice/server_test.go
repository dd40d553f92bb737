package tokenservice

import (
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
	"github.com/keyward/keyward/testsupport/testca"
	"github.com/keyward/keyward/testsupport/testregistry"
)

const (
	testService = "registry.keyward.test"
	testHost    = "registry.keyward.test:5000"
	testIssuer  = "keyward-test"
)

// fakeReviewer answers from a table of tokens.
type fakeReviewer struct {
	reviews map[string]*Review
	err     error // answered for every token not in reviews (default: refused)
	calls   atomic.Int32
	mu      sync.Mutex
	last    ReviewRequest
}

func (f *fakeReviewer) Review(_ context.Context, token string, req ReviewRequest) (*Review, error) {
	f.calls.Add(1)
	f.mu.Lock()
	f.last = req
	f.mu.Unlock()
	if rv, ok := f.reviews[token]; ok {
		return rv, nil
	}
	if f.err != nil {
		return nil, f.err
	}
	return nil, &RefusedError{Reason: ReasonNotAuthenticated, Message: "the apiserver did not authenticate it: invalid bearer token"}
}

// reserveIssuer is an issuer.Issuer whose Reserve fails when err is set.
type reserveIssuer struct {
	issuer.Static
	err      error
	reserved atomic.Pointer[time.Time]
}

func (r *reserveIssuer) Reserve(_ context.Context, _ string, notAfter time.Time) error {
	if r.err != nil {
		return r.err
	}
	r.reserved.Store(&notAfter)
	return nil
}

type fixture struct {
	srv      *Server
	handler  http.Handler
	reviewer *fakeReviewer
	issuer   *reserveIssuer
	ca       *testca.CountingSigner
	clock    *clocktesting.FakeClock
	metrics  *Metrics
	cfg      *config.TokenServiceConfiguration
}

// Service-account tokens the fake reviewer knows.
const (
	pullerToken   = "puller-token"
	outsiderToken = "outsider-token"
	expiringToken = "expiring-token"
)

func newFixture(t *testing.T, edit func(*config.TokenServiceConfiguration)) *fixture {
	t.Helper()
	auth, counting := testca.New(t)
	cfg := &config.TokenServiceConfiguration{
		SignerName: "keyward.dev/registry-tokens", Issuer: testIssuer, Audience: "keyward.dev/registry",
		TokenLifetime: metav1.Duration{Duration: 5 * time.Minute}, KeyIdentifier: config.KeyIdentifierX5C,
		Registries: []config.Registry{{Service: testService, Hosts: []string{testHost}}},
		Rules: []config.Rule{{Namespaces: []string{"team-a"}, ServiceAccounts: []string{"puller"},
			Repositories: []string{"keyward/*"}, Actions: []string{config.ActionPull}}},
	}
	if edit != nil {
		edit(cfg)
	}
	pol, err := policy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now().Truncate(time.Second))
	rev := &fakeReviewer{reviews: map[string]*Review{
		pullerToken: {Identity: policy.Identity{Namespace: "team-a", ServiceAccount: "puller", PodName: "app", PodUID: "uid-1", NodeName: "node-1"},
			Expiry: clk.Now().Add(time.Hour)},
		outsiderToken: {Identity: policy.Identity{Namespace: "team-b", ServiceAccount: "default", PodName: "x", PodUID: "uid-2"},
			Expiry: clk.Now().Add(time.Hour)},
		expiringToken: {Identity: policy.Identity{Namespace: "team-a", ServiceAccount: "puller", PodName: "app", PodUID: "uid-1"},
			Expiry: clk.Now().Add(2 * time.Minute)},
	}}
	iss := &reserveIssuer{Static: issuer.Static{Authority: auth, Generation: "g1"}}
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	srv, err := NewServer(ServerOptions{Config: cfg, Policy: pol, Reviewer: rev, Issuer: iss, Metrics: m, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{srv: srv, handler: srv.Handler(), reviewer: rev, issuer: iss, ca: counting, clock: clk, metrics: m, cfg: cfg}
}

func basic(token string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte("keyward:"+token))
}

func tokenGET(service string, scopes []string, authorization string) *http.Request {
	q := url.Values{}
	if service != "" {
		q.Set("service", service)
	}
	for _, s := range scopes {
		q.Add("scope", s)
	}
	r := httptest.NewRequest(http.MethodGet, "https://token.keyward.test/token?"+q.Encode(), nil)
	if authorization != "" {
		r.Header.Set("Authorization", authorization)
	}
	return r
}

func tokenPOST(form url.Values) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "https://token.keyward.test/token", strings.NewReader(form.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return r
}

func (f *fixture) do(r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

type tokenAnswer struct {
	Token       string `json:"token"`
	AccessToken string `json:"access_token"`
	ExpiresIn   int64  `json:"expires_in"`
	IssuedAt    string `json:"issued_at"`
}

type jwtClaims struct {
	Iss    string                 `json:"iss"`
	Sub    string                 `json:"sub"`
	Aud    string                 `json:"aud"`
	Exp    int64                  `json:"exp"`
	Jti    string                 `json:"jti"`
	Access []registrytoken.Access `json:"access"`
}

type jwtHeader struct {
	Alg string   `json:"alg"`
	Kid string   `json:"kid"`
	X5c []string `json:"x5c"`
}

func decodeJWT(t *testing.T, raw string) (jwtHeader, jwtClaims) {
	t.Helper()
	parts := strings.Split(raw, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q is not a compact JWS", raw)
	}
	var h jwtHeader
	var c jwtClaims
	for i, v := range []any{&h, &c} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	return h, c
}

func granted(t *testing.T, w *httptest.ResponseRecorder) (string, jwtHeader, jwtClaims) {
	t.Helper()
	if w.Code != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", w.Code, w.Body)
	}
	var a tokenAnswer
	if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
		t.Fatalf("decoding %s: %v", w.Body, err)
	}
	if a.Token == "" || a.Token != a.AccessToken {
		t.Fatalf("token %q and access_token %q must be the same JWT", a.Token, a.AccessToken)
	}
	if _, err := time.Parse(time.RFC3339, a.IssuedAt); err != nil {
		t.Errorf("issued_at %q: %v", a.IssuedAt, err)
	}
	h, c := decodeJWT(t, a.Token)
	if a.ExpiresIn <= 0 || a.ExpiresIn > 300 {
		t.Errorf("expires_in %d, want within the 5m lifetime", a.ExpiresIn)
	}
	return a.Token, h, c
}

// pull tries testregistry's image with tok; it returns the status code.
func pull(t *testing.T, reg *testregistry.Registry, tok string) int {
	t.Helper()
	resp := reg.GetManifest(t, testregistry.Repository, tok)
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

func registryFor(t *testing.T, f *fixture) *testregistry.Registry {
	t.Helper()
	auth, _, err := f.issuer.Current()
	if err != nil {
		t.Fatal(err)
	}
	return testregistry.Start(t, testregistry.Options{Issuer: testIssuer, Service: testService, RootCerts: auth.Chain(),
		SigningAlgorithms: []string{"ES256"}})
}

func TestTokenEndpointGrants(t *testing.T) {
	pullAndPush := []string{"repository:" + testregistry.Repository + ":pull,push", "repository:other/app:pull"}
	cases := []struct {
		name        string
		keyID       string
		request     func() *http.Request
		wantAccess  []registrytoken.Access
		wantPull    int
		wantExpires time.Duration
	}{
		{
			name: "a GET with Basic auth gets pull on the allowed repository and nothing else",
			request: func() *http.Request {
				return tokenGET(testService, pullAndPush, basic(pullerToken))
			},
			wantAccess: []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
			wantPull:   http.StatusOK, wantExpires: 5 * time.Minute,
		},
		{
			name: "a GET with a Bearer service-account token is granted as with Basic auth",
			request: func() *http.Request {
				return tokenGET(testService, []string{"repository:" + testregistry.Repository + ":pull"}, "Bearer "+pullerToken)
			},
			wantAccess: []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
			wantPull:   http.StatusOK, wantExpires: 5 * time.Minute,
		},
		{
			name: "containerd's POST form with space-separated scopes is granted",
			request: func() *http.Request {
				return tokenPOST(url.Values{"grant_type": {"password"}, "username": {"keyward"}, "password": {pullerToken},
					"service": {testService}, "client_id": {"containerd-client"}, "scope": {strings.Join(pullAndPush, " ")}})
			},
			wantAccess: []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
			wantPull:   http.StatusOK, wantExpires: 5 * time.Minute,
		},
		{
			name:  "a kid token is granted and the registry finds its key",
			keyID: config.KeyIdentifierKID,
			request: func() *http.Request {
				return tokenGET(testService, pullAndPush, basic(pullerToken))
			},
			wantAccess: []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
			wantPull:   http.StatusOK, wantExpires: 5 * time.Minute,
		},
		{
			name: "a service account no rule matches gets a token with no access, which the registry refuses",
			request: func() *http.Request {
				return tokenGET(testService, pullAndPush, basic(outsiderToken))
			},
			wantAccess: nil, wantPull: http.StatusUnauthorized, wantExpires: 5 * time.Minute,
		},
		{
			name: "a scope that does not parse is dropped and the rest granted",
			request: func() *http.Request {
				return tokenGET(testService, []string{"garbage", "repository::pull", "repository:" + testregistry.Repository + ":pull"}, basic(pullerToken))
			},
			wantAccess: []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
			wantPull:   http.StatusOK, wantExpires: 5 * time.Minute,
		},
		{
			name: "a token never outlives the service-account token it was minted for",
			request: func() *http.Request {
				return tokenGET(testService, pullAndPush, basic(expiringToken))
			},
			wantAccess: []registrytoken.Access{{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}}},
			wantPull:   http.StatusOK, wantExpires: 2 * time.Minute,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, func(cfg *config.TokenServiceConfiguration) {
				if c.keyID != "" {
					cfg.KeyIdentifier = c.keyID
				}
			})
			reg := registryFor(t, f)
			r := c.request()
			raw, h, claims := granted(t, f.do(r))
			if claims.Iss != testIssuer || claims.Aud != testService || claims.Jti == "" {
				t.Errorf("iss %q aud %q jti %q", claims.Iss, claims.Aud, claims.Jti)
			}
			tok := pullerToken
			if strings.Contains(r.Header.Get("Authorization"), base64.StdEncoding.EncodeToString([]byte("keyward:"+outsiderToken))) {
				tok = outsiderToken
			}
			id := f.reviewer.reviews[tok].Identity
			if want := "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount; claims.Sub != want {
				t.Errorf("sub %q, want %q", claims.Sub, want)
			}
			if want := f.clock.Now().Add(c.wantExpires).Unix(); claims.Exp != want {
				t.Errorf("exp %d, want %d", claims.Exp, want)
			}
			if got := f.issuer.reserved.Load(); got == nil || got.Unix() < claims.Exp {
				t.Errorf("reserved up to %v, before the token's exp %d", got, claims.Exp)
			}
			if !slices.EqualFunc(claims.Access, c.wantAccess, func(a, b registrytoken.Access) bool {
				return a.Type == b.Type && a.Name == b.Name && slices.Equal(a.Actions, b.Actions)
			}) {
				t.Errorf("access %+v, want %+v", claims.Access, c.wantAccess)
			}
			switch c.keyID {
			case config.KeyIdentifierKID:
				if h.Kid == "" || len(h.X5c) > 0 {
					t.Errorf("header %+v: want a kid and no x5c", h)
				}
			default:
				if len(h.X5c) == 0 {
					t.Errorf("header %+v: want x5c", h)
				}
			}
			if got := pull(t, reg, raw); got != c.wantPull {
				t.Errorf("pull with the minted token: %d, want %d", got, c.wantPull)
			}
		})
	}
}

type errorsBody struct {
	Errors []struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"errors"`
}

type oauthBody struct {
	Error       string `json:"error"`
	Description string `json:"error_description"`
}

var errReserve = fmt.Errorf("%w: cannot record lastIssuedNotAfter: apiserver unreachable", issuer.ErrUnavailable)

func TestTokenEndpointRefusals(t *testing.T) {
	scope := []string{"repository:" + testregistry.Repository + ":pull"}
	cases := []struct {
		name       string
		setup      func(*fixture)
		request    func() *http.Request
		wantStatus int
		wantCode   string // errors[0].code, or the OAuth error for POSTs
		wantInMsg  string
		wantBasic  bool
	}{
		{name: "an unknown service is a bad request naming the services served",
			request:    func() *http.Request { return tokenGET("other.example", scope, basic(pullerToken)) },
			wantStatus: http.StatusBadRequest, wantCode: "UNSUPPORTED", wantInMsg: testService},
		{name: "a request without service is a bad request",
			request:    func() *http.Request { return tokenGET("", scope, basic(pullerToken)) },
			wantStatus: http.StatusBadRequest, wantCode: "UNSUPPORTED", wantInMsg: "service"},
		{name: "a request without credential is challenged for Basic auth",
			request:    func() *http.Request { return tokenGET(testService, scope, "") },
			wantStatus: http.StatusUnauthorized, wantCode: "UNAUTHORIZED", wantBasic: true},
		{name: "a garbage credential is challenged for Basic auth and says why",
			request:    func() *http.Request { return tokenGET(testService, scope, basic("garbage")) },
			wantStatus: http.StatusUnauthorized, wantCode: "UNAUTHORIZED", wantInMsg: "invalid bearer token", wantBasic: true},
		{name: "an Authorization header of another scheme counts as no credential",
			request:    func() *http.Request { return tokenGET(testService, scope, "Digest abc") },
			wantStatus: http.StatusUnauthorized, wantCode: "UNAUTHORIZED", wantBasic: true},
		{name: "a POST with grant_type refresh_token is answered unsupported_grant_type",
			request: func() *http.Request {
				return tokenPOST(url.Values{"grant_type": {"refresh_token"}, "refresh_token": {"x"}, "service": {testService}})
			},
			wantStatus: http.StatusBadRequest, wantCode: "unsupported_grant_type"},
		{name: "a POST without password is challenged",
			request: func() *http.Request {
				return tokenPOST(url.Values{"grant_type": {"password"}, "username": {"keyward"}, "service": {testService}})
			},
			wantStatus: http.StatusUnauthorized, wantCode: "invalid_grant", wantBasic: true},
		{name: "a POST that is not a form is a bad request",
			request: func() *http.Request {
				r := httptest.NewRequest(http.MethodPost, "/token", strings.NewReader(`{"grant_type":"password"}`))
				r.Header.Set("Content-Type", "application/json")
				return r
			},
			wantStatus: http.StatusBadRequest, wantCode: "invalid_request"},
		{name: "a POST body over 64 KiB is refused unread",
			request: func() *http.Request {
				return tokenPOST(url.Values{"grant_type": {"password"}, "password": {strings.Repeat("a", MaxBodyBytes)}, "service": {testService}})
			},
			wantStatus: http.StatusRequestEntityTooLarge, wantCode: "invalid_request"},
		{name: "an Authorization header of 30 KiB is a bad request saying how long it may be",
			request:    func() *http.Request { return tokenGET(testService, scope, "Bearer "+strings.Repeat("a", 30<<10)) },
			wantStatus: http.StatusBadRequest, wantCode: "UNAUTHORIZED", wantInMsg: "Authorization header"},
		{name: "a PUT is not allowed",
			request:    func() *http.Request { return httptest.NewRequest(http.MethodPut, "/token", nil) },
			wantStatus: http.StatusMethodNotAllowed, wantCode: "UNSUPPORTED"},
		{name: "an apiserver that cannot be asked is unavailable, not unauthorized",
			setup: func(f *fixture) {
				f.reviewer.err = fmt.Errorf("%w: creating a TokenReview: connection refused", ErrUnavailable)
			},
			request:    func() *http.Request { return tokenGET(testService, scope, basic("unknown")) },
			wantStatus: http.StatusServiceUnavailable, wantCode: "UNAVAILABLE", wantInMsg: "connection refused"},
		{name: "a reservation that cannot be recorded is unavailable and nothing is signed",
			setup:      func(f *fixture) { f.issuer.err = errReserve },
			request:    func() *http.Request { return tokenGET(testService, scope, basic(pullerToken)) },
			wantStatus: http.StatusServiceUnavailable, wantCode: "UNAVAILABLE", wantInMsg: "lastIssuedNotAfter"},
		{name: "no Active generation is unavailable",
			setup:      func(f *fixture) { f.issuer.Authority = nil },
			request:    func() *http.Request { return tokenGET(testService, scope, basic(pullerToken)) },
			wantStatus: http.StatusServiceUnavailable, wantCode: "UNAVAILABLE"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			if c.setup != nil {
				c.setup(f)
			}
			r := c.request()
			w := f.do(r)
			if w.Code != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, c.wantStatus, w.Body)
			}
			var code, msg string
			if r.Method == http.MethodPost && r.URL.Path == "/token" {
				var b oauthBody
				if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
					t.Fatalf("body %s: %v", w.Body, err)
				}
				code, msg = b.Error, b.Description
			} else {
				var b errorsBody
				if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil || len(b.Errors) != 1 {
					t.Fatalf("body %s: %v", w.Body, err)
				}
				code, msg = b.Errors[0].Code, b.Errors[0].Message
			}
			if code != c.wantCode || !strings.Contains(msg, c.wantInMsg) {
				t.Errorf("code %q message %q, want %q containing %q", code, msg, c.wantCode, c.wantInMsg)
			}
			if got := w.Header().Get("WWW-Authenticate"); c.wantBasic != (got == `Basic realm="keyward"`) {
				t.Errorf("WWW-Authenticate %q (want Basic challenge: %v)", got, c.wantBasic)
			}
			if n := f.ca.Signatures(); n != 0 {
				t.Errorf("the key made %d signatures for a refused request", n)
			}
			if got := value(t, f.metrics.Requests.WithLabelValues(endpointToken, fmt.Sprint(c.wantStatus))); got != 1 {
				t.Errorf("keyward_token_requests_total{endpoint=token,code=%d} = %v, want 1", c.wantStatus, got)
			}
		})
	}
}

type credentialBody struct {
	Registry  string `json:"registry"`
	Service   string `json:"service"`
	Username  string `json:"username"`
	ExpiresAt string `json:"expiresAt"`
	Error     string `json:"error"`
	Message   string `json:"message"`
}

func credentialPOST(body, authorization string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/credential", strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if authorization != "" {
		r.Header.Set("Authorization", authorization)
	}
	return r
}

func TestCredentialEndpoint(t *testing.T) {
	image := func(ref string) string { return fmt.Sprintf(`{"image":%q}`, ref) }
	cases := []struct {
		name       string
		setup      func(*fixture)
		request    *http.Request
		wantStatus int
		wantError  string
		wantInMsg  []string
	}{
		{name: "a service account the policy lets pull gets the registry's credential",
			request:    credentialPOST(image(testHost+"/"+testregistry.Repository+":v1"), "Bearer "+pullerToken),
			wantStatus: http.StatusOK},
		{name: "an image by digest is answered as by tag",
			request:    credentialPOST(image(testHost+"/"+testregistry.Repository+"@sha256:"+strings.Repeat("a", 64)), "Bearer "+pullerToken),
			wantStatus: http.StatusOK},
		{name: "an image without a registry host is a bad request naming it",
			request:    credentialPOST(image("library/alpine:3"), "Bearer "+pullerToken),
			wantStatus: http.StatusBadRequest, wantError: "bad_request", wantInMsg: []string{"library/alpine:3"}},
		{name: "a body that is not JSON is a bad request",
			request:    credentialPOST("image=x", "Bearer "+pullerToken),
			wantStatus: http.StatusBadRequest, wantError: "bad_request"},
		{name: "a request without token is unauthorized",
			request:    credentialPOST(image(testHost+"/keyward/hello"), ""),
			wantStatus: http.StatusUnauthorized, wantError: "unauthorized"},
		{name: "a refused token is unauthorized and says why",
			request:    credentialPOST(image(testHost+"/keyward/hello"), "Bearer garbage"),
			wantStatus: http.StatusUnauthorized, wantError: "unauthorized", wantInMsg: []string{"NotAuthenticated"}},
		{name: "a repository the policy does not grant is forbidden, naming who and what",
			request:    credentialPOST(image(testHost+"/other/app:1"), "Bearer "+pullerToken),
			wantStatus: http.StatusForbidden, wantError: "forbidden", wantInMsg: []string{"team-a/puller", "other/app", testService}},
		{name: "an unknown registry host is not found, listing the configured hosts",
			request:    credentialPOST(image("ghcr.io/keyward/hello:v1"), "Bearer "+pullerToken),
			wantStatus: http.StatusNotFound, wantError: "not_found", wantInMsg: []string{"ghcr.io", testHost}},
		{name: "an apiserver that cannot be asked is unavailable",
			setup:      func(f *fixture) { f.reviewer.err = fmt.Errorf("%w: timeout", ErrUnavailable) },
			request:    credentialPOST(image(testHost+"/keyward/hello"), "Bearer unknown"),
			wantStatus: http.StatusServiceUnavailable, wantError: "unavailable"},
		{name: "a GET is not allowed",
			request:    httptest.NewRequest(http.MethodGet, "/v1/credential", nil),
			wantStatus: http.StatusMethodNotAllowed, wantError: "method_not_allowed"},
		{name: "a body over 64 KiB is refused",
			request:    credentialPOST(image(testHost+"/"+strings.Repeat("a", MaxBodyBytes)), "Bearer "+pullerToken),
			wantStatus: http.StatusRequestEntityTooLarge, wantError: "bad_request"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, nil)
			if c.setup != nil {
				c.setup(f)
			}
			w := f.do(c.request)
			if w.Code != c.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, c.wantStatus, w.Body)
			}
			var b credentialBody
			if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
				t.Fatalf("body %s: %v", w.Body, err)
			}
			if c.wantStatus == http.StatusOK {
				want := f.reviewer.reviews[pullerToken].Expiry.UTC().Format(time.RFC3339)
				if b.Registry != testHost || b.Service != testService || b.Username != Username || b.ExpiresAt != want {
					t.Errorf("answer %+v, want registry %s service %s username %s expiresAt %s", b, testHost, testService, Username, want)
				}
				return
			}
			if b.Error != c.wantError {
				t.Errorf("error %q, want %q (%s)", b.Error, c.wantError, b.Message)
			}
			for _, s := range c.wantInMsg {
				if !strings.Contains(b.Message, s) {
					t.Errorf("message %q does not name %q", b.Message, s)
				}
			}
		})
	}
}

// TestSigningFailureIsUnavailable: a key backend that fails the signature
// answers 503 and counts a signing error.
func TestSigningFailureIsUnavailable(t *testing.T) {
	f := newFixture(t, nil)
	auth, _, _ := f.issuer.Current()
	broken := &failingSigner{Signer: auth.Signer()}
	a2, err := authorityWith(auth, broken)
	if err != nil {
		t.Fatal(err)
	}
	f.issuer.Authority = a2
	w := f.do(tokenGET(testService, []string{"repository:keyward/hello:pull"}, basic(pullerToken)))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503: %s", w.Code, w.Body)
	}
	if got := value(t, f.metrics.SigningErrors); got != 1 {
		t.Errorf("signing errors %v, want 1", got)
	}
}

// failingSigner is a key whose backend refuses every signature.
type failingSigner struct{ backends.Signer }

var errBackend = errors.New("HSM session closed")

func (failingSigner) SignContext(context.Context, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errBackend
}

func (failingSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, errBackend
}

func authorityWith(a *authority.Authority, key backends.Signer) (*authority.Authority, error) {
	return authority.New(a.Certificate(), a.Chain()[1:], key)
}

// value reads a counter.
func value(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 1)
	c.Collect(ch)
	close(ch)
	var m dto.Metric
	for x := range ch {
		if err := x.Write(&m); err != nil {
			t.Fatal(err)
		}
	}
	return m.GetCounter().GetValue()
}

// TestAGrantIsCounted: a 200 counts the request, its duration, and the
// scopes granted and dropped.
func TestAGrantIsCounted(t *testing.T) {
	f := newFixture(t, nil)
	granted(t, f.do(tokenGET(testService, []string{"repository:" + testregistry.Repository + ":pull,push", "repository:other/app:pull", "garbage"}, basic(pullerToken))))
	if got := value(t, f.metrics.Requests.WithLabelValues(endpointToken, "200")); got != 1 {
		t.Errorf("requests{token,200} = %v, want 1", got)
	}
	if got := value(t, f.metrics.GrantedScopes); got != 1 {
		t.Errorf("granted scopes %v, want 1", got)
	}
	// Dropped: push on keyward/hello, other/app, and the unparsed one.
	if got := value(t, f.metrics.DroppedScopes); got != 3 {
		t.Errorf("dropped scopes %v, want 3", got)
	}
	ch := make(chan prometheus.Metric, 1)
	f.metrics.IssueDuration.Collect(ch)
	var m dto.Metric
	if err := (<-ch).Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetHistogram().GetSampleCount(); n != 1 {
		t.Errorf("issue durations observed %d, want 1", n)
	}
}

// TestAnUnavailableReviewSaysSoOnce: the plugin prints the token service's
// message; "cannot validate" is said once, then why.
func TestAnUnavailableReviewSaysSoOnce(t *testing.T) {
	f := newFixture(t, nil)
	f.reviewer.err = fmt.Errorf("%w: creating a TokenReview: connection refused", ErrUnavailable)
	w := f.do(credentialPOST(fmt.Sprintf(`{"image":%q}`, testHost+"/keyward/hello"), "Bearer unknown"))
	var got credentialBody
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if w.Code != http.StatusServiceUnavailable || strings.Count(got.Message, "cannot validate") != 1 {
		t.Errorf("answered %d %q, want 503 saying \"cannot validate\" once", w.Code, got.Message)
	}
}

// TestASigningFailureIsLoggedOnceNotPerRequest: a key backend that is down
// answers every request 503; the error is logged at default verbosity when
// it starts and once when signing works again, not once per request.
func TestASigningFailureIsLoggedOnceNotPerRequest(t *testing.T) {
	f := newFixture(t, nil)
	good, _, _ := f.issuer.Current()
	broken, err := authorityWith(good, &failingSigner{Signer: good.Signer()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, logged := capturedLog(t)
	get := func() int {
		r := tokenGET(testService, []string{"repository:keyward/hello:pull"}, basic(pullerToken))
		return f.do(r.WithContext(ctx)).Code
	}
	f.issuer.Authority = broken
	for range 5 {
		if code := get(); code != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503", code)
		}
	}
	f.issuer.Authority = good
	for range 2 {
		if code := get(); code != http.StatusOK {
			t.Fatalf("status %d, want 200", code)
		}
	}
	lines := logged()
	var other []string
	for _, l := range lines {
		if !strings.Contains(l, "Registry token granted") {
			other = append(other, l)
		}
	}
	if len(other) != 2 {
		t.Errorf("logged %d lines besides the audit of grants, want the failure once and the recovery once:\n%s", len(other), strings.Join(other, "\n"))
	}
}

// TestAnApiserverOutageIsLoggedOnceNotPerRequest: reviews that cannot be
// made (the apiserver down for minutes) are answered 503 each, but logged
// at default verbosity when they start failing and once when a review
// works again (a refusal counts: the apiserver answered).
func TestAnApiserverOutageIsLoggedOnceNotPerRequest(t *testing.T) {
	f := newFixture(t, nil)
	ctx, logged := capturedLog(t)
	get := func() int {
		r := tokenGET(testService, []string{"repository:keyward/hello:pull"}, basic("unknown"))
		return f.do(r.WithContext(ctx)).Code
	}
	f.reviewer.err = fmt.Errorf("%w: creating a TokenReview: connection refused", ErrUnavailable)
	for range 5 {
		if code := get(); code != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503", code)
		}
	}
	f.reviewer.err = nil
	for range 2 {
		if code := get(); code != http.StatusUnauthorized {
			t.Fatalf("status %d, want 401 (the apiserver refuses the token)", code)
		}
	}
	var lines, refusals []string
	for _, l := range logged() {
		if strings.Contains(l, "Registry token refused") {
			refusals = append(refusals, l)
		} else {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 || !strings.Contains(lines[0], "Cannot validate service-account tokens") || !strings.Contains(lines[1], "work again") {
		t.Errorf("logged %d lines, want the outage once and the recovery once:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	// The two refusals: the first audited, the second summed.
	if len(refusals) != 1 {
		t.Errorf("logged %d refusal lines for two refusals from one client, want one:\n%s", len(refusals), strings.Join(refusals, "\n"))
	}
}

// TestNoKeyThatCanSignIsLoggedOnce: with no Active generation (e.g. no
// replica has led long enough), every request is answered 503 and the
// first is logged at default verbosity, once, then the recovery.
func TestNoKeyThatCanSignIsLoggedOnce(t *testing.T) {
	f := newFixture(t, nil)
	ctx, logged := capturedLog(t)
	get := func() int {
		r := tokenGET(testService, []string{"repository:keyward/hello:pull"}, basic(pullerToken))
		return f.do(r.WithContext(ctx)).Code
	}
	f.issuer.err = fmt.Errorf("%w: lastIssuedNotAfter not recorded", issuer.ErrUnavailable)
	for range 5 {
		if code := get(); code != http.StatusServiceUnavailable {
			t.Fatalf("status %d, want 503", code)
		}
	}
	f.issuer.err = nil
	if code := get(); code != http.StatusOK {
		t.Fatalf("status %d, want 200", code)
	}
	lines := logged()
	var other []string
	for _, l := range lines {
		if !strings.Contains(l, "Registry token granted") {
			other = append(other, l)
		}
	}
	if len(other) != 2 || !strings.Contains(other[0], "cannot be signed") || !strings.Contains(other[1], "works again") {
		t.Errorf("logged %d lines besides the audit of grants, want the failure once and the recovery once:\n%s", len(other), strings.Join(other, "\n"))
	}
}

// capturedLog returns a context whose logger records each line's key/value
// text, and a function that returns the lines recorded so far.
func capturedLog(t *testing.T) (context.Context, func() []string) {
	var mu sync.Mutex
	var lines []string
	ctx := klog.NewContext(t.Context(), funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{}))
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lines)
	}
}

// TestARegistryWithItsOwnAudienceReviewsForItAlone: the realm and the
// credential endpoint ask the reviewer for the registry's own audience
// (registries[].audience), the default one for a registry without.
func TestARegistryWithItsOwnAudienceReviewsForItAlone(t *testing.T) {
	f := newFixture(t, func(c *config.TokenServiceConfiguration) {
		c.Registries = append(c.Registries, config.Registry{Service: "cache", Hosts: []string{"cache.example.com:5000"}, Audience: "keyward.dev/cache"})
	})
	audiences := func() []string {
		f.reviewer.mu.Lock()
		defer f.reviewer.mu.Unlock()
		return f.reviewer.last.Audiences
	}
	for _, c := range []struct {
		name string
		req  *http.Request
		want string
	}{
		{"the realm, for the registry with its own audience", tokenGET("cache", []string{"repository:keyward/hello:pull"}, basic(pullerToken)), "keyward.dev/cache"},
		{"the realm, for the registry without", tokenGET(testService, []string{"repository:keyward/hello:pull"}, basic(pullerToken)), "keyward.dev/registry"},
		{"the credential endpoint, for a host of the registry with its own audience", credentialPOST(`{"image":"cache.example.com:5000/keyward/hello:v1"}`, "Bearer "+pullerToken), "keyward.dev/cache"},
		{"the credential endpoint, for a host of the registry without", credentialPOST(`{"image":"`+testHost+`/keyward/hello:v1"}`, "Bearer "+pullerToken), "keyward.dev/registry"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f.do(c.req)
			if got := audiences(); len(got) != 1 || got[0] != c.want {
				t.Errorf("reviewed for audiences %q, want [%q]", got, c.want)
			}
		})
	}
}
