package agent

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/certstore"
	"github.com/keyward/keyward/nodehelper/csrclient"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	testingclock "k8s.io/utils/clock/testing"
)

// testCA issues leaves for the fake CSR round trip.
type testCA struct {
	key  *ecdsa.PrivateKey
	cert *x509.Certificate
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, IsCA: true,
		BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign, NotBefore: start.Add(-time.Hour), NotAfter: start.AddDate(10, 0, 0)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{key: key, cert: cert}
}

// issue returns a PEM chain (leaf, CA) for pub valid from notBefore for lifetime.
func (ca *testCA) issue(t testing.TB, tmpl *x509.CertificateRequest, pub crypto.PublicKey, notBefore time.Time, lifetime time.Duration) []byte {
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	leaf := &x509.Certificate{SerialNumber: serial, Subject: tmpl.Subject, DNSNames: tmpl.DNSNames, IPAddresses: tmpl.IPAddresses, URIs: tmpl.URIs,
		NotBefore: notBefore, NotAfter: notBefore.Add(lifetime), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, leaf, ca.cert, pub, ca.key)
	if err != nil {
		t.Error(err)
		return nil
	}
	return append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})...)
}

// fakeCSRs plays the apiserver and signer for the agent's CSR round trip:
// Submit names the CSR as csrclient does; Wait issues at once (a lifetime
// of one hour from the fake clock's now) unless the test queued an error.
type fakeCSRs struct {
	t        *testing.T
	ca       *testCA
	clk      *testingclock.FakeClock
	lifetime time.Duration
	backdate time.Duration // notBefore is now minus this

	mu       sync.Mutex
	requests map[string]csrclient.Request // by CSR name
	submits  []string                     // CSR names, in order
	clients  []kubernetes.Interface       // the client of each submit
	failWait []error                      // returned by the next waits
	block    chan struct{}                // if set, Wait waits for it (or ctx)
}

func (f *fakeCSRs) submit(_ context.Context, c kubernetes.Interface, r csrclient.Request) (*certv1.CertificateSigningRequest, error) {
	name, err := csrclient.Name(r)
	if err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests[name] = r
	f.submits = append(f.submits, name)
	f.clients = append(f.clients, c)
	return &certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name}}, nil
}

func (f *fakeCSRs) wait(ctx context.Context, _ kubernetes.Interface, csr *certv1.CertificateSigningRequest) ([]byte, error) {
	f.mu.Lock()
	block := f.block
	var err error
	if len(f.failWait) > 0 {
		err, f.failWait = f.failWait[0], f.failWait[1:]
	}
	r := f.requests[csr.Name]
	f.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting: %w", ctx.Err())
		}
	}
	if err != nil {
		return nil, err
	}
	return f.ca.issue(f.t, r.Template, r.Key.Public(), f.clk.Now().Add(-f.backdate), f.lifetime), nil
}

func (f *fakeCSRs) submitted() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.submits...)
}

type harness struct {
	t       *testing.T
	clk     *testingclock.FakeClock
	csrs    *fakeCSRs
	cfg     *Configuration
	agent   *Agent
	health  string
	metrics string
	cancel  func()
	done    chan error
	clients []*rest.Config   // every config a client was built from
	objects []runtime.Object // what the fake clients hold
	mu      sync.Mutex
}

var start = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

// testConfig is one credential "daemon" (bundle, key and chain files) in tmp.
func testConfig(tmp string) *Configuration {
	mode := int32(0o640)
	cfg := &Configuration{
		APIVersion: APIVersion, Kind: Kind, NodeName: "worker-1", StateDir: filepath.Join(tmp, "state"),
		Kubeconfig: "/unused", MetricsAddress: "127.0.0.1:0", HealthAddress: "127.0.0.1:0",
		Credentials: []Credential{{
			Name: "daemon", SignerName: "keyward.dev/node-daemon", CommonName: "daemon:${NODE_NAME}",
			Output: Output{Dir: filepath.Join(tmp, "out"), KeyFile: "key.pem", ChainFile: "chain.pem", Mode: &mode},
		}},
	}
	cfg.Default()
	cfg.Renewal.RetryInitial.Duration = time.Second
	cfg.Renewal.RetryMax.Duration = 8 * time.Second
	return cfg
}

// bootstrapTrustConfig is testConfig with a bootstrap kubeconfig instead of
// the node's and a trust entry "registry" projecting the ClusterTrustBundle
// registry-ca (registryCA), defaulted; watch-list is off for the fake
// clientset (see TestTrustEntriesAreProjectedWithMetrics).
func bootstrapTrustConfig(t *testing.T) *Configuration {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	cfg.Kubeconfig = ""
	cfg.Bootstrap = &Bootstrap{Kubeconfig: "/unused/bootstrap"}
	cfg.Trust = []Trust{{Name: "registry", ClusterTrustBundleName: "registry-ca", Dir: filepath.Join(tmp, "trust")}}
	cfg.Default()
	return cfg
}

// registryCA is the ClusterTrustBundle bootstrapTrustConfig's trust entry
// projects: the harness CA's certificate.
func registryCA(h *harness) *certv1.ClusterTrustBundle {
	return &certv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "registry-ca"},
		Spec: certv1.ClusterTrustBundleSpec{TrustBundle: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.csrs.ca.cert.Raw}))}}
}

