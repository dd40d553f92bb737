// Package kubeclient builds Kubernetes clients for keyward, discovers which
// certificates.k8s.io version serves PodCertificateRequests, and runs code
// under leader election.
package kubeclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"
)

// Config builds a rest.Config from kubeconfig (empty: in-cluster) with the
// given QPS and burst and keyward's user agent. It speaks protobuf (JSON
// accepted), which only built-in types support: a client for custom
// resources must use a copy with ContentType "application/json". Each
// distinct warning from the apiserver (e.g. that v1beta1 is deprecated) is
// logged once per Config, not once per request.
func Config(kubeconfig string, qps float32, burst int) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (set kubeClient.kubeconfig to run outside a cluster): %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.QPS, cfg.Burst = qps, burst
	cfg.UserAgent = "keyward"
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	cfg.WarningHandler = nil
	cfg.WarningHandlerWithContext = &onceWarnings{seen: map[string]bool{}}
	return cfg, nil
}

// maxWarnings bounds how many distinct warnings onceWarnings remembers;
// beyond it, new ones are logged only at verbosity 4.
const maxWarnings = 64

// onceWarnings logs each distinct apiserver warning once. client-go's
// default logs every occurrence: reading through a deprecated version, that
// is one line per request.
type onceWarnings struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (w *onceWarnings) HandleWarningHeaderWithContext(ctx context.Context, code int, _ string, text string) {
	if code != 299 || text == "" {
		return
	}
	w.mu.Lock()
	first, full := !w.seen[text], len(w.seen) >= maxWarnings
	if first && !full {
		w.seen[text] = true
	}
	w.mu.Unlock()
	switch {
	case first && !full:
		klog.FromContext(ctx).Info("Warning from kube-apiserver (logged once)", "warning", text)
	case first:
		klog.FromContext(ctx).V(4).Info("Warning from kube-apiserver", "warning", text)
	}
}

// ErrNoPodCertificates means the cluster serves PodCertificateRequests in no
// version keyward speaks.
var ErrNoPodCertificates = errors.New("cluster serves no PodCertificateRequest API (certificates.k8s.io v1 or v1beta1)")

// PodCertificateVersion returns the certificates.k8s.io version to read
// PodCertificateRequests through: "v1beta1" whenever it serves them, because
// only v1beta1 shows both key forms (stubPKCS10Request, and the
// pkixPublicKey + proofOfPossession that kubelets before 1.37 create while
// an upgrade keeps v1beta1 served); else "v1". A group version the server
// does not serve (404) is skipped; any other discovery error is returned,
// so that a flaky apiserver never silently selects a version that hides
// requests.
func PodCertificateVersion(d discovery.DiscoveryInterface) (string, error) {
	for _, v := range []string{"v1beta1", "v1"} {
		served, err := ServesPodCertificates(d, v)
		if err != nil {
			return "", err
		}
		if served {
			return v, nil
		}
	}
	return "", ErrNoPodCertificates
}

// ServesPodCertificates reports whether the cluster serves
// podcertificaterequests and their status in certificates.k8s.io/version.
// A group version the server does not serve (404) is false, not an error.
func ServesPodCertificates(d discovery.DiscoveryInterface, version string) (bool, error) {
	gv := "certificates.k8s.io/" + version
	list, err := d.ServerResourcesForGroupVersion(gv)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("discovering %s: %w", gv, err)
	}
	names := sets.New[string]()
	for _, r := range list.APIResources {
		names.Insert(r.Name)
	}
	return names.Has("podcertificaterequests") && names.Has("podcertificaterequests/status"), nil
}

// LeaseClient is a client for the Lease alone: a renewal queued behind a
// burst of other requests in a shared client's rate limiter would lose the
// Lease. Its rate allows a write every retryPeriod with room to spare.
func LeaseClient(cfg *rest.Config, retryPeriod time.Duration) (kubernetes.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.QPS, c.Burst = 10, 20
	if retryPeriod > 0 {
		c.QPS = max(c.QPS, float32(4*time.Second/retryPeriod))
	}
	return kubernetes.NewForConfig(c)
}

// LeaderElection configures RunOrDie's Lease.
type LeaderElection struct {
	Namespace, Name string
	// Identity is this replica's name in the Lease (default: hostname + a
	// random suffix).
	Identity                                  string
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// OnLeading and OnStandby report the state, e.g. to /readyz.
	OnLeading, OnStandby func()
	// Fence, when set, follows this replica's Lease writes: what lead
	// signs it bounds by Fence.Bound, so that nothing is signed once a
	// standby may have taken over (a partition, a paused process).
	Fence *Fence
}

