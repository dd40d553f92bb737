package softhsmtests

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer/tokenservice"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/servingcert"
	"github.com/keyward/keyward/testsupport/testregistry"
)

// The flood of TestForgedTokensDoNotStarveRealPulls: bounded in rate,
// count and time, on loopback.
const (
	floodWorkers  = 128 // requests in flight at once, more than the 64 review slots
	floodRate     = 600 // requests a second, above the ~510/s of issue 25
	floodMax      = 20000
	floodMaxTime  = 60 * time.Second
	realPulls     = 20
	realPullEvery = 250 * time.Millisecond
)

// forger makes JWTs that pass every check short of the signature: a real
// token's header (its kid, or a random one) and claims (right audience,
// future exp, a real pod) with a fresh jti, so that no two are alike, and
// 64 random bytes as their ES256 signature.
type forger struct {
	head, claims map[string]any
}

func newForger(t *testing.T, real string) *forger {
	t.Helper()
	parts := strings.Split(real, ".")
	if len(parts) != 3 {
		t.Fatalf("not a JWT: %q", real)
	}
	f := &forger{}
	for i, into := range []*map[string]any{&f.head, &f.claims} {
		b, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err == nil {
			err = json.Unmarshal(b, into)
		}
		if err != nil {
			t.Fatalf("decoding a real token: %v", err)
		}
	}
	return f
}

