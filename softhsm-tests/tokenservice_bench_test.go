package softhsmtests

import (
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/kubeclient"
	signerconfig "github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/registrytoken"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
	"github.com/keyward/keyward/testsupport/servingcert"
)

// Run with: go test -run '^$' -bench TokenService -benchtime 1x ./softhsm-tests/
// (make bench-tokens). As the PCR benchmarks, each sub-benchmark is one
// measured run, not b.N loops: clients run for tsBenchWarmup (not
// counted), then for tsBenchWindow, and what completed in the window is
// the rate and the latencies.

const (
	tsBenchWarmup = 2 * time.Second
	tsBenchWindow = 6 * time.Second
	// tsBenchKMSLatency is the Cloud KMS fake's answer time per call, as
	// in the backends' KMS benchmark (BenchmarkSignAt20msLatency).
	tsBenchKMSLatency = 20 * time.Millisecond
	tsBenchAudience   = "keyward.dev/registry-bench"
	tsBenchService    = "registry.bench.example"
	tsBenchIssuer     = "keyward-bench"
)

var tsBenchClients = []int{8, 32}

// BenchmarkTokenService: registry tokens per second and their latency
// (p50, p90, p99), from C clients each holding its own pod's
// service-account token and its own keep-alive HTTPS connection, asking
// `GET /token?service=…&scope=repository:NS/app:pull` with Basic auth as
// containerd does, against the token service run as `keyward
// token-service` runs it (tokenservice.Run) with the real apiserver. Every
// answer is checked (200, the one scope granted, for this service and
// service account; each client's first token's signature verified with
// the generation's certificate); any failure fails the benchmark.
//
//   - apiserver-review: no token service, the apiserver's own ceiling for
//     a cold review's three calls (TokenReview, Pod GET, ServiceAccount
//     GET) from one unthrottled client.
//   - key=softhsm (the generation's key in SoftHSM2) and
//     key=gcpkms-20ms (in the Cloud KMS fake answering after 20 ms), each:
//   - raw: registrytoken.Mint alone with the same key and the same token
//     shape (x5c), C goroutines: what the signature costs.
//   - warm: the default review cache (10 s): each client's token is
//     reviewed about once, then served from the cache.
//   - cold-qps50: reviewCacheTTL 0s, every request does the three calls,
//     with kubeClient qps 50 / burst 100 (the signer's default).
//   - cold-qps1000: the same with kubeClient qps 1000 / burst 2000.
//
// Each keyward sub-benchmark also reports of-raw: its rate ÷ raw's at the
// same C in the same run.
func BenchmarkTokenService(b *testing.B) {
	// Not testContext: the whole run takes minutes.
	ctx := b.Context()
	env := newTSBenchEnv(b, ctx, slices.Max(tsBenchClients))

	b.Run("apiserver-review", func(b *testing.B) {
		cfg, err := kubeclient.Config(env.adminKubeconfig, 5000, 10000)
		if err != nil {
			b.Fatal(err)
		}
		client, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range tsBenchClients {
			b.Run(fmt.Sprintf("clients=%d", c), func(b *testing.B) {
				reportTSBench(b, measureTSBench(b, c, func(i int) error { return env.bareReview(ctx, client, i) }), 0)
			})
		}
	})

	for _, k := range []struct {
		name  string
		setup func(b *testing.B) (keyURI, caFile string, ca *x509.Certificate, opts all.Options)
	}{
		{"softhsm", func(b *testing.B) (string, string, *x509.Certificate, all.Options) {
			keyURI, caFile, ca := caInToken(b, uniqueName(b, "tokbench"))
			return keyURI, caFile, ca, all.Options{}
		}},
		{"gcpkms-20ms", func(b *testing.B) (string, string, *x509.Certificate, all.Options) {
			gcp, err := gcpkmsfake.Start(gcpkmsfake.Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { gcp.Close() })
			cryptoKey := "projects/keyward/locations/global/keyRings/ca/cryptoKeys/" + uniqueName(b, "tokbench")
			if err := gcp.AddCryptoKey(cryptoKey, kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256); err != nil {
				b.Fatal(err)
			}
			var opts all.Options
			opts.GCPKMS.ClientOptions = gcp.ClientOptions()
			keyURI, caFile, ca := newCA(b, opts, "gcpkms:"+cryptoKey, "tokbench-gcpkms")
			gcp.SetLatency(tsBenchKMSLatency)
			return keyURI, caFile, ca, opts
		}},
	} {
		b.Run("key="+k.name, func(b *testing.B) {
			keyURI, caFile, ca, opts := k.setup(b)
			signerName := "keyward.dev/tokbench-" + uniqueName(b, "s")
			activeAuthority(b, signerName, keyURI, caFile)

			raw := map[int]float64{}
			b.Run("raw", func(b *testing.B) {
				reg, err := all.NewRegistry(opts)
				if err != nil {
					b.Fatal(err)
				}
				defer reg.Close()
				key, err := reg.Open(ctx, backends.OpenRequest{URI: keyURI})
				if err != nil {
					b.Fatal(err)
				}
				defer key.Close()
				for _, c := range tsBenchClients {
					b.Run(fmt.Sprintf("clients=%d", c), func(b *testing.B) {
						res := measureTSBench(b, c, func(i int) error {
							now := time.Now()
							tok, err := registrytoken.Mint(ctx, key, registrytoken.Token{
								Issuer: tsBenchIssuer, Audience: tsBenchService, Subject: env.subject,
								Access:    []registrytoken.Access{env.access},
								NotBefore: now, Expiry: now.Add(5 * time.Minute), Chain: []*x509.Certificate{ca},
							})
							if err != nil {
								return err
							}
							return env.checkToken(tok, ca, false)
						})
						raw[c] = res.rate
						reportTSBench(b, res, 0)
					})
				}
			})

			for _, m := range []struct {
				name       string
				ttl        *metav1.Duration
				qps, burst int
			}{
				{"warm", nil, 0, 0},
				{"cold-qps50", &metav1.Duration{}, 50, 100},
				{"cold-qps1000", &metav1.Duration{}, 1000, 2000},
			} {
				b.Run(m.name, func(b *testing.B) {
					cfg := env.tokenServiceConfig(b, signerName, m.ttl, float32(m.qps), m.burst)
					base := startTSBenchService(b, cfg, opts)
					env.waitServing(b, ctx, base)
					for _, c := range tsBenchClients {
						b.Run(fmt.Sprintf("clients=%d", c), func(b *testing.B) {
							clients := env.httpClients(c)
							defer func() {
								for _, hc := range clients {
									hc.CloseIdleConnections()
								}
							}()
							verified := make([]bool, c)
							res := measureTSBench(b, c, func(i int) error {
								tok, err := env.getToken(ctx, clients[i], base, i)
								if err != nil {
									return err
								}
								// The first token of each client is
								// verified with the generation's key;
								// the rest are parsed and checked.
								err = env.checkToken(tok, ca, !verified[i])
								verified[i] = true
								return err
							})
							reportTSBench(b, res, raw[c])
						})
					}
				})
			}
		})
	}
}