func newHarness(t *testing.T, cfg *Configuration, csrs *fakeCSRs) *harness {
	t.Helper()
	h := &harness{t: t, cfg: cfg}
	if csrs == nil {
		h.clk = testingclock.NewFakeClock(start)
		csrs = &fakeCSRs{t: t, ca: newTestCA(t), clk: h.clk, lifetime: time.Hour, requests: map[string]csrclient.Request{}}
	}
	h.clk, h.csrs = csrs.clk, csrs
	a, err := newAgent(Options{Config: cfg, Clock: h.clk, Ready: func(m, hl string) {
		h.mu.Lock()
		defer h.mu.Unlock()
		h.metrics, h.health = m, hl
	}}, deps{
		submit: csrs.submit, wait: csrs.wait, rnd: func() float64 { return 0.5 },
		restConfig: func(string) (*rest.Config, error) { return &rest.Config{Host: "https://127.0.0.1:1"}, nil },
		newClient: func(c *rest.Config) (kubernetes.Interface, error) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.clients = append(h.clients, c)
			return fake.NewClientset(h.objects...), nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	h.agent = a
	return h
}

func (h *harness) run() { h.runWith(context.Background()) }

func (h *harness) runWith(ctx context.Context) {
	ctx, cancel := context.WithCancel(ctx)
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- h.agent.Run(ctx) }()
	h.t.Cleanup(h.stop)
}

// runUntilWritten runs the agent and waits until the named credential's
// first certificate is written; it returns that credential.
func (h *harness) runUntilWritten(name string) *credential {
	h.t.Helper()
	h.run()
	c := h.agent.byName[name]
	h.eventually("the first certificate is written", 0, func() bool { return h.agent.unready(c) == "" })
	return c
}

func (h *harness) stop() {
	if h.cancel == nil {
		return
	}
	h.cancel()
	if err := <-h.done; err != nil {
		h.t.Errorf("Run: %v", err)
	}
	h.cancel = nil
}

// eventually polls cond; step, if positive, moves the fake clock on at each
// poll (to fire a backoff timer armed meanwhile).
func (h *harness) eventually(what string, step time.Duration, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting until %s; status %+v", what, h.agent.Status())
		}
		if step > 0 {
			h.clk.Step(step)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (h *harness) status(name string) CredentialStatus {
	for _, s := range h.agent.Status() {
		if s.Name == name {
			return s
		}
	}
	h.t.Fatalf("no status for %s", name)
	return CredentialStatus{}
}

// outputs reads the credential's set and checks it is one consistent pair:
// the bundle is PRIVATE KEY then the chain, key.pem and chain.pem its parts.
func (h *harness) output(dir string) (leaf *x509.Certificate) {
	h.t.Helper()
	files, err := atomicdir.Read(dir, "credential-bundle.pem", "key.pem", "chain.pem")
	if err != nil {
		h.t.Fatal(err)
	}
	if !bytes.Equal(files["credential-bundle.pem"], append(append([]byte{}, files["key.pem"]...), files["chain.pem"]...)) {
		h.t.Fatal("the bundle is not the key followed by the chain")
	}
	block, _ := pem.Decode(files["key.pem"])
	if block == nil || block.Type != "PRIVATE KEY" {
		h.t.Fatalf("key.pem does not start with a PRIVATE KEY block")
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		h.t.Fatal(err)
	}
	cblock, _ := pem.Decode(files["chain.pem"])
	leaf, err = x509.ParseCertificate(cblock.Bytes)
	if err != nil {
		h.t.Fatal(err)
	}
	if pub := key.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool }); !pub.Equal(leaf.PublicKey) {
		h.t.Fatal("key.pem does not hold the leaf's key")
	}
	return leaf
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The agent obtains the first certificate at once, writes it, and renews
// at the drawn point of the lifetime (80 % with the test's draw of 0.5) on
// the fake clock, with a new key and so a new CSR.
func TestRenewsAtTheScheduledPointOnTheFakeClock(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	h.run()
	h.eventually("the first certificate is written", 0, func() bool {
		return h.status("daemon").Renewals == 1 && h.agent.unready(h.agent.byName["daemon"]) == ""
	})
	first := h.output(filepath.Join(tmp, "out"))
	if first.Subject.CommonName != "daemon:worker-1" {
		t.Errorf("common name %q", first.Subject.CommonName)
	}
	c := h.agent.byName["daemon"]
	h.eventually("the renewal is scheduled", 0, func() bool {
		h.agent.mu.Lock()
		defer h.agent.mu.Unlock()
		return !c.renewAt.IsZero()
	})
	h.agent.mu.Lock()
	at := c.renewAt
	h.agent.mu.Unlock()
	if want := first.NotBefore.Add(48 * time.Minute); !at.Equal(want) {
		t.Errorf("renewal at %s, want %s (80 %% of one hour)", at, want)
	}
	h.eventually("the loop sleeps", 0, h.clk.HasWaiters)
	h.clk.SetTime(at.Add(-time.Second))
	if n := len(h.csrs.submitted()); n != 1 {
		t.Fatalf("%d CSRs before the renewal point, want 1", n)
	}
	h.clk.SetTime(at)
	h.eventually("the certificate is renewed", 0, func() bool { return h.status("daemon").Renewals == 2 })
	h.eventually("the new certificate is written", 0, func() bool { return !h.output(filepath.Join(tmp, "out")).Equal(first) })
	if names := h.csrs.submitted(); len(names) != 2 || names[0] == names[1] {
		t.Errorf("CSRs %v, want two with different names (a new key each)", names)
	}
	if code, body := get(t, "http://"+h.health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d %s", code, body)
	}
	if got := value(t, h.agent.metrics.renewals.WithLabelValues("daemon")); got != 2 {
		t.Errorf("renewals_total = %v, want 2", got)
	}
	code, body := get(t, "http://"+h.metrics+"/metrics")
	if code != http.StatusOK || !strings.Contains(body, `keyward_node_credential_expiration_seconds{credential="daemon"}`) {
		t.Errorf("/metrics = %d without the expiration gauge", code)
	}
}

var errAPIDown = errors.New("connection refused")

// A failed renewal keeps the files, counts the error with its reason,
// retries with backoff and recovers; a denial discards the pending key so
// the next try is a new key and CSR.
func TestErrorsKeepTheFilesBackOffAndRecover(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	h.run()
	h.eventually("the first certificate is written", 0, func() bool {
		return h.status("daemon").Renewals == 1 && h.agent.unready(h.agent.byName["daemon"]) == ""
	})
	first := h.output(filepath.Join(tmp, "out"))

	h.csrs.mu.Lock()
	h.csrs.failWait = []error{errAPIDown, errAPIDown, &csrclient.DecisionError{Name: "x", Type: certv1.CertificateDenied, Reason: "NotAllowed", Message: "no"}}
	h.csrs.mu.Unlock()
	if err := h.agent.RenewNow("daemon"); err != nil {
		t.Fatal(err)
	}
	h.eventually("three tries failed", 100*time.Millisecond, func() bool { return h.status("daemon").Errors == 3 })
	if got := h.output(filepath.Join(tmp, "out")); !got.Equal(first) {
		t.Error("the files changed after failed renewals")
	}
	if got := value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonAPI)); got != 2 {
		t.Errorf("renew_errors_total{reason=API} = %v, want 2", got)
	}
	if got := value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonDenied)); got != 1 {
		t.Errorf("renew_errors_total{reason=Denied} = %v, want 1", got)
	}
	h.eventually("the renewal succeeds", 100*time.Millisecond, func() bool { return h.status("daemon").Renewals == 2 })
	names := h.csrs.submitted()
	// 1 first, 2-4 the failed tries (same key: same name), 5 after the denial.
	if len(names) != 5 || names[1] != names[2] || names[2] != names[3] || names[4] == names[3] {
		t.Errorf("CSR names %v: want the same name until the denial, a new one after", names)
	}
	if s := h.status("daemon"); s.LastError != "" || s.Pending != "" {
		t.Errorf("status after recovery: %+v", s)
	}
}