// RunLeader runs lead while this replica holds the Lease. When leadership is
// lost, lead's context is canceled and RunLeader returns an error: the
// caller exits, so no two replicas ever issue at once. When lead returns
// before its context ends (it failed, or stopped on its own), the Lease is
// released and RunLeader returns lead's error, so a standby takes over. It
// returns nil when ctx ends. In every case it returns only after lead has
// returned, so that the caller may close what lead uses (keys, event sinks).
func RunLeader(ctx context.Context, client kubernetes.Interface, le LeaderElection, lead func(context.Context) error) error {
	id := le.Identity
	if id == "" {
		host, _ := os.Hostname()
		id = fmt.Sprintf("%s_%d", host, time.Now().UnixNano())
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, le.Namespace, le.Name,
		client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return fmt.Errorf("creating lease lock: %w", err)
	}
	if le.Fence != nil {
		// A standby waits the Lease record's whole seconds, not
		// LeaseDuration: the fence must shut before that.
		if whole := le.LeaseDuration.Truncate(time.Second); le.RenewDeadline >= whole {
			return fmt.Errorf("lease duration %s (%s in the Lease record) must exceed the renew deadline %s", le.LeaseDuration, whole, le.RenewDeadline)
		}
		lock = &fencedLock{Interface: lock, fence: le.Fence, renewDeadline: le.RenewDeadline}
		defer le.Fence.close()
	}
	logger := klog.FromContext(ctx).WithValues("lease", le.Namespace+"/"+le.Name, "identity", id)
	lost := make(chan struct{})
	// client-go starts OnStartedLeading in a goroutine and does not wait
	// for it; running tracks it, and stopped keeps a call that starts after
	// the elector has returned from running lead at all.
	var (
		mu      sync.Mutex
		stopped bool
		leading bool
		leadErr error
		running sync.WaitGroup
	)
	// The elector runs on its own context: when ctx ends while leading, the
	// Lease is kept (and renewed) until lead has returned, and only then
	// released, so that no standby issues while lead finishes the requests
	// it holds. When ctx ends while standing by, the elector stops at once.
	electCtx, stopElecting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopElecting()
	stopWhenDone := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !leading {
			stopElecting()
		}
	})
	defer stopWhenDone()
	elector, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock:            lock,
		LeaseDuration:   le.LeaseDuration,
		RenewDeadline:   le.RenewDeadline,
		RetryPeriod:     le.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            le.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(electedCtx context.Context) {
				mu.Lock()
				if stopped || ctx.Err() != nil {
					mu.Unlock()
					stopElecting()
					return
				}
				leading = true
				running.Add(1)
				mu.Unlock()
				defer running.Done()
				logger.Info("Leading")
				if le.OnLeading != nil {
					le.OnLeading()
				}
				// lead's context ends when the Lease is lost or ctx ends.
				leadCtx, cancelLead := context.WithCancel(electedCtx)
				defer cancelLead()
				stopLead := context.AfterFunc(ctx, cancelLead)
				defer stopLead()
				err := lead(leadCtx)
				if electedCtx.Err() == nil && ctx.Err() == nil {
					if err == nil {
						err = errors.New("stopped while still leading")
					}
					mu.Lock()
					leadErr = err
					mu.Unlock()
				}
				// lead has returned: release the Lease (ReleaseOnCancel).
				stopElecting()
			},
			OnStoppedLeading: func() {
				if le.Fence != nil {
					le.Fence.close()
				}
				close(lost)
			},
			OnNewLeader: func(identity string) {
				if identity != id {
					logger.Info("Standing by", "leader", identity)
					if le.OnStandby != nil {
						le.OnStandby()
					}
				}
			},
		},
	})
	if err != nil {
		return fmt.Errorf("configuring leader election: %w", err)
	}
	elector.Run(electCtx)
	<-lost
	mu.Lock()
	stopped = true
	mu.Unlock()
	running.Wait()
	switch {
	case leadErr != nil:
		return fmt.Errorf("leading: %w", leadErr)
	case ctx.Err() != nil:
		return nil
	}
	return errors.New("lost leadership")
}
