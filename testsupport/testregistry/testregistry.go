// Package testregistry runs a CNCF Distribution registry in the test's own
// process, on 127.0.0.1, with storage in a test directory and token authentication
// trusting the keys a test gives it, and with one small image already
// pushed so that pulls can be tried.
package testregistry

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	"github.com/go-jose/go-jose/v4"
	"github.com/sirupsen/logrus"

	"github.com/keyward/keyward/signer/registrytoken"

	// The token access controller and the filesystem storage driver
	// register themselves by name.
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
)

// The image every registry holds.
const (
	Repository = "keyward/hello"
	Tag        = "v1"
	// ManifestMediaType is the media type of the pushed manifest.
	ManifestMediaType = "application/vnd.oci.image.manifest.v1+json"
)

// Options says whom the registry trusts. At least one of RootCerts and
// JWKS must be set (the registry's own admin key is added to RootCerts).
type Options struct {
	// Issuer and Service are the registry's auth.token.issuer and
	// auth.token.service (a token's iss and aud); defaults "keyward-test"
	// and "registry.keyward.test".
	Issuer, Service string
	// Realm is the token endpoint named in challenges: a token service's
	// https://HOST:PORT/token, which Pull then asks for tokens. Default
	// "https://token.keyward.test/token" (nothing serves it). A registry
	// started before its token service gets its Realm by Restart.
	Realm string
	// RootCerts go into auth.token.rootcertbundle: a token is trusted if
	// its x5c chain ends at one of them, or its kid is the JWK thumbprint
	// of one of their keys.
	RootCerts []*x509.Certificate
	// JWKS go into auth.token.jwks: a token whose kid is a key's kid is
	// trusted with that key.
	JWKS map[string]crypto.PublicKey
	// SigningAlgorithms is auth.token.signingalgorithms; empty: the
	// registry's default (every algorithm it knows).
	SigningAlgorithms []string
}

// Registry is a running registry.
type Registry struct {
	// URL is http://127.0.0.1:PORT; Host is 127.0.0.1:PORT (the host of
	// an image reference). Both stay the same across Restart.
	URL, Host        string
	Issuer, Service  string
	Realm            string
	ManifestDigest   string
	ManifestContents []byte

	dir     string
	srv     *httptest.Server
	handler atomic.Pointer[http.Handler]
	// stop shuts the running app down; guarded by mu.
	mu   sync.Mutex
	stop func() error
}

// Start starts a registry that lives until the test ends, and pushes
// Repository:Tag to it with a token signed by an admin key of its own.
// The registry's logs are discarded (its logger is process-wide: logrus's
// standard logger); set KEYWARD_TEST_REGISTRY_LOG=1 to see them.
//
// Its storage is a directory of the test's, so Restart keeps the image.
func Start(t testing.TB, opts Options) *Registry {
	t.Helper()
	if os.Getenv("KEYWARD_TEST_REGISTRY_LOG") == "" {
		logrus.SetOutput(io.Discard)
	}
	r := &Registry{dir: t.TempDir()}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		(*r.handler.Load()).ServeHTTP(w, req)
	}))
	r.URL = r.srv.URL
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	t.Cleanup(func() {
		r.srv.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := r.stop(); err != nil {
			t.Errorf("shutting the test registry down: %v", err)
		}
	})
	admin, adminCert := selfSigned(t, "testregistry admin")
	r.run(t, opts, adminCert)

	now := time.Now()
	tok, err := registrytoken.Mint(context.Background(), admin, registrytoken.Token{
		Issuer: r.Issuer, Audience: r.Service, Subject: "testregistry-admin",
		Access:    []registrytoken.Access{{Type: "repository", Name: Repository, Actions: []string{"pull", "push"}}},
		NotBefore: now, Expiry: now.Add(5 * time.Minute),
		Chain: []*x509.Certificate{adminCert},
	})
	if err != nil {
		t.Fatalf("minting the admin token: %v", err)
	}
	r.push(t, tok)
	return r
}

