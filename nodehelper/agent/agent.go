package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/internal/httpserve"
	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/certstore"
	"github.com/keyward/keyward/nodehelper/csrclient"
	"github.com/keyward/keyward/nodehelper/trust"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

var (
	// ErrInvalidOptions is matched by New's errors.
	ErrInvalidOptions = errors.New("invalid node agent options")
	// ErrUnknownCredential is matched by RenewNow's error for a name the
	// agent does not manage.
	ErrUnknownCredential = errors.New("unknown credential")
	// ErrAlreadyRunning is returned by a second Run.
	ErrAlreadyRunning = errors.New("node agent already running")
)

// Options configure an Agent.
type Options struct {
	// Config is a loaded (defaulted, valid) configuration.
	Config *Configuration
	// Clock drives schedules, backoff and expiry; nil is the real clock.
	Clock clock.WithTicker
	// Ready, if set, is called once the listeners are bound, with their
	// addresses ("" for one that is disabled).
	Ready func(metricsAddr, healthAddr string)
}

// CredentialStatus is what the agent knows about one credential.
type CredentialStatus struct {
	Name string
	// NotAfter of the current certificate (zero: none).
	NotAfter time.Time
	// Renewals are certificates obtained by this agent; Errors failed tries.
	Renewals, Errors int
	LastError        string
	// Pending is the CSR waited for, if any.
	Pending string
}

// deps are what unit tests replace: the CSR round trip, randomness, and
// how clients are built.
type deps struct {
	submit     func(context.Context, kubernetes.Interface, csrclient.Request) (*certv1.CertificateSigningRequest, error)
	wait       func(context.Context, kubernetes.Interface, *certv1.CertificateSigningRequest) ([]byte, error)
	rnd        func() float64
	restConfig func(kubeconfig string) (*rest.Config, error)
	newClient  func(*rest.Config) (kubernetes.Interface, error)
	// submitTimeout bounds one CSR submission (zero: submitTimeout).
	submitTimeout time.Duration
}

// submitTimeout bounds one CSR submission (a create and a get): an
// apiserver that accepts the connection and never answers would otherwise
// hold a renewal, silently, for good.
const submitTimeout = time.Minute

func defaultDeps() deps {
	return deps{
		submit:     csrclient.Submit,
		wait:       csrclient.Wait,
		rnd:        rand.Float64,
		restConfig: loadRESTConfig,
		newClient: func(c *rest.Config) (kubernetes.Interface, error) {
			hc, err := rest.HTTPClientFor(c)
			if err != nil {
				return nil, err
			}
			cs, err := kubernetes.NewForConfigAndClient(c, hc)
			if err != nil {
				return nil, err
			}
			return &httpClientset{Clientset: cs, http: hc}, nil
		},
	}
}

// loadRESTConfig loads kubeconfig, or without one the in-cluster
// configuration; its error says what to set in the agent's configuration.
func loadRESTConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		if _, err := rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("neither kubeconfig nor bootstrap.kubeconfig is set, and the in-cluster configuration (a pod's service account) does not load: %w", err)
		}
	}
	return kubeclient.Config(kubeconfig, 5, 10)
}

// httpClientset is a clientset that can close its idle connections.
type httpClientset struct {
	*kubernetes.Clientset
	http *http.Client
}

func (c *httpClientset) CloseIdleConnections() { c.http.CloseIdleConnections() }

// Agent keeps the configured credentials and trust files current. Build
// it with New, run it with Run.
type Agent struct {
	cfg     *Configuration
	clock   clock.WithTicker
	ready   func(string, string)
	deps    deps
	metrics *metrics
	creds   []*credential
	byName  map[string]*credential
	trusts  []trust.Options // without Client, Synced
	running atomic.Bool
	clients *clientSource // set by Run before any loop starts

	mu sync.Mutex // guards every credential's status fields
}

