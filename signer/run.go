// Package signer runs keyward's signer: it turns a SignerConfiguration into
// profiles, the PodCertificateRequest and CertificateSigningRequest
// controllers, reads each signer
// name's CA generations from its Authority object (signer/generations),
// serves metrics and health, and issues only while it holds the leader
// Lease.
package signer

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/internal/httpserve"
	"github.com/keyward/keyward/kubeclient"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	phaserecord "github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
	"github.com/keyward/keyward/signer/generations"
	"github.com/keyward/keyward/signer/intermediate"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/signer/profile"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Options are what Run needs besides the configuration file.
type Options struct {
	Config   *config.SignerConfiguration
	Backends *backends.Registry
	// Identity names this replica in the leader Lease (default hostname).
	Identity string
	// PodCertificateVersion forces "v1" or "v1beta1"; empty means discover
	// (v1 preferred).
	PodCertificateVersion string
	// PermissionRecheck is how often a missing RBAC grant is looked for
	// again (default 30s; tests shorten it).
	PermissionRecheck time.Duration
	// Ready, if set, receives the listeners' actual addresses once bound
	// (tests pass ":0" addresses).
	Ready func(metricsAddr, healthAddr string)
	// AlsoLead are more controllers to run while this replica holds the
	// Lease (e.g. the trust publisher), each until its context ends, with
	// the signer's clients, Event broadcaster and metrics registry. An
	// error from one ends leading, as one from the PodCertificateRequest
	// controller does; returning nil early just ends that one.
	AlsoLead []Companion
}

// Companion is a controller run beside the signer's while it leads.
type Companion func(ctx context.Context, env LeadEnv) error

// LeadEnv is what a Companion shares with the signer.
type LeadEnv struct {
	RestConfig *rest.Config
	Client     kubernetes.Interface
	// NewRecorder records Events as component (rate-limited by client-go's
	// broadcaster, on the signer's Events client).
	NewRecorder func(component string) record.EventRecorder
	// Metrics is the registry /metrics serves. A Companion built anew for
	// each leadership term must tolerate registering twice.
	Metrics prometheus.Registerer
	// SignerNames are the configured signer names.
	SignerNames []string
	// Witness is the generations manager's own keyCheck and reservation
	// of a generation (generations.Manager.Witness), which the trust
	// publisher believes over the Authority's status.
	Witness func(signerName, generation string) (v1alpha1.KeyCheck, time.Time, bool)
}

// state is what /readyz reports.
type state struct {
	generations atomic.Pointer[generations.Manager]
	permissions atomic.Pointer[pcr.PermissionGate]
	leading     atomic.Bool
	standby     atomic.Bool
	controller  atomic.Pointer[pcr.Controller]
	csr         atomic.Pointer[csr.Controller]
	// wantPCR and wantCSR say which controllers run while leading.
	wantPCR, wantCSR atomic.Bool
}

// synced reports whether every controller that runs has synced its caches.
func (s *state) synced() bool {
	if s.wantPCR.Load() {
		if c := s.controller.Load(); c == nil || !c.HasSynced() {
			return false
		}
	}
	if s.wantCSR.Load() {
		if c := s.csr.Load(); c == nil || !c.HasSynced() {
			return false
		}
	}
	return true
}

// warm reports whether every controller's informers have synced, before
// leading (a standby ready to take over).
func (s *state) warm() bool {
	if s.wantPCR.Load() {
		if c := s.controller.Load(); c == nil || !c.Warm() {
			return false
		}
	}
	if s.wantCSR.Load() {
		if c := s.csr.Load(); c == nil || !c.Warm() {
			return false
		}
	}
	return true
}

// alive is nil unless a CA key has a backend call stuck for so long that
// only a restart is likely to help (/healthz, the liveness probe).
func (s *state) alive() error {
	return KeysAlive(s.keys())
}

// keys are the CA keys open now, of every generation kept open.
func (s *state) keys() []backends.Signer {
	g := s.generations.Load()
	if g == nil {
		return nil
	}
	return g.Keys()
}

// ready is nil when every signer name has an Active generation whose key
// is open, every open CA key's backend answered its last signature, and
// this replica either stands by or leads, with synced caches.
func (s *state) ready() error {
	g := s.generations.Load()
	if g == nil {
		return errors.New("CA generations not read yet")
	}
	if err := errors.Join(g.Err(), KeysReady(s.keys())); err != nil {
		return err
	}
	if g := s.permissions.Load(); g == nil {
		return errors.New("RBAC permissions not checked yet")
	} else if err := g.Err(); err != nil {
		return err
	}
	switch {
	case s.leading.Load():
		if !s.synced() {
			return errors.New("leading, caches not synced yet")
		}
		return nil
	case s.standby.Load():
		if !s.warm() {
			return errors.New("standing by, caches not synced yet")
		}
		return nil
	}
	return errors.New("leader election not decided yet")
}

