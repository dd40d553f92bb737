package testregistry_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// stubTokenService is a registry token endpoint over HTTPS that knows two
// users: "keyward"/"secret" may pull testregistry.Repository, "nobody"/
// "secret" may pull nothing (its scopes are dropped, as the protocol asks).
// It records how each request came (POST form or GET with Basic).
type stubTokenService struct {
	key    crypto.Signer
	reg    *testregistry.Registry
	srv    *httptest.Server
	noPOST bool          // answer POST with 400 unsupported_grant_type
	expiry time.Duration // token lifetime; negative: already expired

	mu       sync.Mutex
	requests []string // "POST grant_type=password" or "GET basic"
}

func newStubTokenService(t *testing.T, key crypto.Signer) *stubTokenService {
	s := &stubTokenService{key: key, expiry: 5 * time.Minute}
	s.srv = httptest.NewTLSServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *stubTokenService) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(s.srv.Certificate())
	return p
}

func (s *stubTokenService) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.requests...)
}

func (s *stubTokenService) serve(w http.ResponseWriter, r *http.Request) {
	var user, password, service string
	var scopes []string
	switch r.Method {
	case http.MethodPost:
		if err := r.ParseForm(); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		s.record("POST grant_type=" + r.PostForm.Get("grant_type"))
		if s.noPOST || r.PostForm.Get("grant_type") != "password" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = w.Write([]byte(`{"error":"unsupported_grant_type"}`))
			return
		}
		user, password, service = r.PostForm.Get("username"), r.PostForm.Get("password"), r.PostForm.Get("service")
		scopes = strings.Fields(r.PostForm.Get("scope"))
	case http.MethodGet:
		var ok bool
		user, password, ok = r.BasicAuth()
		if ok {
			s.record("GET basic")
		} else {
			s.record("GET anonymous")
		}
		service = r.URL.Query().Get("service")
		scopes = r.URL.Query()["scope"]
	}
	if password != "secret" || (user != "keyward" && user != "nobody") {
		w.Header().Set("WWW-Authenticate", `Basic realm="keyward"`)
		http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"no valid credential"}]}`, http.StatusUnauthorized)
		return
	}
	var access []registrytoken.Access
	for _, sc := range scopes {
		if user == "keyward" && sc == "repository:"+testregistry.Repository+":pull" {
			access = append(access, registrytoken.Access{Type: "repository", Name: testregistry.Repository, Actions: []string{"pull"}})
		}
	}
	now := time.Now()
	tok := registrytoken.Token{
		Issuer: s.reg.Issuer, Audience: service, Subject: user, Access: access,
		NotBefore: now, Expiry: now.Add(s.expiry),
	}
	if s.expiry < 0 {
		tok.NotBefore = now.Add(2 * s.expiry)
	}
	jwt, err := registrytoken.Mint(r.Context(), s.key, tok)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"token": jwt, "access_token": jwt, "expires_in": 60, "issued_at": now.Format(time.RFC3339)})
}

func (s *stubTokenService) record(what string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requests = append(s.requests, what)
}

// TestPullDoesContainerdsTokenDance: testregistry.Pull, containerd's own
// resolver and authorizer, gets a token from the realm the registry's
// challenge names (POST password grant, falling back to GET with Basic)
// and pulls; refusals say who refused.
func TestPullDoesContainerdsTokenDance(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	stub := newStubTokenService(t, key)
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{selfSign(t, key)}, Realm: stub.srv.URL + "/token"})
	stub.reg = reg

	for _, tc := range []struct {
		name               string
		user, password     string
		repo               string
		noPOST             bool
		expiry             time.Duration
		wantErr            error
		wantFirst, wantAll []string
	}{
		{name: "a pull with the right credentials gets a token by POST and pulls",
			user: "keyward", password: "secret", wantFirst: []string{"POST grant_type=password"}},
		{name: "a realm refusing the POST is asked again by GET with Basic",
			user: "keyward", password: "secret", noPOST: true,
			wantFirst: []string{"POST grant_type=password", "GET basic"}},
		{name: "a wrong password is refused by the token endpoint",
			user: "keyward", password: "guess", wantErr: testregistry.ErrTokenRefused,
			wantFirst: []string{"POST grant_type=password", "GET basic"}},
		{name: "an anonymous pull is refused by the token endpoint",
			wantErr: testregistry.ErrTokenRefused, wantFirst: []string{"GET anonymous"}},
		{name: "a token whose scope was dropped is refused by the registry",
			user: "nobody", password: "secret", wantErr: testregistry.ErrRegistryRefused},
		{name: "a repository the token does not grant is refused by the registry",
			user: "keyward", password: "secret", repo: "keyward/other", wantErr: testregistry.ErrRegistryRefused},
		{name: "an expired token is refused by the registry",
			user: "keyward", password: "secret", expiry: -5 * time.Minute, wantErr: testregistry.ErrRegistryRefused},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stub.mu.Lock()
			stub.requests, stub.noPOST, stub.expiry = nil, tc.noPOST, tc.expiry
			if stub.expiry == 0 {
				stub.expiry = 5 * time.Minute
			}
			stub.mu.Unlock()
			repo := tc.repo
			if repo == "" {
				repo = testregistry.Repository
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			dgst, err := testregistry.Pull(ctx, reg.Host, repo, testregistry.Tag, tc.user, tc.password, stub.pool())
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Pull: %v, want %v", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Pull: %v", err)
			} else if dgst != reg.ManifestDigest {
				t.Fatalf("pulled digest %s, pushed %s", dgst, reg.ManifestDigest)
			}
			if got := stub.seen(); len(tc.wantFirst) > 0 && (len(got) < len(tc.wantFirst) || strings.Join(got[:len(tc.wantFirst)], ", ") != strings.Join(tc.wantFirst, ", ")) {
				t.Errorf("token requests %q, want them to start with %q", got, tc.wantFirst)
			}
		})
	}
}

// TestARestartedRegistryTrustsOnlyItsNewBundle: Restart keeps the address
// and the image but reads the root bundle again, so a key dropped from the
// bundle is refused and a key added is trusted.
func TestARestartedRegistryTrustsOnlyItsNewBundle(t *testing.T) {
	oldKey, newKey := fileKey(t, backends.ECDSAP256SHA256), fileKey(t, backends.ECDSAP256SHA256)
	oldCert, newCert := selfSign(t, oldKey), selfSign(t, newKey)
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{oldCert}})
	url, digest := reg.URL, reg.ManifestDigest
	if code, _ := status(t, reg, testregistry.Repository, mint(t, newKey, reg, nil)); code != http.StatusUnauthorized {
		t.Fatalf("a key not yet in the bundle: status %d, want 401", code)
	}

	reg.Restart(t, testregistry.Options{RootCerts: []*x509.Certificate{newCert}})
	if reg.URL != url || reg.ManifestDigest != digest {
		t.Fatalf("after Restart the registry is at %s with %s, was at %s with %s", reg.URL, reg.ManifestDigest, url, digest)
	}
	if code, _ := status(t, reg, testregistry.Repository, mint(t, oldKey, reg, nil)); code != http.StatusUnauthorized {
		t.Errorf("a key dropped from the bundle: status %d, want 401", code)
	}
	if code, challenge := status(t, reg, testregistry.Repository, mint(t, newKey, reg, nil)); code != http.StatusOK {
		t.Errorf("a key added to the bundle: status %d, want 200 (%s)", code, challenge)
	}
}