// Bootstrap: the identity is requested with the bootstrap client as
// system:node:<node>; the credential then waits for it and is requested
// with a client built from the identity pair (the bootstrap kubeconfig's
// server, the pair as client certificate).
func TestBootstrapGetsTheIdentityThenUsesIt(t *testing.T) {
	cfg := bootstrapTrustConfig(t)
	h := newHarness(t, cfg, nil)
	h.objects = []runtime.Object{registryCA(h)}
	h.run()
	h.eventually("both certificates are issued", 0, func() bool {
		return h.status(IdentityName).Renewals == 1 && h.status("daemon").Renewals == 1
	})
	h.csrs.mu.Lock()
	idReq := h.csrs.requests[h.csrs.submits[0]]
	clients := append([]kubernetes.Interface(nil), h.csrs.clients...)
	h.csrs.mu.Unlock()
	if idReq.Template.Subject.CommonName != "system:node:worker-1" || idReq.SignerName != certv1.KubeAPIServerClientKubeletSignerName {
		t.Errorf("identity request %+v", idReq.Template.Subject)
	}
	if clients[0] != h.agent.clients.base {
		t.Error("the identity was not requested with the bootstrap client")
	}
	if clients[1] == h.agent.clients.base {
		t.Error("the credential was requested with the bootstrap client, not the identity")
	}
	pair, err := h.agent.byName[IdentityName].store.Current()
	if err != nil || pair == nil {
		t.Fatalf("identity pair: %v", err)
	}
	h.mu.Lock()
	last := h.clients[len(h.clients)-1]
	h.mu.Unlock()
	if !bytes.Equal(last.CertData, pair.ChainPEM) || !bytes.Equal(last.KeyData, pair.KeyPEM) || last.Host != "https://127.0.0.1:1" {
		t.Errorf("identity client config: host %s, cert is the pair's %v", last.Host, bytes.Equal(last.CertData, pair.ChainPEM))
	}
	// The trust projection waited for the identity, then ran with it.
	h.eventually("the trust file is written", 0, func() bool {
		return value(t, h.agent.metrics.trustWrites.WithLabelValues("registry")) == 1
	})
	// Renewing the identity rebuilds the client.
	h.mu.Lock()
	built := len(h.clients)
	h.mu.Unlock()
	if err := h.agent.RenewNow(IdentityName); err != nil {
		t.Fatal(err)
	}
	h.eventually("the identity is renewed and a client built from it", 0, func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.status(IdentityName).Renewals == 2 && len(h.clients) == built+1
	})
	if c, _ := h.agent.clients.current(); c == nil {
		t.Error("no identity client after the renewal")
	}

	// The identity expires (the agent was asleep): it is requested with
	// the bootstrap client again, and the credential then with the new identity.
	h.clk.SetTime(h.status(IdentityName).NotAfter.Add(time.Minute))
	h.eventually("the identity is renewed after expiry", time.Second, func() bool {
		return h.status(IdentityName).Renewals == 3 && h.status("daemon").Renewals == 2
	})
	h.csrs.mu.Lock()
	defer h.csrs.mu.Unlock()
	var idClients []kubernetes.Interface
	for i, name := range h.csrs.submits {
		if h.csrs.requests[name].SignerName == certv1.KubeAPIServerClientKubeletSignerName {
			idClients = append(idClients, h.csrs.clients[i])
		}
	}
	if len(idClients) != 3 || idClients[1] == h.agent.clients.base || idClients[2] != h.agent.clients.base {
		t.Errorf("identity requests: want bootstrap, identity, bootstrap (after expiry); bootstrap at %v",
			[]bool{idClients[0] == h.agent.clients.base, idClients[1] == h.agent.clients.base, idClients[len(idClients)-1] == h.agent.clients.base})
	}
}