// Run reads the CA generations of every signer name and keeps their keys
// open, and issues while leading, until ctx ends or leadership is lost (an
// error: the process should exit and restart).
func Run(ctx context.Context, o Options) error {
	cfg := o.Config
	logger := klog.FromContext(ctx)
	st := &state{}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := pcr.NewMetrics(reg)
	if err != nil {
		return err
	}
	metricsAddr, healthAddr, stopServers, err := serve(ctx, cfg, reg, st)
	if err != nil {
		return err
	}
	defer stopServers()
	if o.Ready != nil {
		o.Ready(metricsAddr, healthAddr)
	}

	restCfg, err := kubeclient.Config(cfg.KubeClient.Kubeconfig, cfg.KubeClient.QPS, cfg.KubeClient.Burst)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}

	// Every replica, leader or standby, reads the CA generations and keeps
	// their keys open, so that an activation (or a failover) needs no
	// restart and no key opening; every replica reports when its CAs
	// expire. Only the leader writes the Authority's status.
	gens, err := newGenerations(restCfg, cfg, o.Backends, metrics)
	if err != nil {
		return err
	}
	st.generations.Store(gens.Manager)
	// Not cancelled with ctx: the keys stay open until the controller has
	// finished the requests it is signing (the deferred stop runs after
	// RunLeader returned).
	gensCtx, stopGens := context.WithCancel(context.WithoutCancel(ctx))
	var gensDone sync.WaitGroup
	for _, inf := range gens.informers {
		gensDone.Go(func() { inf.Run(gensCtx.Done()) })
	}
	gensDone.Go(func() {
		if err := gens.Run(gensCtx); err != nil {
			logger.Error(err, "CA generations stopped")
		}
	})
	// Closes every key once no signature can use it any more (the
	// controller has returned).
	defer func() { stopGens(); gensDone.Wait() }()
	replica := o.Identity
	if replica == "" {
		replica, _ = os.Hostname()
	}
	// The fence of the Lease (docs/signer.md, "High availability") bounds
	// every signature: a leaf's, and an in-memory intermediate's.
	var fence *kubeclient.Fence
	if *cfg.LeaderElection.Enabled {
		fence = kubeclient.NewFence()
	}
	issuers := issuerEnv{replica: replica, logger: logger, metrics: metrics, fence: fence}
	signers, err := buildSigners(cfg, gens.Manager, issuers)
	if err != nil {
		return err
	}
	csrSigners, err := buildCSRSigners(cfg, gens.Manager, issuers)
	if err != nil {
		return err
	}
	st.wantPCR.Store(len(signers) > 0)
	st.wantCSR.Store(len(csrSigners) > 0)
	var version string
	if len(signers) > 0 {
		version = o.PodCertificateVersion
		if version == "" && cfg.PodCertificateRequestVersion != "" {
			version = cfg.PodCertificateRequestVersion
			served, err := kubeclient.ServesPodCertificates(client.Discovery(), version)
			if err != nil {
				return fmt.Errorf("checking podCertificateRequestVersion %s: %w", version, err)
			}
			if !served {
				return fmt.Errorf("podCertificateRequestVersion is %s, but the cluster does not serve PodCertificateRequests in certificates.k8s.io/%s", version, version)
			}
		}
		if version == "" {
			if version, err = kubeclient.PodCertificateVersion(client.Discovery()); err != nil {
				return err
			}
		}
		logger.Info("Serving PodCertificateRequests", "version", "certificates.k8s.io/"+version, "signers", len(signers))
	}
	if len(csrSigners) > 0 {
		logger.Info("Serving CertificateSigningRequests", "version", "certificates.k8s.io/v1", "signers", len(csrSigners))
	}

	// Every replica checks its grants, so that a missing one shows in
	// /readyz and the log before any request meets it; the gate keeps the
	// controllers from signing for a name they may not sign for.
	var names []string
	for _, s := range signers {
		names = append(names, s.Name)
	}
	for _, s := range csrSigners {
		names = append(names, s.Policy.Name)
	}
	gate := pcr.NewPermissionGate(client, names, clock.RealClock{}, func(name string, missing bool) {
		v := 0.0
		if missing {
			v = 1
		}
		metrics.PermissionMissing.WithLabelValues(name).Set(v)
	})
	gate.Required = pcr.RequiredPermissions(len(signers) > 0, len(csrSigners) > 0)
	if o.PermissionRecheck > 0 {
		gate.Recheck = o.PermissionRecheck
	}
	if err := gate.Check(ctx); err != nil {
		var missing *pcr.MissingPermissionError
		if !errors.As(err, &missing) {
			logger.Error(err, "Checking RBAC permissions; will check again")
		}
	}
	st.permissions.Store(gate)
	gateCtx, stopGate := context.WithCancel(ctx)
	gateDone := make(chan struct{})
	go func() { defer close(gateDone); gate.Run(gateCtx) }()
	defer func() { stopGate(); <-gateDone }()

	// Events have their own client and rate: a burst of Events never takes
	// the QPS that status writes need, and the rate (pcr.EventPolicy) stays
	// below this client's, so client-go's broadcaster never drops silently.
	eventsCfg := rest.CopyConfig(restCfg)
	eventsCfg.QPS, eventsCfg.Burst = float32(3*cfg.Events.PerSecond), int(30*cfg.Events.PerSecond)
	eventsClient, err := kubernetes.NewForConfig(eventsCfg)
	if err != nil {
		return err
	}
	// Not cancelled with ctx: workers finishing their last requests after a
	// shutdown began still record their Events; Shutdown, deferred, runs
	// once the controller has returned.
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	broadcaster.StartRecordingToSink(&countingSink{
		EventSink: &typedcorev1.EventSinkImpl{Interface: eventsClient.CoreV1().Events("")},
		failed:    metrics.EventWriteErrors,
	})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "keyward-signer"})

	// Every replica builds its controllers and starts their informers, so
	// that a standby takes over with warm caches; only the leader's
	// workers sign, each signature and status write bounded by the fence
	// of its Lease (the fence is made above, with the issuers).
	var runs []func(context.Context) error
	if len(signers) > 0 {
		c, err := pcr.New(pcr.Options{
			Client: client, Version: version, Signers: signers, Workers: cfg.Workers,
			FailAfter: cfg.FailAfter.Duration, Metrics: metrics, Permissions: gate, Recorder: recorder,
			EventPolicy: pcr.EventPolicy{Issued: cfg.Events.Issued, WarningsPerSecond: cfg.Events.PerSecond, NormalPerSecond: cfg.Events.PerSecond},
			Fence:       fenceOrNil(fence),
		})
		if err != nil {
			return fmt.Errorf("building the PodCertificateRequest controller: %w", err)
		}
		if err := c.Start(ctx); err != nil {
			return fmt.Errorf("starting the PodCertificateRequest informers: %w", err)
		}
		st.controller.Store(c)
		runs = append(runs, func(ctx context.Context) error {
			if err := c.Run(ctx); err != nil {
				return fmt.Errorf("running the PodCertificateRequest controller: %w", err)
			}
			return nil
		})
	}
	if len(csrSigners) > 0 {
		c, err := csr.New(csr.Options{Client: client, Signers: csrSigners, Workers: cfg.Workers,
			Permissions: gate, Recorder: recorder, EventsPerSecond: cfg.Events.PerSecond, Metrics: reg, Fence: fenceOrNil(fence)})
		if err != nil {
			return fmt.Errorf("building the CertificateSigningRequest controller: %w", err)
		}
		if err := c.Start(ctx); err != nil {
			return fmt.Errorf("starting the CertificateSigningRequest informers: %w", err)
		}
		st.csr.Store(c)
		runs = append(runs, func(ctx context.Context) error {
			if err := c.Run(ctx); err != nil {
				return fmt.Errorf("running the CertificateSigningRequest controller: %w", err)
			}
			return nil
		})
	}
	// lead issues until ctx ends. A controller that stops on its own is an
	// error: the replica gives up the Lease and exits rather than hold it
	// while issuing nothing.
	lead := func(ctx context.Context) error {
		runs := append([]func(context.Context) error{gens.Lead}, runs...)
		env := LeadEnv{RestConfig: restCfg, Client: client, Metrics: reg, SignerNames: names, Witness: gens.Witness,
			NewRecorder: func(component string) record.EventRecorder {
				return broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: component})
			}}
		for _, c := range o.AlsoLead {
			runs = append(runs, func(ctx context.Context) error { return c(ctx, env) })
		}
		return LeadAll(ctx, runs)
	}
	leader := kubeclient.NewLeaderGauge(cfg.LeaderElection.LeaseName)
	if err := reg.Register(leader); err != nil {
		return fmt.Errorf("registering the leader gauge: %w", err)
	}
	lead = kubeclient.Leading(leader, lead)
	if fence != nil {
		if err := reg.Register(kubeclient.NewFenceRefusals(cfg.LeaderElection.LeaseName, fence)); err != nil {
			return fmt.Errorf("registering the fence counter: %w", err)
		}
	}
	if !*cfg.LeaderElection.Enabled {
		st.leading.Store(true)
		return lead(ctx)
	}
	le := cfg.LeaderElection
	leaseClient, err := kubeclient.LeaseClient(restCfg, le.RetryPeriod.Duration)
	if err != nil {
		return err
	}
	return kubeclient.RunLeader(ctx, leaseClient, kubeclient.LeaderElection{
		Namespace: le.Namespace, Name: le.LeaseName, Identity: o.Identity,
		LeaseDuration: le.LeaseDuration.Duration, RenewDeadline: le.RenewDeadline.Duration, RetryPeriod: le.RetryPeriod.Duration,
		OnLeading: func() { st.standby.Store(false); st.leading.Store(true) },
		OnStandby: func() { st.standby.Store(true) },
		Fence:     fence,
	}, lead)
}

