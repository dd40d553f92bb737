package demo

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testca"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// The registry client of the demo checks, against the real registry binary,
// the trust files `keyward trust bundle` renders.

// `keyward trust bundle` renders (registrytoken.RenderTrust) what a registry's auth.token needs: the
// real registry binary, given the PEM as rootcertbundle, accepts x5c tokens
// of the bundle's key, and given the JWKS as jwks, accepts kid tokens of
// it; a key outside the bundle is refused either way.
func TestTrustBundleRendersWhatTheRegistryTrusts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the registry")
	}
	bin := testregistry.BuildBinary(t)
	trusted, _ := testca.New(t)
	stranger, _ := testca.New(t)
	for _, tc := range []struct {
		format, trustKey string
		// header names the key as the token service does for this format.
		header func(a *authority.Authority) (chain []*x509.Certificate, kid string)
	}{
		{"pem", "rootcertbundle", func(a *authority.Authority) ([]*x509.Certificate, string) {
			return []*x509.Certificate{a.Certificate()}, ""
		}},
		{"jwks", "jwks", func(a *authority.Authority) ([]*x509.Certificate, string) {
			kid, err := registrytoken.Thumbprint(a.Certificate().PublicKey)
			if err != nil {
				t.Fatal(err)
			}
			return nil, kid
		}},
	} {
		t.Run(tc.format, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			dir := t.TempDir()
			// The bundle holds the trusted root twice (canary and live
			// bundles merged): rendered once.
			out, err := registrytoken.RenderTrust([]*x509.Certificate{trusted.Certificate(), trusted.Certificate()}, tc.format)
			if err != nil {
				t.Fatal(err)
			}
			if tc.format == "jwks" {
				var set struct {
					Keys []json.RawMessage `json:"keys"`
				}
				if err := json.Unmarshal(out, &set); err != nil || len(set.Keys) != 1 {
					t.Fatalf("JWKS %s: %d keys, %v; want one", out, len(set.Keys), err)
				}
			}
			trustFile := filepath.Join(dir, "trust."+tc.format)
			if err := os.WriteFile(trustFile, out, 0o644); err != nil {
				t.Fatal(err)
			}
			// A realm signing with whichever CA the user name says.
			realm := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				user, _, _ := r.BasicAuth()
				key := trusted
				if user == "stranger" {
					key = stranger
				}
				chain, kid := tc.header(key)
				parts := strings.Split(r.URL.Query().Get("scope"), ":")
				now := time.Now()
				tok, err := registrytoken.Mint(r.Context(), key.Signer(), registrytoken.Token{
					Issuer: "test-issuer", Audience: r.URL.Query().Get("service"), Subject: user,
					Access:    []registrytoken.Access{{Type: parts[0], Name: parts[1], Actions: strings.Split(parts[2], ",")}},
					NotBefore: now, Expiry: now.Add(time.Minute), Chain: chain, KeyID: kid,
				})
				if err != nil {
					http.Error(w, err.Error(), 500)
					return
				}
				_ = json.NewEncoder(w).Encode(map[string]any{"token": tok})
			}))
			defer realm.Close()
			addr, err := freeLoopbackAddr()
			if err != nil {
				t.Fatal(err)
			}
			reg, err := startRegistryTrusting(ctx, bin, dir, addr, realm.URL+"/token", "registry.test", "test-issuer", tc.trustKey, trustFile, "ES256")
			if err != nil {
				t.Fatal(err)
			}
			defer reg.stop()
			c := newRegistryClient(reg.host, realm.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)
			ch := challenge{realm: realm.URL + "/token", service: "registry.test"}
			push, _, err := c.fetchToken(ctx, ch, "repository:team/app:pull,push", "ci", "x")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.pushDemoImage(ctx, "team/app", "v1", push); err != nil {
				t.Fatalf("push with a token of the bundle's key: %v", err)
			}
			foreign, _, err := c.fetchToken(ctx, ch, "repository:team/app:pull", "stranger", "x")
			if err != nil {
				t.Fatal(err)
			}
			if st, err := c.getManifest(ctx, "team/app", "v1", foreign); err != nil || st.status != http.StatusUnauthorized {
				t.Fatalf("pull with a token of a key outside the bundle: %+v, %v; want 401", st, err)
			}
		})
	}
}