// credential is one managed key and certificate: a configured credential,
// or the bootstrap identity.
type credential struct {
	name     string
	identity bool
	keyType  string
	request  csrclient.Request // without Key
	output   *Output           // nil for the identity
	store    *certstore.Store
	kick     chan struct{}

	// Under Agent.mu.
	status  CredentialStatus
	tried   bool      // a renewal attempt has finished
	written bool      // the output matches the current pair
	renewAt time.Time // when the current pair is due

	// Only the credential's own loop uses these.
	problem        string // the error last logged at default verbosity
	currentProblem string // the same for reading the current pair
	identityFor    []byte // the leaf the client source was last given
}

// New defaults unset fields of opts.Config (Default), validates it and
// builds an Agent; it starts nothing and does no I/O.
func New(opts Options) (*Agent, error) {
	return newAgent(opts, defaultDeps())
}

func newAgent(opts Options, d deps) (*Agent, error) {
	if opts.Config == nil {
		return nil, fmt.Errorf("%w: a configuration is required", ErrInvalidOptions)
	}
	opts.Config.Default()
	if err := opts.Config.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if d.submitTimeout == 0 {
		d.submitTimeout = submitTimeout
	}
	cfg := opts.Config
	a := &Agent{cfg: cfg, clock: opts.Clock, ready: opts.Ready, deps: d, metrics: newMetrics(), byName: map[string]*credential{}}
	if b := cfg.Bootstrap; b != nil {
		usages := []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}
		if strings.HasPrefix(b.KeyType, "RSA") {
			usages = append(usages, certv1.UsageKeyEncipherment)
		}
		c, err := a.newCredential(IdentityName, true, b.KeyType, csrclient.Request{
			SignerName: b.SignerName,
			Template: &x509.CertificateRequest{Subject: pkix.Name{
				CommonName: "system:node:" + cfg.NodeName, Organization: []string{"system:nodes"}}},
			Usages:            usages,
			ExpirationSeconds: b.ExpirationSeconds,
		}, nil)
		if err != nil {
			return nil, err
		}
		a.creds = append(a.creds, c)
	}
	expand := func(s string) string { return strings.ReplaceAll(s, NodeNameVariable, cfg.NodeName) }
	for i := range cfg.Credentials {
		cr := &cfg.Credentials[i]
		tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: expand(cr.CommonName), Organization: cr.Organizations}}
		for _, dns := range cr.DNSNames {
			tmpl.DNSNames = append(tmpl.DNSNames, expand(dns))
		}
		for _, ip := range cr.IPAddresses {
			tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(ip))
		}
		for _, u := range cr.URIs {
			parsed, err := url.Parse(expand(u))
			if err != nil {
				return nil, fmt.Errorf("%w: credentials[%d].uris: %w", ErrInvalidOptions, i, err)
			}
			tmpl.URIs = append(tmpl.URIs, parsed)
		}
		var usages []certv1.KeyUsage
		for _, u := range cr.Usages {
			usages = append(usages, certv1.KeyUsage(u))
		}
		c, err := a.newCredential(cr.Name, false, cr.KeyType, csrclient.Request{
			SignerName: cr.SignerName, Template: tmpl, Usages: usages, ExpirationSeconds: cr.ExpirationSeconds,
		}, &cr.Output)
		if err != nil {
			return nil, err
		}
		a.creds = append(a.creds, c)
	}
	for i, t := range cfg.Trust {
		o := trust.Options{
			Name: t.ClusterTrustBundleName, SignerName: t.SignerName, LabelDomain: t.LabelDomain, Version: t.Version,
			Dir: t.Dir, FileName: t.File, Mode: fileMode(t.Mode), UID: owner(t.UID), GID: owner(t.GID),
			AdditionalBundleNames: t.AdditionalBundleNames, MaxCertificates: t.MaxCertificates, MaxBytes: t.MaxBytes,
			OnChangeDebounce: t.OnChangeDebounce.Duration, Clock: a.clock,
		}
		if t.NodeLabel != "" {
			o.NodeName, o.NodeLabel = cfg.NodeName, t.NodeLabel
		}
		if len(t.OnChange) > 0 {
			o.OnChange = trust.CommandHook(t.OnChange, t.OnChangeTimeout.Duration)
		}
		// Checked now with a placeholder client, so that Run cannot fail on it.
		check := o
		check.Client = &kubernetes.Clientset{}
		if _, err := trust.New(check); err != nil {
			return nil, fmt.Errorf("%w: trust[%d]: %w", ErrInvalidOptions, i, err)
		}
		a.trusts = append(a.trusts, o)
		a.metrics.trustWrites.WithLabelValues(t.Name)
		a.metrics.trustOverLimit.WithLabelValues(t.Name)
		a.metrics.trustIgnored.WithLabelValues(t.Name)
	}
	return a, nil
}