// tsBenchEnv is what every sub-benchmark shares: pods, their tokens, the
// token service's serving certificate and kubeconfig.
type tsBenchEnv struct {
	ns       string
	pods     []*controlplane.WorkloadObjects
	saTokens []string
	subject  string
	access   registrytoken.Access
	scope    string

	adminKubeconfig   string
	certFile, keyFile string
	pool              *x509.CertPool
}

// newTSBenchEnv makes n pods of one service account on one node, each
// with a pod-bound token for the benchmark's audience (as kubelet requests
// it for the credential provider), and the token service's serving
// certificate.
func newTSBenchEnv(b *testing.B, ctx context.Context, n int) *tsBenchEnv {
	b.Helper()
	e := &tsBenchEnv{ns: uniqueName(b, "tokbench")}
	node := uniqueName(b, "node")
	for i := range n {
		w, err := controlplane.CreateWorkload(ctx, cp.AdminClient(), controlplane.Workload{
			Namespace: e.ns, Node: node, ServiceAccount: "puller", Pod: fmt.Sprintf("app-%d", i),
			// CreateWorkload's pods project a certificate; nothing
			// signs for this name, and nothing here needs it to.
			SignerNames: []string{"keyward.dev/tokbench-pods"},
		})
		if err != nil {
			b.Fatalf("creating workload: %v", err)
		}
		expiry := int64(3600)
		tr, err := cp.AdminClient().CoreV1().ServiceAccounts(e.ns).CreateToken(ctx, "puller", &authenticationv1.TokenRequest{
			Spec: authenticationv1.TokenRequestSpec{
				Audiences: []string{tsBenchAudience}, ExpirationSeconds: &expiry,
				BoundObjectRef: &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: w.Pod.Name, UID: w.Pod.UID},
			},
		}, metav1.CreateOptions{})
		if err != nil {
			b.Fatalf("requesting a pod-bound token: %v", err)
		}
		e.pods = append(e.pods, w)
		e.saTokens = append(e.saTokens, tr.Status.Token)
	}
	e.subject = "system:serviceaccount:" + e.ns + ":puller"
	e.access = registrytoken.Access{Type: "repository", Name: e.ns + "/app", Actions: []string{"pull"}}
	e.scope = "repository:" + e.ns + "/app:pull"

	dir := b.TempDir()
	e.adminKubeconfig = filepath.Join(dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", e.adminKubeconfig); err != nil {
		b.Fatal(err)
	}
	serving, err := servingcert.Write(dir, "token-service")
	if err != nil {
		b.Fatal(err)
	}
	e.certFile, e.keyFile, e.pool = serving.CertFile, serving.KeyFile, serving.Pool
	return e
}

