package demo

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The demo's registry side: a CNCF Distribution registry (bin/registry,
// Distribution's own serve command) started with token authentication, and
// a registry client written out step by step so that the demo can print
// each exchange. keyward's tests pull with containerd's resolver instead
// (testsupport/testregistry); this client only shows what happens.

// demoRegistry is a running registry process.
type demoRegistry struct {
	host string // 127.0.0.1:PORT
	cmd  *exec.Cmd
	done chan error
	log  *os.File
}

// registryConfig is a Distribution configuration trusting the keys in
// trustFile (trustKey rootcertbundle: PEM roots; jwks: a JWKS) for tokens
// of issuer for service, with realm as the token endpoint, and accepting
// only alg.
func registryConfig(addr, realm, service, issuer, trustKey, trustFile, alg string) string {
	return fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  inmemory: {}
http:
  addr: %s
auth:
  token:
    realm: %s
    service: %s
    issuer: %s
    %s: %s
    # Only the algorithm of the token-signing key: left empty, Distribution
    # would also accept HS256/384/512 tokens.
    signingalgorithms: [%s]
`, addr, realm, service, issuer, trustKey, trustFile, alg)
}

// startDemoRegistryAt writes the configuration into dir and starts bin, the
// registry binary, listening on addr and trusting the roots in rootBundle;
// it returns once the registry answers.
func startDemoRegistryAt(ctx context.Context, bin, dir, addr, realm, service, issuer, rootBundle, alg string) (*demoRegistry, error) {
	return startRegistryTrusting(ctx, bin, dir, addr, realm, service, issuer, "rootcertbundle", rootBundle, alg)
}

// startRegistryTrusting is startDemoRegistryAt with the trust given as
// registryConfig's trustKey and trustFile.
func startRegistryTrusting(ctx context.Context, bin, dir, addr, realm, service, issuer, trustKey, trustFile, alg string) (*demoRegistry, error) {
	cfgPath := filepath.Join(dir, "registry-config.yml")
	if err := os.WriteFile(cfgPath, []byte(registryConfig(addr, realm, service, issuer, trustKey, trustFile, alg)), 0o600); err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "registry.log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, "serve", cfgPath)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting the registry %s: %w", bin, err)
	}
	r := &demoRegistry{host: addr, cmd: cmd, done: make(chan error, 1), log: logf}
	go func() { r.done <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/v2/")
		if err == nil {
			resp.Body.Close()
			return r, nil
		}
		select {
		case err := <-r.done:
			r.done <- err
			r.stop()
			return nil, fmt.Errorf("the registry exited at start (%v); its log: %s", err, logf.Name())
		case <-ctx.Done():
			r.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			r.stop()
			return nil, fmt.Errorf("the registry did not answer on %s within 30s; its log: %s", addr, logf.Name())
		}
	}
}

// stop ends the registry process.
func (r *demoRegistry) stop() {
	if r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		<-r.done
	}
	r.log.Close()
}

// challenge is a registry's Bearer challenge.
type challenge struct {
	realm, service, scope, errorCode string
}

// parseBearerChallenge reads a WWW-Authenticate: Bearer k="v",... header.
func parseBearerChallenge(h string) (challenge, bool) {
	scheme, params, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return challenge{}, false
	}
	var c challenge
	for params != "" {
		var kv string
		// Values are quoted and may hold commas (scopes do).
		k, rest, ok := strings.Cut(params, "=")
		if !ok {
			break
		}
		k = strings.TrimSpace(k)
		if strings.HasPrefix(rest, `"`) {
			end := strings.Index(rest[1:], `"`)
			if end < 0 {
				break
			}
			kv, params = rest[1:1+end], strings.TrimPrefix(rest[2+end:], ",")
		} else {
			kv, params, _ = strings.Cut(rest, ",")
		}
		switch k {
		case "realm":
			c.realm = kv
		case "service":
			c.service = kv
		case "scope":
			c.scope = kv
		case "error":
			c.errorCode = kv
		}
	}
	return c, c.realm != ""
}

// registryClient talks to one registry over plain HTTP and to its token
// realm over HTTPS trusting realmCAs.
type registryClient struct {
	host  string
	realm *http.Client
	plain *http.Client
}

func newRegistryClient(host string, realmCAs *x509.CertPool) *registryClient {
	return &registryClient{
		host: host,
		realm: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: realmCAs, MinVersion: tls.VersionTLS12},
		}},
		plain: &http.Client{Timeout: 30 * time.Second},
	}
}

