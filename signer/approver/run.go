package approver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/internal/httpserve"
	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/signer/config"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
)

// DefaultLeaseName is the approver's own Lease: it never shares the
// signer's, so that the two run (and fail over) independently.
const DefaultLeaseName = "keyward-approver"

// RunOptions are what Run needs.
type RunOptions struct {
	// Config is the signer configuration; the approver reads its
	// kubeClient, workers, leaderElection (except the Lease name) and
	// signers, and opens no keys.
	Config *config.SignerConfiguration
	// Identity names this replica in the Lease (default hostname).
	Identity string
	// LeaseName defaults to DefaultLeaseName.
	LeaseName string
	// MetricsAddress and HealthAddress default to the configuration's.
	MetricsAddress, HealthAddress string
	// NodeWait: see Options.NodeWait.
	NodeWait time.Duration
	// Ready, if set, receives the listeners' actual addresses once bound.
	Ready func(metricsAddr, healthAddr string)
}

// Run approves CSRs while this replica holds the approver's Lease, and
// serves /healthz, /readyz and /metrics, until ctx ends or leadership is
// lost (an error: the process should exit and restart).
func Run(ctx context.Context, o RunOptions) error {
	cfg := o.Config
	if o.LeaseName == "" {
		o.LeaseName = DefaultLeaseName
	}
	if o.MetricsAddress == "" {
		o.MetricsAddress = cfg.MetricsAddress
	}
	if o.HealthAddress == "" {
		o.HealthAddress = cfg.HealthAddress
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
	broadcaster := record.NewBroadcaster(record.WithContext(context.WithoutCancel(ctx)))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "keyward-approver"})
	// Built before leading so that a configuration with nothing to approve
	// fails at once.
	if _, err := New(Options{Client: client, Signers: cfg.Signers, Metrics: metrics}); err != nil {
		return err
	}

	var st runState
	metricsAddr, healthAddr, stop, err := serveHTTP(ctx, o.MetricsAddress, o.HealthAddress, reg, &st)
	if err != nil {
		return err
	}
	defer stop()
	if o.Ready != nil {
		o.Ready(metricsAddr, healthAddr)
	}

	lead := func(ctx context.Context) error {
		// Decisions counters survive leadership terms: one Metrics.
		c, err := New(Options{Client: client, Signers: cfg.Signers, Workers: cfg.Workers, NodeWait: o.NodeWait, Metrics: metrics, Recorder: recorder})
		if err != nil {
			return err
		}
		st.controller.Store(c)
		klog.FromContext(ctx).Info("Approving CertificateSigningRequests", "signers", c.SignerNames())
		if err := c.Run(ctx); err != nil {
			return fmt.Errorf("running the approver: %w", err)
		}
		return nil
	}
	leader := kubeclient.NewLeaderGauge(o.LeaseName)
	if err := reg.Register(leader); err != nil {
		return fmt.Errorf("registering the leader gauge: %w", err)
	}
	lead = kubeclient.Leading(leader, lead)
	le := cfg.LeaderElection
	if !*le.Enabled {
		st.leading.Store(true)
		return lead(ctx)
	}
	leaseClient, err := kubeclient.LeaseClient(restCfg, le.RetryPeriod.Duration)
	if err != nil {
		return err
	}
	return kubeclient.RunLeader(ctx, leaseClient, kubeclient.LeaderElection{
		Namespace: le.Namespace, Name: o.LeaseName, Identity: o.Identity,
		LeaseDuration: le.LeaseDuration.Duration, RenewDeadline: le.RenewDeadline.Duration, RetryPeriod: le.RetryPeriod.Duration,
		OnLeading: func() { st.standby.Store(false); st.leading.Store(true) },
		OnStandby: func() { st.standby.Store(true) },
	}, lead)
}

// runState is what /readyz reports.
type runState struct {
	leading, standby atomic.Bool
	controller       atomic.Pointer[Controller]
}

// ready is nil when this replica stands by, or leads with synced caches.
func (s *runState) ready() error {
	switch {
	case s.leading.Load():
		if c := s.controller.Load(); c == nil || !c.HasSynced() {
			return errors.New("leading, caches not synced yet")
		}
		return nil
	case s.standby.Load():
		return nil
	}
	return errors.New("leader election not decided yet")
}

// serveHTTP starts the metrics and health listeners (the approver holds no
// keys: /healthz is ok while the process serves).
func serveHTTP(ctx context.Context, metricsAddr, healthAddr string, reg *prometheus.Registry, st *runState) (string, string, func(), error) {
	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	health.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := st.ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	addrs, stop, err := httpserve.Start(ctx, httpserve.Endpoint{Addr: metricsAddr, Handler: metrics}, httpserve.Endpoint{Addr: healthAddr, Handler: health})
	if err != nil {
		return "", "", nil, err
	}
	return addrs[0], addrs[1], stop, nil
}
