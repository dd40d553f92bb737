// Package tokenservice is keyward's registry token service (`keyward
// token-service`): it turns a pod-bound service-account token, validated
// with the apiserver (Reviewer), into a CNCF Distribution registry token
// holding only the scopes the policy grants, signed by the Active
// generation of an Authority's key (generations), and answers the kubelet
// credential provider plugin's question whether a service account may pull
// an image (docs/registry-credentials.md).
//
// Every replica serves; the one holding the Lease records reservations
// (the reservation keeper), writes the Authority's status and runs the
// companions it is given (the trust publisher).
package tokenservice

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/internal/httpserve"
	"github.com/keyward/keyward/kubeclient"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	phaserecord "github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/generations"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
)

// Options are what Run needs besides the configuration file.
type Options struct {
	Config   *config.TokenServiceConfiguration
	Backends *backends.Registry
	// Identity names this replica in the leader Lease (default hostname).
	Identity string
	// Ready, if set, receives the listeners' actual addresses once bound
	// (tests pass ":0" addresses): the HTTPS token endpoint, metrics,
	// health.
	Ready func(listenAddr, metricsAddr, healthAddr string)
	// AlsoLead are more controllers run while this replica holds the Lease,
	// as signer.Options.AlsoLead (env.SignerNames is [Config.SignerName]).
	// `keyward token-service` passes the trust publisher here unless the
	// configuration disables it (cmd/keyward/app.TokenServiceCompanions).
	AlsoLead []signer.Companion
}

// Timing of the reservation keeper.
const (
	// KeeperInterval is how often the leader reserves ahead.
	KeeperInterval = 30 * time.Second
	// KeeperRetry is how soon the leader tries again after a failed
	// reservation (at start the Authority objects are not read yet).
	KeeperRetry = time.Second
	// keeperAhead is how far past a token's lifetime the keeper reserves,
	// so that a non-leader's Reserve finds the reservation already made.
	keeperAhead = 5 * time.Minute
)

// complete returns a defaulted, validated deep copy of in: Run accepts a
// configuration built in code (tests) as well as one Load read.
func complete(in *config.TokenServiceConfiguration) (*config.TokenServiceConfiguration, error) {
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("copying the configuration: %w", err)
	}
	c := &config.TokenServiceConfiguration{}
	if err := json.Unmarshal(b, c); err != nil {
		return nil, fmt.Errorf("copying the configuration: %w", err)
	}
	c.Default()
	if errs := c.Validate(); len(errs) > 0 {
		return nil, fmt.Errorf("invalid token service configuration: %w", errs.ToAggregate())
	}
	return c, nil
}