func (a *Agent) newCredential(name string, identity bool, keyType string, req csrclient.Request, out *Output) (*credential, error) {
	store, err := certstore.New(a.cfg.StateDir, name)
	if err != nil {
		return nil, fmt.Errorf("opening the state of credential %s: %w", name, err)
	}
	req.NamePrefix = "keyward-node-" + name + "-"
	c := &credential{name: name, identity: identity, keyType: keyType, request: req, output: out, store: store,
		kick: make(chan struct{}, 1), status: CredentialStatus{Name: name}}
	a.byName[name] = c
	// The series exist from the start (0: no certificate, none renewed).
	a.metrics.expiration.WithLabelValues(name)
	a.metrics.renewals.WithLabelValues(name)
	a.metrics.registry.MustRegister(expiredGauge(name, func() float64 {
		if a.unhealthy(c) != "" {
			return 1
		}
		return 0
	}))
	return c, nil
}

func fileMode(m *int32) os.FileMode {
	if m == nil {
		return 0
	}
	return os.FileMode(*m)
}

// owner is a configured uid or gid, atomicdir.KeepOwner when unset.
func owner(id *int) int {
	if id == nil {
		return atomicdir.KeepOwner
	}
	return *id
}

// Run keeps the credentials and trust files current and serves metrics and
// health until ctx ends; it returns nil then. It returns an error only when
// it cannot start (a kubeconfig that does not load, an address in use).
func (a *Agent) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	logger := klog.FromContext(ctx)
	if err := a.checkDirs(); err != nil {
		return err
	}
	unlock, err := a.lockStateDir(ctx)
	if err != nil || unlock == nil {
		return err // nil: ctx ended while another agent held the lock
	}
	defer unlock()
	kubeconfig, field := a.cfg.Kubeconfig, "kubeconfig"
	if a.cfg.Bootstrap != nil {
		kubeconfig, field = a.cfg.Bootstrap.Kubeconfig, "bootstrap.kubeconfig"
	}
	baseCfg, err := a.deps.restConfig(kubeconfig)
	if err != nil {
		return fmt.Errorf("%s: %w", field, err)
	}
	if a.clients, err = newClientSource(a.clock, baseCfg, a.cfg.Bootstrap != nil, a.deps.newClient); err != nil {
		return err
	}

	metricsAddr, healthAddr, stop, err := a.serveHTTP(ctx)
	if err != nil {
		return err
	}
	defer stop()
	if a.ready != nil {
		a.ready(metricsAddr, healthAddr)
	}
	logger.Info("Node agent started", "node", a.cfg.NodeName, "credentials", len(a.creds), "trust", len(a.trusts),
		"bootstrap", a.cfg.Bootstrap != nil, field, kubeconfig, "metrics", metricsAddr, "health", healthAddr)

	var wg sync.WaitGroup
	for _, c := range a.creds {
		wg.Go(func() { a.runCredential(ctx, c) })
	}
	for i := range a.trusts {
		wg.Go(func() { a.runTrust(ctx, a.cfg.Trust[i].Name, a.trusts[i]) })
	}
	wg.Wait()
	logger.Info("Node agent stopped", "node", a.cfg.NodeName)
	return nil
}