// Restart stops the registry and starts it again at the same address on
// the same storage with opts, as an operator restarts a registry after
// editing its configuration: Distribution's token access controller reads
// auth.token.rootcertbundle and jwks once, when the app is built
// (registry/auth/token/accesscontroller.go, newAccessController, called
// from handlers.NewApp), so a registry learns a new root bundle — or
// forgets a retired root — only by restarting. Requests arriving during
// the restart are served by the old configuration until the new one is
// ready. The image pushed by Start stays; the admin key does not (its
// root is no longer in the bundle).
func (r *Registry) Restart(t testing.TB, opts Options) {
	t.Helper()
	r.run(t, opts, nil)
}

// run builds an app for opts (adding extra to the root bundle), serves it
// at r's address and shuts the one it replaces down.
func (r *Registry) run(t testing.TB, opts Options, extra *x509.Certificate) {
	t.Helper()
	if opts.Issuer == "" {
		opts.Issuer = "keyward-test"
	}
	if opts.Service == "" {
		opts.Service = "registry.keyward.test"
	}
	if opts.Realm == "" {
		opts.Realm = "https://token.keyward.test/token"
	}
	roots := opts.RootCerts
	if extra != nil {
		roots = append([]*x509.Certificate{extra}, roots...)
	}
	dir, err := os.MkdirTemp(r.dir, "config-")
	if err != nil {
		t.Fatal(err)
	}
	var bundle bytes.Buffer
	for _, c := range roots {
		if err := pem.Encode(&bundle, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw}); err != nil {
			t.Fatal(err)
		}
	}
	bundlePath := filepath.Join(dir, "rootcertbundle.pem")
	if err := os.WriteFile(bundlePath, bundle.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	tokenAuth := configuration.Parameters{
		"realm":          opts.Realm,
		"service":        opts.Service,
		"issuer":         opts.Issuer,
		"rootcertbundle": bundlePath,
	}
	if len(opts.JWKS) > 0 {
		var set jose.JSONWebKeySet
		for kid, pub := range opts.JWKS {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: pub, KeyID: kid})
		}
		b, err := json.Marshal(set)
		if err != nil {
			t.Fatalf("encoding the JWKS: %v", err)
		}
		p := filepath.Join(dir, "jwks.json")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		tokenAuth["jwks"] = p
	}
	if len(opts.SigningAlgorithms) > 0 {
		algs := make([]any, len(opts.SigningAlgorithms))
		for i, a := range opts.SigningAlgorithms {
			algs[i] = a
		}
		tokenAuth["signingalgorithms"] = algs
	}

	cfg := baseConfig(t, filepath.Join(r.dir, "storage"))
	cfg.Auth = configuration.Auth{"token": tokenAuth}

	ctx, cancel := context.WithCancel(context.Background())
	app := newApp(t, ctx, cfg)
	var h http.Handler = app
	r.mu.Lock()
	defer r.mu.Unlock()
	old := r.stop
	r.handler.Store(&h)
	r.stop = func() error {
		cancel()
		return app.Shutdown()
	}
	r.Issuer, r.Service, r.Realm = opts.Issuer, opts.Service, opts.Realm
	if old != nil {
		if err := old(); err != nil {
			t.Errorf("shutting the replaced test registry down: %v", err)
		}
	}
}

// baseConfig is a registry's configuration without auth: filesystem
// storage in dir, no access log, no upload purging, a random HTTP secret.
func baseConfig(t testing.TB, dir string) *configuration.Configuration {
	t.Helper()
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		t.Fatal(err)
	}
	cfg := &configuration.Configuration{}
	cfg.Log.AccessLog.Disabled = true
	cfg.HTTP.Secret = hex.EncodeToString(secret)
	cfg.Storage = configuration.Storage{
		"filesystem":  configuration.Parameters{"rootdirectory": dir},
		"maintenance": configuration.Parameters{"uploadpurging": map[any]any{"enabled": false}},
	}
	return cfg
}

// newApp builds the registry's handler; NewApp panics on a bad
// configuration, which this turns into a test failure.
func newApp(t testing.TB, ctx context.Context, cfg *configuration.Configuration) (app *handlers.App) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("configuring the test registry: %v", p)
		}
	}()
	return handlers.NewApp(ctx, cfg)
}