// Run serves the token service until ctx ends or leadership is lost (an
// error: the process should exit and restart).
func Run(ctx context.Context, o Options) error {
	if o.Config == nil || o.Backends == nil {
		return errors.New("the token service needs a configuration and a backends registry")
	}
	cfg, err := complete(o.Config)
	if err != nil {
		return err
	}
	logger := klog.FromContext(ctx)
	pol, err := policy.New(cfg)
	if err != nil {
		return fmt.Errorf("building the token policy: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := NewMetrics(reg)
	if err != nil {
		return err
	}

	restCfg, err := kubeclient.Config(cfg.KubeClient.Kubeconfig, cfg.KubeClient.QPS, cfg.KubeClient.Burst)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	auths, err := authclient.New(restCfg)
	if err != nil {
		return err
	}
	inf := authclient.NewInformer(auths, 0)
	bundles := phaserecord.NewInformer(client, 0)
	gens, err := generations.New(generations.Options{
		Writer: auths, Informer: inf, Bundles: bundles,
		Signers: []generations.Policy{{Name: cfg.SignerName, MaxLifetime: cfg.TokenLifetime.Duration}},
		// Guarded as the signer's CA keys are: a hung backend call never
		// holds a request past its deadline, and /readyz reports a
		// backend that fails.
		Open: func(ctx context.Context, keyURI string) (backends.Signer, error) {
			opened, err := o.Backends.Open(ctx, backends.OpenRequest{URI: keyURI})
			if err != nil {
				return nil, err
			}
			key, err := signer.GuardKey(opened)
			if err != nil {
				_ = opened.Close()
				return nil, err
			}
			return key, nil
		},
	})
	if err != nil {
		return fmt.Errorf("reading the generations of %s: %w", cfg.SignerName, err)
	}
	iss := gens.Issuer(cfg.SignerName)

	// Forged tokens are refused with a local signature check, before they
	// take a review slot (the keys are fetched on the first token).
	keys, err := NewIssuerKeys(client.Discovery().RESTClient(), nil)
	if err != nil {
		return err
	}
	if keys.Prime(ctx) {
		logger.Info("Service-account issuer keys read: forged tokens are refused before any TokenReview")
	}
	reviewer, err := NewReviewer(ReviewerOptions{Client: client, Audience: cfg.Audience, CacheTTL: cfg.ReviewCacheTTL.Duration, Keys: keys, Metrics: metrics})
	if err != nil {
		return err
	}
	srv, err := NewServer(ServerOptions{Config: cfg, Policy: pol, Reviewer: reviewer, Issuer: iss, Metrics: metrics})
	if err != nil {
		return err
	}
	certs, err := newCertReloader(ctx, cfg.Listen.TLSCertFile, cfg.Listen.TLSKeyFile)
	if err != nil {
		return err
	}

	// Every replica reads the generations and keeps the keys open, so that
	// every replica signs and a failover needs no key opening. Not
	// cancelled with ctx: keys stay open until the HTTP server has
	// finished the requests it holds.
	gensCtx, stopGens := context.WithCancel(context.WithoutCancel(ctx))
	var gensDone sync.WaitGroup
	gensDone.Go(func() { inf.Run(gensCtx.Done()) })
	gensDone.Go(func() { bundles.Run(gensCtx.Done()) })
	gensDone.Go(func() {
		if err := gens.Run(gensCtx); err != nil {
			logger.Error(err, "Token-signing generations stopped")
		}
	})
	defer func() { stopGens(); gensDone.Wait() }()

	ready := func() error { return readiness(gens) }
	listenAddr, stopHTTPS, err := serveTLS(ctx, cfg.Listen.Address, srv.Handler(), certs)
	if err != nil {
		return err
	}
	defer stopHTTPS()
	var flushDone sync.WaitGroup
	flushCtx, stopFlush := context.WithCancel(ctx)
	flushDone.Go(func() {
		t := time.NewTicker(RefusalLogWindow)
		defer t.Stop()
		for {
			select {
			case <-flushCtx.Done():
				return
			case <-t.C:
				srv.FlushRefusals(flushCtx)
			}
		}
	})
	defer func() { stopFlush(); flushDone.Wait() }()
	alive := func() error { return signer.KeysAlive(gens.Keys()) }
	metricsAddr, healthAddr, stopServers, err := serveMetricsAndHealth(ctx, cfg, reg, ready, alive)
	if err != nil {
		return err
	}
	defer stopServers()
	logger.Info("Serving registry tokens", "address", listenAddr, "signer", cfg.SignerName, "audience", cfg.Audience,
		"issuer", cfg.Issuer, "registries", len(cfg.Registries), "tokenLifetime", cfg.TokenLifetime.Duration, "keyIdentifier", srv.keyID)
	if o.Ready != nil {
		o.Ready(listenAddr, metricsAddr, healthAddr)
	}

	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()

	lead := func(ctx context.Context) error {
		runs := []func(context.Context) error{gens.Lead, func(ctx context.Context) error {
			keepReserved(ctx, iss, cfg.TokenLifetime.Duration+keeperAhead, KeeperInterval, clock.RealClock{})
			return nil
		}}
		env := signer.LeadEnv{RestConfig: restCfg, Client: client, Metrics: reg, SignerNames: []string{cfg.SignerName}, Witness: gens.Witness,
			NewRecorder: func(component string) record.EventRecorder {
				return broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})
			}}
		for _, c := range o.AlsoLead {
			runs = append(runs, func(ctx context.Context) error { return c(ctx, env) })
		}
		return signer.LeadAll(ctx, runs)
	}
	leader := kubeclient.NewLeaderGauge(cfg.LeaderElection.LeaseName)
	if err := reg.Register(leader); err != nil {
		return fmt.Errorf("registering the leader gauge: %w", err)
	}
	lead = kubeclient.Leading(leader, lead)
	if e := cfg.LeaderElection.Enabled; e != nil && !*e {
		return lead(ctx)
	}
	le := cfg.LeaderElection
	return kubeclient.RunLeader(ctx, client, kubeclient.LeaderElection{
		Namespace: le.Namespace, Name: le.LeaseName, Identity: o.Identity,
		LeaseDuration: le.LeaseDuration.Duration, RenewDeadline: le.RenewDeadline.Duration, RetryPeriod: le.RetryPeriod.Duration,
	}, lead)
}