// A crash after the commit but before the output was written (or any
// output that does not match) is repaired at start without a new request;
// a pending key left by a crash before issuance is resumed (same CSR name).
func TestStartRewritesAStaleOutputAndResumesThePendingKey(t *testing.T) {
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	clk := testingclock.NewFakeClock(start)
	csrs := &fakeCSRs{t: t, ca: newTestCA(t), clk: clk, lifetime: time.Hour, requests: map[string]csrclient.Request{}}

	// The crashed run: a committed pair, an output of an older pair.
	store, err := certstore.New(cfg.StateDir, "daemon")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: "daemon:worker-1"}}
	for i := range 2 {
		key, _, err := store.Pending(DefaultKeyType)
		if err != nil {
			t.Fatal(err)
		}
		pair, err := store.Commit(key, csrs.ca.issue(t, tmpl, key.Public(), clk.Now(), time.Hour), clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			if err := atomicdir.Write(cfg.Credentials[0].Output.Dir, outputFiles(&cfg.Credentials[0].Output, pair), atomicdir.Options{UID: -1, GID: -1}); err != nil {
				t.Fatal(err)
			}
		}
		clk.Step(2 * time.Second)
	}
	current, err := store.Current()
	if err != nil {
		t.Fatal(err)
	}

	h := newHarness(t, cfg, csrs)
	h.run()
	h.eventually("the output is the current pair", 0, func() bool { return h.agent.unready(h.agent.byName["daemon"]) == "" })
	if got := h.output(filepath.Join(tmp, "out")); !got.Equal(current.Chain[0]) {
		t.Error("the output is not the current pair")
	}
	if n := len(csrs.submitted()); n != 0 {
		t.Errorf("%d CSRs for a valid pair, want none", n)
	}
	h.stop()

	// Crash between the request and its issuance: a pending key exists.
	pending, _, err := store.Pending(DefaultKeyType)
	if err != nil {
		t.Fatal(err)
	}
	want, err := csrclient.Name(csrclient.Request{SignerName: "keyward.dev/node-daemon", Template: tmpl,
		Usages: []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, Key: pending, NamePrefix: "keyward-node-daemon-"})
	if err != nil {
		t.Fatal(err)
	}
	h2 := newHarness(t, cfg, csrs)
	h2.run()
	h2.eventually("the loop sleeps", 0, clk.HasWaiters)
	if err := h2.agent.RenewNow("daemon"); err != nil {
		t.Fatal(err)
	}
	h2.eventually("the resumed request is issued", 0, func() bool { return h2.status("daemon").Renewals == 1 })
	if names := csrs.submitted(); len(names) != 1 || names[0] != want {
		t.Errorf("CSRs %v, want only %s (the pending key's)", names, want)
	}
}

// /healthz fails while the credential has no certificate after its first
// try, and once its certificate has expired; the expired gauge says so.
func TestHealthFailsWhileMissingOrExpired(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	h.csrs.failWait = []error{errAPIDown}
	h.run()
	h.eventually("the first try failed", 0, func() bool { return h.status("daemon").Errors == 1 })
	if code, body := get(t, "http://"+h.health+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "daemon") {
		t.Errorf("/healthz = %d %q, want 503 naming the credential", code, body)
	}
	h.eventually("the certificate is issued", 100*time.Millisecond, func() bool { return h.status("daemon").Renewals == 1 })
	if code, _ := get(t, "http://"+h.health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d after issuance", code)
	}
	// The signer stops answering; the certificate runs out meanwhile.
	block := make(chan struct{})
	h.csrs.mu.Lock()
	h.csrs.block = block
	h.csrs.mu.Unlock()
	if err := h.agent.RenewNow("daemon"); err != nil {
		t.Fatal(err)
	}
	h.eventually("the renewal waits", 0, func() bool { return h.status("daemon").Pending != "" })
	h.clk.Step(2 * time.Hour)
	if code, body := get(t, "http://"+h.health+"/healthz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "expired") {
		t.Errorf("/healthz = %d %q, want 503 saying expired", code, body)
	}
	if code, body := get(t, "http://"+h.metrics+"/metrics"); code != http.StatusOK || !strings.Contains(body, `keyward_node_credential_expired{credential="daemon"} 1`) {
		t.Errorf("/metrics does not show the credential expired")
	}
	close(block)
}

