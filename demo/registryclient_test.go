package demo

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testca"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// The demo's step-by-step registry client works against the real registry
// binary: anonymous pull refused with a Bearer challenge naming the realm,
// push and pull with tokens from the realm, a token without the scope
// refused.
func TestTheDemoRegistryClientTalksToTheRealRegistry(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and starts the registry")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ca, _ := testca.New(t)
	dir := t.TempDir()
	roots := filepath.Join(dir, "roots.pem")
	if err := os.WriteFile(roots, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	// A realm that grants every requested scope except to user "nobody".
	realm := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, _, _ := r.BasicAuth()
		var access []registrytoken.Access
		if s := r.URL.Query().Get("scope"); s != "" && user != "nobody" {
			parts := strings.Split(s, ":")
			access = append(access, registrytoken.Access{Type: parts[0], Name: parts[1], Actions: strings.Split(parts[2], ",")})
		}
		now := time.Now()
		tok, err := registrytoken.Mint(r.Context(), ca.Signer(), registrytoken.Token{
			Issuer: "test-issuer", Audience: r.URL.Query().Get("service"), Subject: user, Access: access,
			NotBefore: now, Expiry: now.Add(time.Minute), Chain: []*x509.Certificate{ca.Certificate()},
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
	reg, err := startDemoRegistryAt(ctx, testregistry.BuildBinary(t), dir, addr, realm.URL+"/token", "registry.test", "test-issuer", roots, "ES256")
	if err != nil {
		t.Fatal(err)
	}
	defer reg.stop()
	c := newRegistryClient(reg.host, realm.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs)

	st, err := c.getManifest(ctx, "team/app", "v1", "")
	if err != nil {
		t.Fatal(err)
	}
	if st.status != http.StatusUnauthorized || st.challenge.realm != realm.URL+"/token" || st.challenge.service != "registry.test" ||
		st.challenge.scope != "repository:team/app:pull" {
		t.Fatalf("anonymous pull: got %d %+v, want 401 with a challenge naming the realm, service and pull scope", st.status, st.challenge)
	}
	ch := st.challenge
	push, _, err := c.fetchToken(ctx, ch, "repository:team/app:pull,push", "ci", "secret")
	if err != nil {
		t.Fatal(err)
	}
	digest, err := c.pushDemoImage(ctx, "team/app", "v1", push)
	if err != nil {
		t.Fatal(err)
	}
	pull, access, err := c.fetchToken(ctx, ch, ch.scope, "puller", "secret")
	if err != nil {
		t.Fatal(err)
	}
	if len(access) != 1 || access[0].String() != "repository:team/app:pull" {
		t.Fatalf("the realm's token grants %v, want repository:team/app:pull", access)
	}
	if st, err = c.getManifest(ctx, "team/app", "v1", pull); err != nil || st.status != http.StatusOK || st.digest != digest {
		t.Fatalf("pull with a token: %+v, %v; want 200 with digest %s", st, err, digest)
	}
	none, access, err := c.fetchToken(ctx, ch, "repository:team/app:pull", "nobody", "secret")
	if err != nil || len(access) != 0 {
		t.Fatalf("token for nobody: access %v, err %v; want none", access, err)
	}
	if st, err = c.getManifest(ctx, "team/app", "v1", none); err != nil || st.status != http.StatusUnauthorized || st.challenge.errorCode != "insufficient_scope" {
		t.Fatalf("pull with a token granting nothing: %+v, %v; want 401 insufficient_scope", st, err)
	}
}

// The demo prints the plugin's password as "the service-account token": it
// must check that it is.
func TestRunDemoPluginChecksThePasswordIsTheToken(t *testing.T) {
	answer := `{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderResponse","cacheKeyType":"Image","cacheDuration":"5m0s","auth":{"registry.example:5000":{"username":"keyward","password":"something-else"}}}`
	plugin := []string{"/bin/sh", "-c", "cat >/dev/null; printf '%s' '" + answer + "'", "sh"}
	_, _, _, err := runDemoPlugin(t.Context(), plugin, "https://ts.example", "/dev/null", "registry.example:5000/shop/hello", "the.sa.token")
	if err == nil {
		t.Fatal("runDemoPlugin accepted a password that is not the service-account token")
	}
}