func (f *forger) token(randomKid bool) string {
	random := func(n int) string {
		b := make([]byte, n)
		_, _ = rand.Read(b)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	enc := func(m map[string]any, key, value string) string {
		c := maps.Clone(m)
		if key != "" {
			c[key] = value
		}
		b, _ := json.Marshal(c) // strings, numbers and maps of them
		return base64.RawURLEncoding.EncodeToString(b)
	}
	kid := ""
	if randomKid {
		kid = "kid"
	}
	return enc(f.head, kid, random(32)) + "." + enc(f.claims, "jti", random(16)) + "." + random(64)
}

// TestForgedTokensDoNotStarveRealPulls (issue 25, finding 6): while 128
// clients send the token service about 600 forged service-account tokens
// a second — the right audience, a future exp, a real pod's claims, the
// apiserver's real kid or a random one, and a junk signature — 20 real
// pulls, each with a fresh pod-bound token (the plugin's credential call,
// then containerd's pull through the realm), 250 ms apart, all succeed.
// The token service runs as the shipped RBAC's identity. No forged token
// reaches a TokenReview (the review count is the real tokens'), each is
// refused as BadSignature, and the log has a refusal line at the default
// verbosity, not one per token.
func TestForgedTokensDoNotStarveRealPulls(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	admin := cp.AdminClient()
	signerName := registryTokenSigner // the name the shipped RBAC serves
	uri, caFile, root := caInToken(t, uniqueName(t, "flood-key"))
	activeAuthority(t, signerName, uri, caFile)
	t.Cleanup(func() {
		_ = authorities(t).Delete(context.Background(), authorityName(signerName), metav1.DeleteOptions{})
	})
	reg := testregistry.Start(t, testregistry.Options{RootCerts: []*x509.Certificate{root}, SigningAlgorithms: []string{"ES256"}})
	w := registryWorkload(t, ctx, uniqueName(t, "ns"), uniqueName(t, "node"), "app")

	serving, err := servingcert.Write(t.TempDir(), "token-service")
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tsconfig.TokenServiceConfiguration{
		APIVersion: tsconfig.APIVersion, Kind: tsconfig.Kind,
		KubeClient:     tokenServiceKubeClient(t, ctx),
		LeaderElection: leaderElectionOff(),
		Listen:         tsconfig.Listen{Address: "127.0.0.1:0", TLSCertFile: serving.CertFile, TLSKeyFile: serving.KeyFile},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		SignerName: signerName, Issuer: reg.Issuer, Audience: registryAudience,
		Registries: []tsconfig.Registry{{Service: reg.Service, Hosts: []string{reg.Host}}},
		Rules: []tsconfig.Rule{{Namespaces: []string{w.Pod.Namespace}, ServiceAccounts: []string{"puller"},
			Repositories: []string{testregistry.Repository}}},
	}
	off := false
	cfg.TrustPublisher.Enabled = &off
	var metricsAddr, healthAddr, logPath string
	listen := runTokenService(t, cfg, all.Options{}, inProcessTokenService{identity: "token-service-flood", logTail: 40,
		ready: func(_, metrics, health, log string) { metricsAddr, healthAddr, logPath = metrics, health, log }})
	base := "https://" + listen
	if err := waitReady(healthAddr); err != nil {
		t.Fatalf("token service not ready: %v", err)
	}
	reg.Restart(t, testregistry.Options{Realm: base + "/token", RootCerts: []*x509.Certificate{root}, SigningAlgorithms: []string{"ES256"}})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfigFor(serving.Pool)}, Timeout: 30 * time.Second}

	credential := func(tok string) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/credential",
			bytes.NewReader([]byte(`{"image":"`+reg.Host+`/`+testregistry.Repository+`:`+testregistry.Tag+`"}`)))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("POST /v1/credential: %d %s", resp.StatusCode, bytes.TrimSpace(body))
		}
		return nil
	}
	realPull := func() error {
		tok := podToken(t, ctx, admin, w, registryAudience)
		if err := credential(tok); err != nil {
			return err
		}
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		_, err := testregistry.Pull(pctx, reg.Host, testregistry.Repository, testregistry.Tag, tokenservice.Username, tok, serving.Pool)
		return err
	}
	// Unflooded, a real pull works (the setting is right).
	if err := realPull(); err != nil {
		t.Fatalf("a real pull without a flood: %v", err)
	}
	reviewsBefore, err := scrapeMetric(metricsAddr, "keyward_token_review_duration_seconds_count")
	if err != nil {
		t.Fatal(err)
	}

	// The flood.
	sample := podToken(t, ctx, admin, w, registryAudience)
	forge := newForger(t, sample)
	floodCtx, stopFlood := context.WithTimeout(ctx, floodMaxTime)
	defer stopFlood()
	limiter := rate.NewLimiter(floodRate, 1)
	var sent atomic.Int64
	var codesMu sync.Mutex
	codes := map[int]int{}
	var flood sync.WaitGroup
	transport := &http.Transport{TLSClientConfig: tlsConfigFor(serving.Pool), MaxIdleConnsPerHost: floodWorkers, MaxConnsPerHost: floodWorkers}
	defer transport.CloseIdleConnections()
	fc := &http.Client{Transport: transport, Timeout: 30 * time.Second}
	q := url.Values{"service": {reg.Service}, "scope": {"repository:" + testregistry.Repository + ":pull"}}
	for range floodWorkers {
		flood.Go(func() {
			for {
				if limiter.Wait(floodCtx) != nil {
					return
				}
				n := sent.Add(1)
				if n > floodMax {
					return
				}
				// Half with the apiserver's kid, half with a random one.
				tok := forge.token(n%2 == 1)
				req, _ := http.NewRequestWithContext(floodCtx, http.MethodGet, base+"/token?"+q.Encode(), nil)
				req.SetBasicAuth(tokenservice.Username, tok)
				resp, err := fc.Do(req)
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				codesMu.Lock()
				codes[resp.StatusCode]++
				codesMu.Unlock()
			}
		})
	}
	// Let the flood reach its rate before the first real pull.
	time.Sleep(time.Second)
	var failed []string
	for i := range realPulls {
		if err := realPull(); err != nil {
			failed = append(failed, fmt.Sprintf("pull %d: %v", i, err))
		}
		time.Sleep(realPullEvery)
	}
	stopFlood()
	flood.Wait()
	codesMu.Lock()
	t.Logf("flood: %d forged tokens sent, answers by status %v; %d/%d real pulls failed", min(sent.Load(), floodMax), codes, len(failed), realPulls)
	codesMu.Unlock()
	if len(failed) > 0 {
		t.Errorf("%d of %d real pulls failed under the flood:\n%s", len(failed), realPulls, strings.Join(failed, "\n"))
	}

	// No forged token reached the apiserver: the reviews are the real
	// pulls' (the credential call reviews, the realm's hits the cache).
	reviews, err := scrapeMetric(metricsAddr, "keyward_token_review_duration_seconds_count")
	if err != nil {
		t.Fatal(err)
	}
	if d := reviews - reviewsBefore; d > realPulls {
		t.Errorf("%v TokenReviews during the flood, want at most the %d real pulls' tokens: forged tokens reached the apiserver", d, realPulls)
	}
	if codes[http.StatusServiceUnavailable] > 0 {
		t.Errorf("%d forged tokens answered 503 (review capacity exhausted), want every one refused 401", codes[http.StatusServiceUnavailable])
	}
	badSig, err := scrapeMetric(metricsAddr, "keyward_token_refused_total", `reason="BadSignature"`)
	if err != nil {
		t.Fatal(err)
	}
	// At least every 401 the flood read; a few more when the flood's
	// deadline cut requests the service had already refused.
	if int(badSig) < codes[http.StatusUnauthorized] || badSig == 0 {
		t.Errorf("keyward_token_refused_total{reason=BadSignature} = %v, want at least the %d forged tokens answered 401", badSig, codes[http.StatusUnauthorized])
	}
	// One line at the default verbosity says so; not one line per token.
	log, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Count(string(log), "BadSignature")
	if lines == 0 || lines > 10 {
		t.Errorf("the log has %d lines about BadSignature refusals, want a few (the first, then a summary a minute)", lines)
	}
}