func TestRenewNowRefusesAnUnknownCredential(t *testing.T) {
	h := newHarness(t, testConfig(t.TempDir()), nil)
	if err := h.agent.RenewNow("nope"); !errors.Is(err, ErrUnknownCredential) {
		t.Errorf("err = %v, want ErrUnknownCredential", err)
	}
}

// value reads a counter's or gauge's current value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

// A trust entry projects its ClusterTrustBundle to the trust file, and
// the trust metrics count the write and the certificates.
func TestTrustEntriesAreProjectedWithMetrics(t *testing.T) {
	// The fake clientset sends no watch-list bookmark; the projector's
	// ListWatch hides that it is a fake, so turn streaming lists off.
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	cfg.Trust = []Trust{{Name: "registry", ClusterTrustBundleName: "registry-ca", Dir: filepath.Join(tmp, "trust")}}
	h := newHarness(t, cfg, nil)
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: h.csrs.ca.cert.Raw})
	h.objects = []runtime.Object{&certv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "registry-ca"},
		Spec: certv1.ClusterTrustBundleSpec{TrustBundle: string(caPEM)}}}
	h.run()
	h.eventually("the trust file is written", 0, func() bool {
		return value(t, h.agent.metrics.trustWrites.WithLabelValues("registry")) == 1
	})
	files, err := atomicdir.Read(filepath.Join(tmp, "trust"), "ca-bundle.pem")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(files["ca-bundle.pem"], caPEM) {
		t.Errorf("trust file %q, want the bundle's certificate", files["ca-bundle.pem"])
	}
	if got := value(t, h.agent.metrics.trustCerts.WithLabelValues("registry")); got != 1 {
		t.Errorf("trust_bundle_certificates = %v, want 1", got)
	}
	if got := value(t, h.agent.metrics.trustUpdated.WithLabelValues("registry")); got != float64(start.Unix()) {
		t.Errorf("trust_bundle_last_update_seconds = %v, want the fake clock's %d", got, start.Unix())
	}
}

// The same error, repeated, is logged once at default verbosity; a
// different one is logged again.
func TestARepeatedErrorIsLoggedOnce(t *testing.T) {
	var mu sync.Mutex
	var failures []string
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "Renewing the credential failed") {
			mu.Lock()
			failures = append(failures, args)
			mu.Unlock()
		}
	}, funcr.Options{})
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(failures)
	}
	h := newHarness(t, testConfig(t.TempDir()), nil)
	h.csrs.failWait = []error{errAPIDown, errAPIDown, errAPIDown, errors.New("connection reset")}
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("four tries failed", 100*time.Millisecond, func() bool { return h.status("daemon").Errors == 4 })
	if n := count(); n != 2 {
		t.Errorf("%d failures logged at default verbosity, want 2 (one per distinct error): %q", n, failures)
	}
	if !strings.Contains(failures[0], `"error"`) || !strings.Contains(failures[0], "keyward-node-daemon-") || !strings.Contains(failures[0], `"reason"="API"`) {
		t.Errorf("the log line lacks the error, the CSR name or the reason: %s", failures[0])
	}
}

// A pending key file that holds no key (a torn write on a filesystem that
// lost it, a hand edit) does not wedge the credential: the store sets it
// aside and the agent gets a certificate for a new key.
func TestAnUnreadablePendingKeyIsReplaced(t *testing.T) {
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	store, err := certstore.New(cfg.StateDir, "daemon")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.Pending(DefaultKeyType); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg.StateDir, "daemon-pending.key"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cfg, nil)
	h.run()
	h.eventually("a certificate is issued", 100*time.Millisecond, func() bool { return h.status("daemon").Renewals == 1 })
}

// A signer whose certificates are due for renewal as soon as they are
// issued (a lifetime too short for the node's clock skew) does not make a
// CSR after CSR: the agent writes the certificate, says so, and renews
// with backoff.
func TestACertificateDueAsSoonAsIssuedIsRenewedWithBackoff(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	h.csrs.backdate = 55 * time.Minute // of one hour: past the 70 % point at issue
	h.run()
	h.eventually("the schedule problem is counted", 0, func() bool {
		return value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonSchedule)) == 1
	})
	if s := h.status("daemon"); s.Renewals != 1 || len(h.csrs.submitted()) != 1 {
		t.Fatalf("%d renewals, %d CSRs without the clock moving, want 1 each", s.Renewals, len(h.csrs.submitted()))
	}
	h.eventually("the certificate is written", 0, func() bool { return h.agent.unready(h.agent.byName["daemon"]) == "" })
	// After the backoff (at most retryInitial, 1s) the next renewal.
	h.eventually("the next renewal after the backoff", 100*time.Millisecond, func() bool {
		return value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonSchedule)) == 2
	})
	if n := len(h.csrs.submitted()); n != 2 {
		t.Errorf("%d CSRs after one backoff, want 2", n)
	}
}