// tokenServiceConfig is the token service's configuration for signerName:
// the pods' service account may pull ${namespace}/app.
func (e *tsBenchEnv) tokenServiceConfig(b *testing.B, signerName string, ttl *metav1.Duration, qps float32, burst int) *tsconfig.TokenServiceConfiguration {
	b.Helper()
	off := false
	cfg := &tsconfig.TokenServiceConfiguration{
		APIVersion: tsconfig.APIVersion, Kind: tsconfig.Kind,
		// The admin identity: the shipped RBAC is the end-to-end tests'
		// business; here it would only add an authorizer lookup.
		KubeClient:     signerconfig.KubeClient{Kubeconfig: e.adminKubeconfig, QPS: qps, Burst: burst},
		LeaderElection: signerconfig.LeaderElection{Enabled: &off},
		Listen:         tsconfig.Listen{Address: "127.0.0.1:0", TLSCertFile: e.certFile, TLSKeyFile: e.keyFile},
		MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		SignerName: signerName, Issuer: tsBenchIssuer, Audience: tsBenchAudience,
		TokenLifetime:  metav1.Duration{Duration: 5 * time.Minute},
		KeyIdentifier:  tsconfig.KeyIdentifierX5C,
		ReviewCacheTTL: ttl,
		Registries:     []tsconfig.Registry{{Service: tsBenchService}},
		Rules: []tsconfig.Rule{{
			Namespaces: []string{e.ns}, ServiceAccounts: []string{"puller"},
			Repositories: []string{"${namespace}/app"}, Actions: []string{tsconfig.ActionPull},
		}},
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		b.Fatalf("token service configuration invalid: %v", errs.ToAggregate())
	}
	return cfg
}

// startTSBenchService runs the token service in this process until the
// sub-benchmark ends, logging (audit lines included, default verbosity) to
// a file as a production process logs to its output; it returns the base
// URL of the token endpoint.
func startTSBenchService(b *testing.B, cfg *tsconfig.TokenServiceConfiguration, opts all.Options) string {
	b.Helper()
	// The end of the log only: every grant is an audit line.
	return "https://" + runTokenService(b, cfg, opts, inProcessTokenService{identity: "token-service-bench", logTail: 20})
}

// waitServing waits until the token service grants a token (its
// generation read and the key open).
func (e *tsBenchEnv) waitServing(b *testing.B, ctx context.Context, base string) {
	b.Helper()
	hc := e.httpClients(1)[0]
	defer hc.CloseIdleConnections()
	var last error
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, last = e.getToken(ctx, hc, base, 0)
		return last == nil, nil
	}); err != nil {
		b.Fatalf("the token service grants no token: %v", last)
	}
}

// httpClients are n clients, each with its own keep-alive connection (as
// n nodes' containerds have).
func (e *tsBenchEnv) httpClients(n int) []*http.Client {
	out := make([]*http.Client, n)
	for i := range out {
		out[i] = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: e.pool, MinVersion: tls.VersionTLS12},
			MaxIdleConnsPerHost: 1,
		}}
	}
	return out
}