// RenewNow makes the credential (IdentityName for the bootstrap identity)
// renew at once, not at its scheduled time, and cuts a backoff wait short.
// A renewal already under way finishes first, then another starts; a
// renewal that starts after the call answers it. It does not wait.
func (a *Agent) RenewNow(credential string) error {
	c, ok := a.byName[credential]
	if !ok {
		return fmt.Errorf("renewing %q: %w", credential, ErrUnknownCredential)
	}
	select {
	case c.kick <- struct{}{}:
	default:
	}
	return nil
}

// Status returns each credential's state, the bootstrap identity first,
// then the configured credentials in order.
func (a *Agent) Status() []CredentialStatus {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]CredentialStatus, 0, len(a.creds))
	for _, c := range a.creds {
		out = append(out, c.status)
	}
	return out
}

// unhealthy says why c makes /healthz fail: its certificate has expired,
// or there is none after the first try; "" when neither.
func (a *Agent) unhealthy(c *credential) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case c.status.NotAfter.IsZero() && c.tried:
		return fmt.Sprintf("credential %s: no certificate yet: %s", c.name, c.status.LastError)
	case !c.status.NotAfter.IsZero() && !a.clock.Now().Before(c.status.NotAfter):
		return fmt.Sprintf("credential %s: certificate expired at %s", c.name, c.status.NotAfter.UTC().Format(time.RFC3339))
	}
	return ""
}

// unready says why c makes /readyz fail: no valid certificate written yet.
func (a *Agent) unready(c *credential) string {
	if why := a.unhealthy(c); why != "" {
		return why
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c.status.NotAfter.IsZero() || !c.written {
		return fmt.Sprintf("credential %s: not written yet", c.name)
	}
	return ""
}

func (a *Agent) serveHTTP(ctx context.Context) (metricsAddr, healthAddr string, stop func(), err error) {
	check := func(why func(*credential) string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			var problems []string
			for _, c := range a.creds {
				if p := why(c); p != "" {
					problems = append(problems, p)
				}
			}
			if len(problems) > 0 {
				http.Error(w, strings.Join(problems, "\n"), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		}
	}
	var endpoints []httpserve.Endpoint
	var which []*string
	if a.cfg.MetricsAddress != Disabled {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(a.metrics.registry, promhttp.HandlerOpts{Registry: a.metrics.registry}))
		endpoints, which = append(endpoints, httpserve.Endpoint{Addr: a.cfg.MetricsAddress, Handler: mux}), append(which, &metricsAddr)
	}
	if a.cfg.HealthAddress != Disabled {
		mux := http.NewServeMux()
		mux.Handle("/healthz", check(a.unhealthy))
		mux.Handle("/readyz", check(a.unready))
		endpoints, which = append(endpoints, httpserve.Endpoint{Addr: a.cfg.HealthAddress, Handler: mux}), append(which, &healthAddr)
	}
	if len(endpoints) == 0 {
		return "", "", func() {}, nil
	}
	addrs, stop, err := httpserve.Start(ctx, endpoints...)
	if err != nil {
		return "", "", nil, fmt.Errorf("serving metrics and health: %w", err)
	}
	for i, p := range which {
		*p = addrs[i]
	}
	return metricsAddr, healthAddr, stop, nil
}

// runTrust runs one trust projection, restarted with the new client after
// each node identity change (bootstrap) and after an error starting it.
func (a *Agent) runTrust(ctx context.Context, name string, opts trust.Options) {
	logger := klog.FromContext(ctx).WithValues("trust", name)
	ctx = klog.NewContext(ctx, logger)
	synced, once := make(chan struct{}), sync.Once{} // closed by the first pass
	rctx, stopReport := context.WithCancel(ctx)
	var report sync.WaitGroup
	defer report.Wait()
	defer stopReport()
	report.Go(func() { a.reportUnsynced(rctx, synced) })
	opts.Synced = func(o trust.Outcome) {
		once.Do(func() { close(synced) })
		if o.Written {
			a.metrics.trustWrites.WithLabelValues(name).Inc()
			a.metrics.trustUpdated.WithLabelValues(name).Set(float64(a.clock.Now().Unix()))
		}
		over := 0.0
		if o.OverLimit != "" {
			over = 1
		}
		a.metrics.trustOverLimit.WithLabelValues(name).Set(over)
		a.metrics.trustIgnored.WithLabelValues(name).Set(float64(len(o.Ignored)))
		if o.Data != nil {
			a.metrics.trustCerts.WithLabelValues(name).Set(float64(bytes.Count(o.Data, []byte("-----BEGIN CERTIFICATE-----"))))
		}
	}
	bo := backoff{initial: a.cfg.Renewal.RetryInitial.Duration, max: a.cfg.Renewal.RetryMax.Duration, rnd: a.deps.rnd}
	// One projector, run anew with each client: what it said about a
	// persisting problem (an empty selection) is not said again.
	var p *trust.Projector
	for {
		client, changed, until := a.clients.currentUntil()
		if client == nil {
			logger.V(2).Info("Trust projection waits for the node identity")
			select {
			case <-ctx.Done():
				return
			case <-changed:
				continue
			}
		}
		if p == nil {
			opts.Client = client
			var err error
			if p, err = trust.New(opts); err != nil { // checked by New: not expected
				logger.Error(err, "Trust projection cannot run")
				return
			}
		}
		pctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- p.RunWith(pctx, client) }()
		var expired <-chan time.Time // nil without bootstrap: never
		stopTimer := func() {}
		if !until.IsZero() {
			t := a.clock.NewTimer(until.Sub(a.clock.Now()))
			expired, stopTimer = t.C(), func() { t.Stop() }
		}
		select {
		case <-changed: // nil without bootstrap: never
			stopTimer()
			cancel()
			<-done
			logger.V(2).Info("Restarting the trust projection with the new node identity")
			continue
		case <-expired:
			// Its requests would only be refused from now on.
			cancel()
			<-done
			logger.Info("The node identity expired; the trust projection waits for a new one, keeping the last good trust file", "notAfter", until)
			continue
		case err := <-done:
			stopTimer()
			cancel()
			if err == nil { // ctx ended
				return
			}
			d := bo.next()
			logger.Error(err, "Trust projection stopped; keeping the last good trust file", "retryIn", d)
			if !a.sleep(ctx, d, nil) {
				return
			}
		}
	}
}