// Every credential's series exist from the start (0 until a certificate
// exists or is renewed), so that rate() and absent() alerts work on a node
// that never got one.
func TestCredentialSeriesExistBeforeTheFirstCertificate(t *testing.T) {
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	cfg.Trust = []Trust{{Name: "registry", ClusterTrustBundleName: "registry-ca", Dir: filepath.Join(tmp, "trust")}}
	cfg.Default()
	h := newHarness(t, cfg, nil)
	families, err := h.agent.metrics.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"keyward_node_credential_expiration_seconds": false, "keyward_node_credential_renewals_total": false,
		"keyward_node_trust_bundle_writes_total": false}
	for _, f := range families {
		if _, ok := want[f.GetName()]; ok {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "credential" && l.GetValue() == "daemon" || l.GetName() == "trust" && l.GetValue() == "registry" {
						want[f.GetName()] = true
					}
				}
			}
		}
	}
	for name, found := range want {
		if !found {
			t.Errorf("%s is not exported for the configured credential or trust before any event", name)
		}
	}
}

// A CSR not issued within waitTimeout is reported with what holds it up:
// no approval (an approver that never approves) or no certificate after
// approval (a signer that never answers). The test is about the message.
func TestATimeoutSaysWhatTheCSRWaitsFor(t *testing.T) {
	for _, tc := range []struct {
		name       string
		conditions []certv1.CertificateSigningRequestCondition
		want       string
	}{
		{name: "a CSR nobody approved says it is not approved", want: "not approved"},
		{name: "an approved CSR says the signer has not issued it", want: "approved, but signer keyward.dev/node-daemon has not issued",
			conditions: []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateApproved, Status: "True"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			store, err := certstore.New(cfg.StateDir, "daemon")
			if err != nil {
				t.Fatal(err)
			}
			key, _, err := store.Pending(DefaultKeyType)
			if err != nil {
				t.Fatal(err)
			}
			name, err := csrclient.Name(csrclient.Request{SignerName: "keyward.dev/node-daemon",
				Template: &x509.CertificateRequest{Subject: pkix.Name{CommonName: "daemon:worker-1"}},
				Usages:   []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}, Key: key, NamePrefix: "keyward-node-daemon-"})
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, cfg, nil)
			h.objects = []runtime.Object{&certv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec:   certv1.CertificateSigningRequestSpec{SignerName: "keyward.dev/node-daemon"},
				Status: certv1.CertificateSigningRequestStatus{Conditions: tc.conditions}}}
			block := make(chan struct{})
			defer close(block)
			h.csrs.block = block
			h.run()
			h.eventually("the wait starts", 0, func() bool { return h.status("daemon").Pending == name })
			h.eventually("the wait times out", time.Minute, func() bool { return h.status("daemon").Errors == 1 })
			if got := h.status("daemon").LastError; !strings.Contains(got, name) || !strings.Contains(got, tc.want) {
				t.Errorf("error %q does not name the CSR and say %q", got, tc.want)
			}
		})
	}
}

// A trust selection that stays empty is said once at default verbosity,
// not again each time a node identity rotation restarts the projection.
func TestAnEmptyTrustSelectionIsSaidOnceAcrossIdentityRotations(t *testing.T) {
	var mu sync.Mutex
	said, passes := 0, 0 // at default verbosity; at any
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "No certificate in the selected") {
			mu.Lock()
			passes++
			if strings.Contains(args, `"level"=0`) {
				said++
			}
			mu.Unlock()
		}
	}, funcr.Options{Verbosity: 4})
	count := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return said, passes
	}
	cfg := bootstrapTrustConfig(t)
	h := newHarness(t, cfg, nil)
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("the empty selection is said", 0, func() bool { s, _ := count(); return s == 1 })
	for i := 2; i <= 3; i++ {
		_, before := count()
		if err := h.agent.RenewNow(IdentityName); err != nil {
			t.Fatal(err)
		}
		h.eventually("the identity is renewed", 0, func() bool { return h.status(IdentityName).Renewals == i })
		h.eventually("the restarted projection made a pass", 0, func() bool { _, p := count(); return p > before })
	}
	if s, p := count(); s != 1 {
		t.Errorf("the empty selection was said %d times at default verbosity (of %d passes), want once", s, p)
	}
}

// A Denied or Failed CSR is a decision someone must change: the next
// request (a new key, a new CSR) waits at least renewal.retryMax, and
// longer after each further decision, so a fleet of nodes refused by
// their approver does not make a CSR every few seconds each.
func TestADecisionWaitsAtLeastRetryMax(t *testing.T) {
	var mu sync.Mutex
	var waits []string
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "Renewing the credential failed") {
			if i := strings.Index(args, `"retryIn"="`); i >= 0 {
				mu.Lock()
				waits = append(waits, strings.SplitN(args[i+len(`"retryIn"="`):], `"`, 2)[0])
				mu.Unlock()
			}
		}
	}, funcr.Options{})
	cfg := testConfig(t.TempDir()) // retryInitial 1s, retryMax 8s
	h := newHarness(t, cfg, nil)
	h.agent.deps.rnd = func() float64 { return 0 } // the shortest draw of each jittered wait
	deny := func(reason string) error {
		return &csrclient.DecisionError{Name: "x", Type: certv1.CertificateDenied, Reason: reason, Message: "no"}
	}
	h.csrs.failWait = []error{deny("A"), errAPIDown, deny("B")}
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("three tries failed", 500*time.Millisecond, func() bool { return h.status("daemon").Errors == 3 })
	mu.Lock()
	defer mu.Unlock()
	// A denial: retryMax even at the shortest draw; an API error in
	// between: the ordinary backoff (second failure: 2s, drawn down to 1s);
	// the next denial: twice the first.
	if want := []string{"8s", "1s", "16s"}; !slices.Equal(waits, want) {
		t.Errorf("waits %v, want %v", waits, want)
	}
}