// fetchToken asks the realm for a token for scope as user/password (HTTP
// Basic, as Distribution's clients do) and returns it with what the
// realm's JWT grants.
func (c *registryClient) fetchToken(ctx context.Context, ch challenge, scope, user, password string) (string, []grantedAccess, error) {
	q := url.Values{"service": {ch.service}}
	if scope != "" {
		q.Set("scope", scope)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, ch.realm+"?"+q.Encode(), nil)
	if err != nil {
		return "", nil, err
	}
	req.SetBasicAuth(user, password)
	resp, err := c.realm.Do(req)
	if err != nil {
		return "", nil, fmt.Errorf("token realm %s: %w", ch.realm, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", nil, fmt.Errorf("token realm %s answered %s: %s", ch.realm, resp.Status, strings.TrimSpace(string(body)))
	}
	var tr struct {
		Token string `json:"token"`
	}
	if err := json.Unmarshal(body, &tr); err != nil || tr.Token == "" {
		return "", nil, fmt.Errorf("token realm %s answered no token: %s", ch.realm, strings.TrimSpace(string(body)))
	}
	access, err := jwtAccess(tr.Token)
	if err != nil {
		return "", nil, err
	}
	return tr.Token, access, nil
}

// grantedAccess is one access entry of a registry JWT.
type grantedAccess struct {
	Type    string   `json:"type"`
	Name    string   `json:"name"`
	Actions []string `json:"actions"`
}

func (g grantedAccess) String() string {
	return g.Type + ":" + g.Name + ":" + strings.Join(g.Actions, ",")
}

// jwtAccess reads (without verifying: the registry verifies) the access
// claim of a registry token, for display.
func jwtAccess(token string) ([]grantedAccess, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("the realm's token is not a compact JWS")
	}
	payload, err := decodeSegment(parts[1])
	if err != nil {
		return nil, fmt.Errorf("the realm's token payload: %w", err)
	}
	var claims struct {
		Access []grantedAccess `json:"access"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return nil, fmt.Errorf("the realm's token payload: %w", err)
	}
	return claims.Access, nil
}

// do sends req to the registry, with token as a Bearer if set.
func (c *registryClient) do(req *http.Request, token string) (*http.Response, error) {
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	return c.plain.Do(req)
}

// pullStep is what one manifest GET showed.
type pullStep struct {
	status    int
	challenge challenge
	digest    string
}

// getManifest GETs repo's manifest ref with token (none: anonymous).
func (c *registryClient) getManifest(ctx context.Context, repo, ref, token string) (pullStep, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+c.host+"/v2/"+repo+"/manifests/"+ref, nil)
	if err != nil {
		return pullStep{}, err
	}
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json")
	resp, err := c.do(req, token)
	if err != nil {
		return pullStep{}, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	st := pullStep{status: resp.StatusCode}
	if resp.StatusCode == http.StatusOK {
		sum := sha256.Sum256(body)
		st.digest = "sha256:" + hex.EncodeToString(sum[:])
	}
	if ch, ok := parseBearerChallenge(resp.Header.Get("WWW-Authenticate")); ok {
		st.challenge = ch
	}
	return st, nil
}

// pushDemoImage pushes a one-layer OCI image as repo:tag with token (which
// must grant push) and returns its manifest digest.
func (c *registryClient) pushDemoImage(ctx context.Context, repo, tag, token string) (string, error) {
	layer := []byte("hello from keyward's demo\n")
	configBlob := []byte(`{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":["` + digestOf(layer) + `"]}}`)
	for _, blob := range [][]byte{layer, configBlob} {
		if err := c.pushBlob(ctx, repo, blob, token); err != nil {
			return "", err
		}
	}
	manifest, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        map[string]any{"mediaType": "application/vnd.oci.image.config.v1+json", "digest": digestOf(configBlob), "size": len(configBlob)},
		"layers":        []any{map[string]any{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digestOf(layer), "size": len(layer)}},
	})
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+c.host+"/v2/"+repo+"/manifests/"+tag, bytes.NewReader(manifest))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/vnd.oci.image.manifest.v1+json")
	if err := c.expect(req, token, http.StatusCreated, "pushing the manifest"); err != nil {
		return "", err
	}
	return digestOf(manifest), nil
}

// pushBlob uploads blob monolithically (POST then PUT).
func (c *registryClient) pushBlob(ctx context.Context, repo string, blob []byte, token string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+c.host+"/v2/"+repo+"/blobs/uploads/", nil)
	if err != nil {
		return err
	}
	resp, err := c.do(req, token)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusAccepted {
		return fmt.Errorf("starting a blob upload to %s: registry answered %s", repo, resp.Status)
	}
	loc, err := resp.Location()
	if err != nil {
		return fmt.Errorf("starting a blob upload to %s: %w", repo, err)
	}
	q := loc.Query()
	q.Set("digest", digestOf(blob))
	loc.RawQuery = q.Encode()
	req, err = http.NewRequestWithContext(ctx, http.MethodPut, loc.String(), bytes.NewReader(blob))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/octet-stream")
	return c.expect(req, token, http.StatusCreated, "uploading a blob")
}

func (c *registryClient) expect(req *http.Request, token string, want int, doing string) error {
	resp, err := c.do(req, token)
	if err != nil {
		return fmt.Errorf("%s: %w", doing, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: registry answered %s: %s", doing, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// decodeSegment decodes one base64url segment of a compact JWS.
func decodeSegment(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(s)
}