// trustSyncReport is how long a trust projection may go without reading
// ClusterTrustBundles before the agent says why at default verbosity
// (client-go's informers retry a failing list silently).
const trustSyncReport = time.Minute

// reportUnsynced says once, trustSyncReport after the trust projection
// started without a first pass (synced), why it cannot list
// ClusterTrustBundles (the apiserver's refusal or no answer). Without a
// client yet (bootstrap) the identity's own errors say it.
func (a *Agent) reportUnsynced(ctx context.Context, synced <-chan struct{}) {
	t := a.clock.NewTimer(trustSyncReport)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-synced:
		return
	case <-t.C():
	}
	client, _ := a.clients.current()
	if client == nil {
		return
	}
	lctx, cancel := context.WithTimeout(ctx, a.deps.submitTimeout)
	defer cancel()
	_, err := client.CertificatesV1().ClusterTrustBundles().List(lctx, metav1.ListOptions{Limit: 1})
	if ctx.Err() != nil {
		return
	}
	logger := klog.FromContext(ctx)
	if err != nil {
		logger.Error(err, "Trust projection cannot list ClusterTrustBundles; keeping the last good trust file", "after", trustSyncReport)
		return
	}
	// Listing works: what holds the projection (a failed write) it says itself.
	logger.V(2).Info("Trust projection has not synced yet", "after", trustSyncReport)
}

// sleep waits d on the agent's clock, or until kick or ctx ends (false).
func (a *Agent) sleep(ctx context.Context, d time.Duration, kick <-chan struct{}) bool {
	t := a.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C():
	case <-kick:
	}
	return true
}