// The bootstrap identity asks for what kubelet's client certificate has:
// CN=system:node:<node>, O=system:nodes, digital signature and client
// auth, plus key encipherment for an RSA key only.
func TestTheIdentityRequestIsKubeletsClientRequest(t *testing.T) {
	for _, tc := range []struct {
		keyType string
		want    []certv1.KeyUsage
	}{
		{"ECDSAP256", []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
		{"ED25519", []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}},
		{"RSA3072", []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth, certv1.UsageKeyEncipherment}},
		{"RSA4096", []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth, certv1.UsageKeyEncipherment}},
	} {
		t.Run("a "+tc.keyType+" identity key", func(t *testing.T) {
			cfg := testConfig(t.TempDir())
			cfg.Kubeconfig = ""
			cfg.Bootstrap = &Bootstrap{Kubeconfig: "/unused/bootstrap", KeyType: tc.keyType}
			h := newHarness(t, cfg, nil)
			r := h.agent.byName[IdentityName].request
			if !slices.Equal(r.Usages, tc.want) {
				t.Errorf("usages %v, want %v", r.Usages, tc.want)
			}
			if s := r.Template.Subject; s.CommonName != "system:node:worker-1" || !slices.Equal(s.Organization, []string{"system:nodes"}) ||
				r.SignerName != certv1.KubeAPIServerClientKubeletSignerName {
				t.Errorf("subject %v, signer %s", s, r.SignerName)
			}
		})
	}
}

// An output directory that cannot be written is retried with backoff, but
// does not hold up a renewal that is due: the pair in the state directory
// (a bundle of its own) is renewed on time.
func TestABrokenOutputDoesNotHoldUpTheRenewal(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	h.runUntilWritten("daemon")
	// The output breaks after the start (a start with an unusable output
	// directory stops at once, naming it): its path becomes a file.
	out := filepath.Join(tmp, "out")
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	h.clk.Step(recheckEvery)
	h.eventually("the output failed", 0, func() bool {
		return value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonOutput)) >= 1
	})
	notAfter := h.status("daemon").NotAfter
	h.clk.SetTime(notAfter.Add(-5 * time.Minute)) // past the renewal point, still valid
	h.eventually("the certificate is renewed", time.Second, func() bool { return h.status("daemon").Renewals == 2 })
	if now := h.clk.Now(); !now.Before(notAfter) {
		t.Errorf("renewed at %s, only after the certificate expired at %s", now, notAfter)
	}
}

// While it waits for the renewal point the agent looks at the pair and
// the output again every few minutes (timers stop while a VM is paused,
// and an output removed by hand should not wait for the next renewal).
func TestTheOutputIsRepairedWithinMinutesWhileWaiting(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	h.runUntilWritten("daemon")
	h.eventually("the loop sleeps", 0, h.clk.HasWaiters)
	out := filepath.Join(tmp, "out")
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	h.clk.Step(recheckEvery)
	h.eventually("the output is written again", 0, func() bool {
		_, err := atomicdir.Read(out, "credential-bundle.pem")
		return err == nil
	})
	if n := len(h.csrs.submitted()); n != 1 {
		t.Errorf("%d CSRs, want 1 (the pair was valid)", n)
	}
}

// Retries of a failing renewal do not each say "Waiting for the
// certificate" at default verbosity: the failure was said once already.
func TestRetriesDoNotRepeatTheWaitingLine(t *testing.T) {
	var mu sync.Mutex
	waiting := 0
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "Waiting for the certificate") {
			mu.Lock()
			waiting++
			mu.Unlock()
		}
	}, funcr.Options{})
	h := newHarness(t, testConfig(t.TempDir()), nil)
	h.csrs.failWait = []error{errAPIDown, errAPIDown, errAPIDown}
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("the certificate is issued after three failures", 100*time.Millisecond, func() bool { return h.status("daemon").Renewals == 1 })
	mu.Lock()
	defer mu.Unlock()
	if waiting != 1 {
		t.Errorf("%d waiting lines at default verbosity for four tries, want 1", waiting)
	}
}

// An identity issued already due for renewal (Schedule) is still put to
// use at once: the credentials do not wait for the identity's backoff.
func TestAnIdentityDueAsSoonAsIssuedIsUsedAtOnce(t *testing.T) {
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	cfg.Kubeconfig = ""
	cfg.Bootstrap = &Bootstrap{Kubeconfig: "/unused/bootstrap"}
	cfg.Default()
	h := newHarness(t, cfg, nil)
	h.csrs.backdate = 55 * time.Minute
	h.run()
	h.eventually("the identity is issued", 0, func() bool { return h.status(IdentityName).Renewals == 1 })
	h.eventually("the credential is requested with it, the clock standing still", 0, func() bool {
		return h.status("daemon").Renewals == 1
	})
}