// fenceOrNil is fence as a pcr.Fence: nil (no fence) when there is none,
// not an interface holding a nil pointer.
func fenceOrNil(fence *kubeclient.Fence) pcr.Fence {
	if fence == nil {
		return nil
	}
	return fence
}

// countingSink counts failed Event write attempts (client-go retries a few
// times, then drops the Event without a trace). A Patch of an Event that
// expired is not a failure: client-go creates it again.
type countingSink struct {
	record.EventSink
	failed prometheus.Counter
}

func (c *countingSink) Create(e *corev1.Event) (*corev1.Event, error) {
	return c.count(c.EventSink.Create(e))
}

func (c *countingSink) Update(e *corev1.Event) (*corev1.Event, error) {
	return c.count(c.EventSink.Update(e))
}

func (c *countingSink) Patch(e *corev1.Event, data []byte) (*corev1.Event, error) {
	ev, err := c.EventSink.Patch(e, data)
	if apierrors.IsNotFound(err) {
		// The Event expired; client-go creates it anew (counted there).
		return ev, err
	}
	return c.count(ev, err)
}

func (c *countingSink) count(e *corev1.Event, err error) (*corev1.Event, error) {
	if err != nil {
		c.failed.Inc()
	}
	return e, err
}

// LeadAll runs each of runs until ctx ends; the first error cancels the
// others, and is returned once all have returned.
func LeadAll(ctx context.Context, runs []func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, run := range runs {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				once.Do(func() { first = err; cancel() })
			}
		})
	}
	wg.Wait()
	return first
}