// keySource is what /readyz reads of generations.Manager.
type keySource interface {
	Err() error
	Keys() []backends.Signer
}

// readiness is nil when the signer name has an Active generation whose key is
// open and every open key's backend answered its last signature with no
// call stuck (signer.KeysReady, as the signer's /readyz).
func readiness(g keySource) error {
	if err := g.Err(); err != nil {
		return fmt.Errorf("no token-signing key: %w", err)
	}
	return signer.KeysReady(g.Keys())
}

// keepReserved reserves, now and every interval until ctx ends, the
// current generation's lifetime up to now+ahead, so that replicas not
// leading can sign (their Reserve succeeds only within what the leader
// recorded). A failed attempt is tried again after KeeperRetry; a failure
// is logged when a retry fails too (a new leader's first attempt usually
// fails: the Authority objects are not read yet) and when it ends.
func keepReserved(ctx context.Context, iss issuer.Issuer, ahead, interval time.Duration, clk clock.WithTicker) {
	logger := klog.FromContext(ctx)
	failures := 0
	for {
		err := func() error {
			_, gen, err := iss.Current()
			if err != nil {
				return err
			}
			return iss.Reserve(ctx, gen, clk.Now().Add(ahead))
		}()
		wait := interval
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			failures++
			if failures == 2 {
				logger.Error(err, "Cannot reserve ahead for the replicas that do not lead; they answer 503 until this works (logged once)")
			}
			wait = min(KeeperRetry, interval)
		case failures >= 2:
			logger.Info("Reserving ahead works again")
			failures = 0
		default:
			failures = 0
		}
		t := clk.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// serveTLS serves h on addr over TLS with certs; stop shuts it down (the
// requests in flight get 5 s).
func serveTLS(ctx context.Context, addr string, h http.Handler, certs *certReloader) (string, func(), error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	logger := klog.FromContext(ctx)
	base := klog.NewContext(context.Background(), logger)
	srv := &http.Server{
		Handler:           h,
		TLSConfig:         &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate},
		MaxHeaderBytes:    MaxHeaderBytes,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		BaseContext:       func(net.Listener) context.Context { return base },
		ErrorLog:          log.New(&serverErrorLog{logger: logger}, "", 0),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error(err, "Token endpoint stopped", "addr", ln.Addr().String())
		}
	}()
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = ln.Close()
		<-done
	}
	return ln.Addr().String(), stop, nil
}

// serverErrorLog takes net/http's own error lines into klog. Most are
// failed TLS handshakes: a plugin or containerd that does not trust the
// certificate fails one on every pull, so the first is logged at the
// default verbosity and the rest at -v=2, not one line per pull.
type serverErrorLog struct {
	logger    klog.Logger
	handshake sync.Once
}

func (l *serverErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	if !strings.HasPrefix(msg, "http: TLS handshake error") {
		l.logger.Info("HTTPS server error", "detail", msg)
		return len(p), nil
	}
	first := false
	l.handshake.Do(func() { first = true })
	if first {
		l.logger.Info("A client failed the TLS handshake; does it trust this certificate? (the first is logged, the rest at -v=2)", "detail", msg)
	} else {
		l.logger.V(2).Info("A client failed the TLS handshake", "detail", msg)
	}
	return len(p), nil
}

// serveMetricsAndHealth starts /metrics and /healthz, /readyz.
func serveMetricsAndHealth(ctx context.Context, cfg *config.TokenServiceConfiguration, reg *prometheus.Registry, ready, alive func() error) (string, string, func(), error) {
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := alive(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	addrs, stop, err := httpserve.Start(ctx, httpserve.Endpoint{Addr: cfg.MetricsAddress, Handler: metrics}, httpserve.Endpoint{Addr: cfg.HealthAddress, Handler: health})
	if err != nil {
		return "", "", nil, err
	}
	return addrs[0], addrs[1], stop, nil
}