// When the node identity expires, the trust projection stops using it (its
// requests would only be refused) and waits for the next identity,
// keeping the last good file.
func TestTrustProjectionStopsWhenTheIdentityExpires(t *testing.T) {
	var mu sync.Mutex
	stopped := 0
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "The node identity expired") {
			mu.Lock()
			stopped++
			mu.Unlock()
		}
	}, funcr.Options{})
	cfg := bootstrapTrustConfig(t)
	h := newHarness(t, cfg, nil)
	h.objects = []runtime.Object{registryCA(h)}
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("the trust file is written", 0, func() bool {
		return value(t, h.agent.metrics.trustWrites.WithLabelValues("registry")) == 1
	})
	block := make(chan struct{})
	defer close(block)
	h.csrs.mu.Lock()
	h.csrs.block = block // the identity's renewal hangs
	h.csrs.mu.Unlock()
	h.clk.SetTime(h.status(IdentityName).NotAfter.Add(time.Minute))
	h.eventually("the projection stops", 0, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return stopped == 1
	})
	if _, err := atomicdir.Read(cfg.Trust[0].Dir, "ca-bundle.pem"); err != nil {
		t.Errorf("the trust file is gone: %v", err)
	}
}

// /readyz follows the output: once the written files are gone and cannot
// be written again, the agent is no longer ready.
func TestReadinessFollowsALostOutput(t *testing.T) {
	tmp := t.TempDir()
	h := newHarness(t, testConfig(tmp), nil)
	c := h.runUntilWritten("daemon")
	h.eventually("the loop sleeps", 0, h.clk.HasWaiters)
	out := filepath.Join(tmp, "out")
	if err := os.RemoveAll(out); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(out, nil, 0o600); err != nil { // a file where the directory was: unwritable
		t.Fatal(err)
	}
	h.clk.Step(recheckEvery)
	h.eventually("the output error is counted", 0, func() bool {
		return value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonOutput)) >= 1
	})
	if why := h.agent.unready(c); why == "" {
		t.Error("ready without its output")
	}
}

// Run leaves no goroutine behind once ctx ends, with bootstrap, a
// credential, a trust projection and an identity rotation.
func TestRunLeavesNoGoroutines(t *testing.T) {
	base := goruntime.NumGoroutine()
	cfg := bootstrapTrustConfig(t)
	h := newHarness(t, cfg, nil)
	h.run()
	h.eventually("the credential is issued", 0, func() bool { return h.status("daemon").Renewals == 1 })
	if err := h.agent.RenewNow(IdentityName); err != nil {
		t.Fatal(err)
	}
	h.eventually("the identity is renewed", 0, func() bool { return h.status(IdentityName).Renewals == 2 })
	h.stop()
	deadline := time.Now().Add(10 * time.Second)
	for goruntime.NumGoroutine() > base && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := goruntime.NumGoroutine(); n > base {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines after Run returned, %d before:\n%s", n, base, buf[:goruntime.Stack(buf, true)])
	}
}

// A second agent on the same state directory (a rolling update with
// surge) waits, saying so, until the first has stopped: two agents would
// commit pairs and write outputs at the same time.
func TestASecondAgentOnTheStateDirectoryWaits(t *testing.T) {
	tmp := t.TempDir()
	first := newHarness(t, testConfig(tmp), nil)
	first.run()
	first.eventually("the first agent has its certificate", 0, func() bool { return first.status("daemon").Renewals == 1 })

	var mu sync.Mutex
	waiting := false
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, "Another node agent holds the state directory") {
			mu.Lock()
			waiting = true
			mu.Unlock()
		}
	}, funcr.Options{})
	second := newHarness(t, testConfig(tmp), first.csrs)
	second.runWith(klog.NewContext(context.Background(), logger))
	second.eventually("the second agent waits", 0, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return waiting
	})
	second.mu.Lock()
	serving := second.health != ""
	second.mu.Unlock()
	if serving {
		t.Error("the second agent started serving while the first ran")
	}
	first.stop()
	second.eventually("the second agent starts", lockPoll, func() bool {
		second.mu.Lock()
		defer second.mu.Unlock()
		return second.health != ""
	})
}

// An output whose owner was changed (by hand, or a restore from backup)
// is written again with the configured owner, as a changed mode or
// content is.
func TestAnOutputWithAnotherOwnerIsRepaired(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to chown")
	}
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	uid, gid := 4321, 4322
	cfg.Credentials[0].Output.UID, cfg.Credentials[0].Output.GID = &uid, &gid
	h := newHarness(t, cfg, nil)
	h.runUntilWritten("daemon")
	h.eventually("the loop sleeps", 0, h.clk.HasWaiters)
	bundle := filepath.Join(tmp, "out", "credential-bundle.pem")
	if err := os.Chown(bundle, 0, 0); err != nil { // follows the link to the file
		t.Fatal(err)
	}
	h.clk.Step(recheckEvery)
	h.eventually("the owner is repaired", 0, func() bool {
		fi, err := os.Stat(bundle)
		if err != nil {
			return false
		}
		st := fi.Sys().(*syscall.Stat_t)
		return int(st.Uid) == uid && int(st.Gid) == gid
	})
}