// runningGenerations is the generations manager with the informers it
// reads (Authorities, and the trust publisher's ClusterTrustBundles).
type runningGenerations struct {
	*generations.Manager
	informers []interface{ Run(<-chan struct{}) }
}

// newGenerations builds the Authority client, informer and generations
// manager. Keys are opened through reg and guarded by a healthKey each, so
// that /readyz and the hung-call guard cover every generation.
func newGenerations(restCfg *rest.Config, cfg *config.SignerConfiguration, reg *backends.Registry, metrics *pcr.Metrics) (*runningGenerations, error) {
	ac, err := authclient.New(restCfg)
	if err != nil {
		return nil, err
	}
	kc, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	inf := authclient.NewInformer(ac, 0)
	bundles := phaserecord.NewInformer(kc, 0)
	var policies []generations.Policy
	for _, sc := range cfg.Signers {
		policies = append(policies, generations.Policy{Name: sc.Name, MaxLifetime: sc.MaxLifetime.Duration})
	}
	m, err := generations.New(generations.Options{
		Writer: ac, Informer: inf, Bundles: bundles, Signers: policies, CANotAfter: metrics.CANotAfter,
		Open: func(ctx context.Context, keyURI string) (backends.Signer, error) {
			opened, err := reg.Open(ctx, backends.OpenRequest{URI: keyURI})
			if err != nil {
				return nil, err
			}
			// The sign metrics count calls that reached the backend,
			// nothing else (the guard observes exactly those).
			key, err := newHealthKey(opened, keyOptions{Clock: clock.RealClock{}, Observer: func(backend string, d time.Duration, err error) {
				metrics.ObserveSign(backend, d.Seconds(), err)
			}})
			if err != nil {
				_ = opened.Close()
				return nil, err
			}
			return key, nil
		},
	})
	if err != nil {
		return nil, err
	}
	return &runningGenerations{Manager: m, informers: []interface{ Run(<-chan struct{}) }{inf, bundles}}, nil
}