// GetManifest fetches Repository:Tag's manifest from repo (the registry
// holds only Repository; any other name answers 404 once authorised) with
// the bearer token tok ("" for none). It returns the response; the caller
// closes its body.
func (r *Registry) GetManifest(t testing.TB, repo, tok string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, r.URL+"/v2/"+repo+"/manifests/"+Tag, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", ManifestMediaType)
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL, err)
	}
	return resp
}

// push uploads a config blob, a layer blob and an OCI manifest naming them.
func (r *Registry) push(t testing.TB, tok string) {
	t.Helper()
	layer := []byte("hello from keyward\n")
	config := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}`)
	layerDesc := r.pushBlob(t, tok, layer, "application/vnd.oci.image.layer.v1.tar")
	configDesc := r.pushBlob(t, tok, config, "application/vnd.oci.image.config.v1+json")
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     ManifestMediaType,
		"config":        configDesc,
		"layers":        []any{layerDesc},
	})
	if err != nil {
		t.Fatal(err)
	}
	resp := r.do(t, http.MethodPut, r.URL+"/v2/"+Repository+"/manifests/"+Tag, tok, ManifestMediaType, manifest)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("pushing the manifest: %s", describe(resp))
	}
	resp.Body.Close()
	r.ManifestContents = manifest
	r.ManifestDigest = digest(manifest)
}

func (r *Registry) pushBlob(t testing.TB, tok string, data []byte, mediaType string) map[string]any {
	t.Helper()
	resp := r.do(t, http.MethodPost, r.URL+"/v2/"+Repository+"/blobs/uploads/", tok, "", nil)
	if resp.StatusCode != http.StatusAccepted {
		t.Fatalf("starting a blob upload: %s", describe(resp))
	}
	resp.Body.Close()
	loc, err := resp.Location()
	if err != nil {
		t.Fatalf("blob upload location: %v", err)
	}
	q := loc.Query()
	q.Set("digest", digest(data))
	loc.RawQuery = q.Encode()
	resp = r.do(t, http.MethodPut, loc.String(), tok, "application/octet-stream", data)
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("finishing a blob upload: %s", describe(resp))
	}
	resp.Body.Close()
	return map[string]any{"mediaType": mediaType, "digest": digest(data), "size": len(data)}
}

func (r *Registry) do(t testing.TB, method, u, tok, contentType string, body []byte) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	return resp
}

func describe(resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	resp.Body.Close()
	return fmt.Sprintf("%s %s: %s (WWW-Authenticate: %s)", resp.Request.Method, (&url.URL{Path: resp.Request.URL.Path}).String(), resp.Status, resp.Header.Get("WWW-Authenticate")) + " " + string(b)
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// selfSigned makes a P-256 key and a self-signed certificate for it.
func selfSigned(t testing.TB, cn string) (*ecdsa.PrivateKey, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := SelfSign(key, cn)
	if err != nil {
		t.Fatal(err)
	}
	return key, cert
}

// SelfSign makes a self-signed certificate for key (signed by key, through
// its crypto.Signer), valid for a day: a token-signing key's entry in a
// rootcertbundle.
func SelfSign(key crypto.Signer, cn string) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 120))
	if err != nil {
		return nil, fmt.Errorf("making a serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: cn},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	if s, ok := key.(interface {
		SignatureAlgorithm() x509.SignatureAlgorithm
	}); ok {
		tmpl.SignatureAlgorithm = s.SignatureAlgorithm() // a backends.Signer signs one scheme only
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("self-signing %q: %w", cn, err)
	}
	return x509.ParseCertificate(der)
}

// BuildBinary builds hack/registry (Distribution's own serve command)
// into a temporary directory and returns its path: the
// registry binary `keyward demo` runs.
func BuildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "registry")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/keyward/keyward/hack/registry").CombinedOutput()
	if err != nil {
		t.Fatalf("building the registry: %v\n%s", err, out)
	}
	return bin
}