// getToken is containerd's GET to the realm with pod i's token as Basic
// auth's password; it returns the registry token or why there is none.
func (e *tsBenchEnv) getToken(ctx context.Context, hc *http.Client, base string, i int) (string, error) {
	q := url.Values{"service": {tsBenchService}, "scope": {e.scope}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/token?"+q.Encode(), nil)
	if err != nil {
		return "", err
	}
	req.SetBasicAuth("keyward", e.saTokens[i])
	resp, err := hc.Do(req)
	if err != nil {
		return "", err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return "", fmt.Errorf("reading the token response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("token request: status %d: %s", resp.StatusCode, body)
	}
	var r struct {
		Token       string `json:"token"`
		AccessToken string `json:"access_token"`
		ExpiresIn   int64  `json:"expires_in"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		return "", fmt.Errorf("decoding the token response %q: %w", body, err)
	}
	if r.Token == "" || r.Token != r.AccessToken || r.ExpiresIn <= 0 {
		return "", fmt.Errorf("token response without a usable token: %s", body)
	}
	return r.Token, nil
}

// checkToken checks that jwt grants exactly the benchmark's scope to its
// service account for its service and, if verify, that ca's key signed it
// (ES256).
func (e *tsBenchEnv) checkToken(jwt string, ca *x509.Certificate, verify bool) error {
	head, rest, _ := strings.Cut(jwt, ".")
	payload, sig, ok := strings.Cut(rest, ".")
	if head == "" || !ok || strings.Contains(sig, ".") {
		return fmt.Errorf("not a JWS: %q", jwt)
	}
	raw, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil {
		return fmt.Errorf("decoding the token's claims: %w", err)
	}
	var c struct {
		Aud    string                 `json:"aud"`
		Sub    string                 `json:"sub"`
		Exp    int64                  `json:"exp"`
		Access []registrytoken.Access `json:"access"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return fmt.Errorf("decoding the token's claims: %w", err)
	}
	if c.Aud != tsBenchService || c.Sub != e.subject || !reflect.DeepEqual(c.Access, []registrytoken.Access{e.access}) {
		return fmt.Errorf("the token says aud %q sub %q access %+v, want %q %q %+v", c.Aud, c.Sub, c.Access, tsBenchService, e.subject, e.access)
	}
	if !verify {
		return nil
	}
	s, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil || len(s) != 64 {
		return fmt.Errorf("the token's signature is not an ES256 signature (%d bytes, %v)", len(s), err)
	}
	pub, ok := ca.PublicKey.(*ecdsa.PublicKey)
	if !ok {
		return fmt.Errorf("the generation's key is a %T, not ECDSA", ca.PublicKey)
	}
	digest := sha256.Sum256([]byte(head + "." + payload))
	if !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(s[:32]), new(big.Int).SetBytes(s[32:])) {
		return errors.New("the token's signature does not verify with the generation's certificate")
	}
	return nil
}

// bareReview is what a cold review asks the apiserver for pod i's token:
// a TokenReview for the audience, the bound Pod, the ServiceAccount.
func (e *tsBenchEnv) bareReview(ctx context.Context, client kubernetes.Interface, i int) error {
	tr, err := client.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{
		Spec: authenticationv1.TokenReviewSpec{Token: e.saTokens[i], Audiences: []string{tsBenchAudience}},
	}, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	if !tr.Status.Authenticated || tr.Status.User.Username != e.subject {
		return fmt.Errorf("TokenReview: authenticated %t as %q (%s)", tr.Status.Authenticated, tr.Status.User.Username, tr.Status.Error)
	}
	if _, err := client.CoreV1().Pods(e.ns).Get(ctx, e.pods[i].Pod.Name, metav1.GetOptions{}); err != nil {
		return err
	}
	_, err = client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "puller", metav1.GetOptions{})
	return err
}

// tsBenchResult is one measured window.
type tsBenchResult struct {
	rate float64
	lat  []time.Duration // sorted
}

// measureTSBench runs op(i) in a loop on each of clients goroutines (i is
// the goroutine) for tsBenchWarmup, then for tsBenchWindow; the rate and
// latencies are those of the calls that completed in the window. Any
// error fails the benchmark (after all goroutines stopped).
func measureTSBench(b *testing.B, clients int, op func(i int) error) tsBenchResult {
	b.Helper()
	var (
		failed atomic.Pointer[error]
		wg     sync.WaitGroup
		mu     sync.Mutex
		lat    []time.Duration
	)
	start := time.Now()
	from, to := start.Add(tsBenchWarmup), start.Add(tsBenchWarmup+tsBenchWindow)
	b.ResetTimer()
	for i := range clients {
		wg.Go(func() {
			var mine []time.Duration
			for failed.Load() == nil {
				t0 := time.Now()
				if !t0.Before(to) {
					break
				}
				if err := op(i); err != nil {
					err = fmt.Errorf("client %d: %w", i, err)
					failed.CompareAndSwap(nil, &err)
					return
				}
				if t1 := time.Now(); !t1.Before(from) && t1.Before(to) {
					mine = append(mine, t1.Sub(t0))
				}
			}
			mu.Lock()
			lat = append(lat, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	if len(lat) == 0 {
		b.Fatalf("nothing completed in the %s window", tsBenchWindow)
	}
	slices.Sort(lat)
	return tsBenchResult{rate: float64(len(lat)) / tsBenchWindow.Seconds(), lat: lat}
}

// reportTSBench reports tokens/s, p50/p90/p99/max in ms and, if raw is
// set, of-raw = rate ÷ raw.
func reportTSBench(b *testing.B, r tsBenchResult, raw float64) {
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	pct := func(p float64) float64 { return ms(r.lat[int(p*float64(len(r.lat)-1))]) }
	b.ReportMetric(r.rate, "tokens/s")
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.90), "p90-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(ms(r.lat[len(r.lat)-1]), "max-ms")
	if raw > 0 {
		b.ReportMetric(r.rate/raw, "of-raw")
	}
}