// buildCSRSigners builds the policy of each signer name with a CSR
// profile; it issues through the same Issuer a PodCertificateRequest
// signer name would.
func buildCSRSigners(cfg *config.SignerConfiguration, gens *generations.Manager, env issuerEnv) ([]*csr.Signer, error) {
	var out []*csr.Signer
	for _, sc := range cfg.Signers {
		if !config.IsCSRProfile(sc.Profile) {
			continue
		}
		p, err := csr.NewPolicy(sc)
		if err != nil {
			return nil, err
		}
		iss, err := env.issuerFor(sc, gens)
		if err != nil {
			return nil, err
		}
		out = append(out, &csr.Signer{Policy: p, Issuer: iss})
	}
	return out, nil
}

// buildSigners builds the policy of each signer name with a
// PodCertificateRequest profile; its CA comes from gens.
func buildSigners(cfg *config.SignerConfiguration, gens *generations.Manager, env issuerEnv) ([]*pcr.Signer, error) {
	var out []*pcr.Signer
	for _, sc := range cfg.Signers {
		if config.IsCSRProfile(sc.Profile) {
			continue
		}
		prof, err := profile.New(sc)
		if err != nil {
			return nil, err
		}
		iss, err := env.issuerFor(sc, gens)
		if err != nil {
			return nil, err
		}
		out = append(out, &pcr.Signer{
			Name: sc.Name, Issuer: iss, Profile: prof,
			AllowedKeyTypes: sc.AllowedKeyTypes, MaxLifetime: sc.MaxLifetime.Duration,
			RefreshPoint: *sc.RefreshPoint, Backdate: sc.Backdate.Duration,
			Annotations: sc.UnverifiedUserAnnotations,
			PerNode:     sc.RateLimits.PerNode, PerNamespace: sc.RateLimits.PerNamespace,
			DenyOnLimit: sc.RateLimits.OnLimit == "deny",
		})
	}
	return out, nil
}

// issuerEnv is what an in-memory intermediate needs besides its signer
// name's configuration.
type issuerEnv struct {
	replica string
	logger  klog.Logger
	metrics *pcr.Metrics
	// fence, if set, bounds the CA key's signature of each intermediate.
	fence *kubeclient.Fence
}

// issuerFor is the Issuer of signer name sc: its CA generations', or,
// with signers[].intermediate enabled, an in-memory intermediate of this
// replica under them.
func (e issuerEnv) issuerFor(sc config.Signer, gens *generations.Manager) (issuer.Issuer, error) {
	in := sc.Intermediate
	if in == nil || !in.Enabled {
		return gens.Issuer(sc.Name), nil
	}
	iss, err := intermediate.New(gens.Issuer(sc.Name), intermediate.Options{
		SignerName: sc.Name, Replica: e.replica,
		Validity: in.Validity.Duration, RenewBefore: in.RenewBefore.Duration, MaxLifetime: sc.MaxLifetime.Duration,
		Backdate: sc.Backdate.Duration, Logger: e.logger, Bound: e.fence.Bound,
		Observe: func(cert *x509.Certificate, err error) {
			if err != nil {
				e.metrics.IntermediateSigned.WithLabelValues(sc.Name, "failed").Inc()
				return
			}
			e.metrics.IntermediateSigned.WithLabelValues(sc.Name, "signed").Inc()
			e.metrics.IntermediateNotAfter.WithLabelValues(sc.Name).Set(float64(cert.NotAfter.Unix()))
		},
	})
	if err != nil {
		return nil, err
	}
	e.logger.Info("Leaves are signed by an in-memory intermediate CA", "signer", sc.Name, "replica", e.replica,
		"validity", in.Validity.Duration, "renewBefore", in.RenewBefore.Duration)
	return iss, nil
}

// serve starts the metrics and health listeners.
func serve(ctx context.Context, cfg *config.SignerConfiguration, reg *prometheus.Registry, st *state) (string, string, func(), error) {
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if err := st.alive(); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := st.ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if cfg.Profiling {
		metrics.HandleFunc("/debug/pprof/", pprof.Index)
		metrics.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		metrics.HandleFunc("/debug/pprof/profile", pprof.Profile)
		metrics.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		metrics.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}

	addrs, stop, err := httpserve.Start(ctx, httpserve.Endpoint{Addr: cfg.MetricsAddress, Handler: metrics}, httpserve.Endpoint{Addr: cfg.HealthAddress, Handler: health})
	if err != nil {
		return "", "", nil, err
	}
	return addrs[0], addrs[1], stop, nil
}
