package trustpublisher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/internal/workers"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	phaserecord "github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ManagedByLabel and ManagedByValue mark the ClusterTrustBundles the trust
// publisher owns; its informer watches only those.
const (
	ManagedByLabel = phaserecord.ManagedByLabel
	ManagedByValue = phaserecord.ManagedByValue
)

// Event reasons recorded on an Authority.
const (
	EventGateOverridden  = "GateOverridden"
	EventOverrideStale   = "OverrideStale"
	EventOverrideInvalid = "OverrideInvalid"
	EventBundlePublished = "BundlePublished"
	// EventPropagationWindowShort: spec.gates.propagationWindow is shorter
	// than MinPropagationWindow of Options.KubeletSyncFrequency.
	EventPropagationWindowShort = "PropagationWindowShort"
)

const (
	defaultResync        = 10 * time.Minute
	defaultHealthTimeout = 5 * time.Second
	defaultInterval      = 10 * time.Second
	// maxRetry caps the backoff of a failing sync (e.g. a missing grant).
	maxRetry = 5 * time.Minute
)

// Options configure New.
type Options struct {
	// Client writes ClusterTrustBundles, lists pods for canaryHealth.pods
	// and asks SelfSubjectAccessReviews when a write is forbidden.
	Client kubernetes.Interface
	// Authorities reads Authority objects and applies their status.
	Authorities *authclient.Client
	// SignerNames are the signer names the controller acts for; an
	// Authority for any other name is ignored (logged once). Required.
	SignerNames []string
	// Clock defaults to the real clock.
	Clock clock.WithTicker
	// Recorder, if set, gets Events on Authorities.
	Recorder record.EventRecorder
	// Metrics, if set, is where the controller's series are registered.
	Metrics prometheus.Registerer
	// HTTPClient checks canaryHealth.url (default: 5s timeout).
	HTTPClient *http.Client
	// Workers (default 1) and Resync (default 10m) of the informers.
	Workers int
	Resync  time.Duration
	// KubeletSyncFrequency is the cluster's longest kubelet syncFrequency
	// (default 1m, kubelet's own): a propagationWindow shorter than
	// MinPropagationWindow of it is reported (PropagationWindowSafe).
	KubeletSyncFrequency time.Duration
	// Witness, if set, is what the signer in this process itself knows of
	// a generation: its keyCheck (ok false: none) and its latest known
	// reservation. The gates then take the key check from it, never from
	// status, and the leaves' expiry as the later of the two: a status
	// write by another identity can neither open KeyNotReady nor shorten
	// LeavesValid.
	Witness func(signerName, generation string) (kc v1alpha1.KeyCheck, reserved time.Time, ok bool)
}

// authorityWriter is what sync writes through (authclient.Client in
// production, a recorder in unit tests).
type authorityWriter interface {
	ApplyStatus(ctx context.Context, name string, status any, fieldManager string) (*v1alpha1.Authority, error)
	Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*v1alpha1.Authority, error)
}

// Controller moves Authorities through their rotation and publishes their
// ClusterTrustBundles. Build it with New, run it with Run.
type Controller struct {
	opts        Options
	clock       clock.WithTicker
	writer      authorityWriter
	authorities cache.SharedIndexInformer
	bundles     cache.SharedIndexInformer
	queue       workqueue.TypedRateLimitingInterface[string]
	signers     map[string]bool
	metrics     *metrics

	mu sync.Mutex
	// ignored: Authorities whose signer name is not ours, logged once.
	ignored map[string]bool
	// health: the latest canary health result per Authority.
	health map[string]healthResult
	// publishErr: the latest bundle write failure per Authority (its
	// condition reason and message), logged once per change.
	publishErr map[string]publishFailure
	// syncErr: the message of the latest failed sync per Authority,
	// logged once per change.
	syncErr map[string]string
	// noAPI: the latest Authority list was answered 404 (no CRD).
	noAPI atomic.Bool
	// staleRV: the resourceVersion an Authority had when this controller
	// last wrote it. Until the cache holds a newer version, a sync would
	// act on a state the controller itself has already moved past (and,
	// say, report an override twice), so it waits for the watch instead.
	staleRV map[string]string
	// pending: per Authority, the phases this controller last applied
	// (by generation), which its record on the bundles may not hold yet.
	pending map[string]map[string]phaserecord.Entry
	// windowWarned: per Authority, the propagationWindow last warned of
	// as too short (a Warning Event and a log line once per value).
	windowWarned map[string]time.Duration
	// reported: per Authority, the findings already reported, by
	// generation (record.Verify), so each is reported once.
	reported map[string]map[string]string
}

// New validates opts and builds a Controller. It starts nothing.
func New(opts Options) (*Controller, error) {
	if opts.Client == nil {
		return nil, errors.New("trustpublisher: Options.Client is required")
	}
	if opts.Authorities == nil {
		return nil, errors.New("trustpublisher: Options.Authorities is required")
	}
	if len(opts.SignerNames) == 0 {
		return nil, errors.New("trustpublisher: Options.SignerNames is empty: the controller would act for no signer")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{Timeout: defaultHealthTimeout}
	}
	if opts.Workers <= 0 {
		opts.Workers = 1
	}
	if opts.Resync <= 0 {
		opts.Resync = defaultResync
	}
	m, err := newMetrics(opts.Metrics)
	if err != nil {
		return nil, err
	}
	c := newController(opts, opts.Authorities, authclient.NewInformer(opts.Authorities, opts.Resync), m)
	// Fails only once the informer runs; it has not.
	if err := c.authorities.SetWatchErrorHandlerWithContext(c.watchError); err != nil {
		return nil, fmt.Errorf("handling the Authority informer's watch errors: %w", err)
	}
	c.bundles = phaserecord.NewInformer(opts.Client, opts.Resync)
	return c, nil
}

func newController(opts Options, w authorityWriter, authorities cache.SharedIndexInformer, m *metrics) *Controller {
	if opts.KubeletSyncFrequency <= 0 {
		opts.KubeletSyncFrequency = DefaultKubeletSyncFrequency
	}
	signers := map[string]bool{}
	for _, s := range opts.SignerNames {
		signers[s] = true
	}
	return &Controller{
		opts:        opts,
		clock:       opts.Clock,
		writer:      w,
		authorities: authorities,
		signers:     signers,
		metrics:     m,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, maxRetry),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "keyward-trustpublisher", Clock: opts.Clock}),
		ignored:    map[string]bool{},
		health:     map[string]healthResult{},
		publishErr: map[string]publishFailure{},
		syncErr:    map[string]string{},
		staleRV:    map[string]string{},
		pending:    map[string]map[string]phaserecord.Entry{},
		reported:   map[string]map[string]string{},

		windowWarned: map[string]time.Duration{},
	}
}

// Run starts the informers and workers and blocks until ctx is done. It
// may be called once: for each leadership term build a new Controller
// (New accepts the same Metrics registry again).
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)

	if _, err := c.authorities.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueAuthority(obj) },
		UpdateFunc: func(_, obj any) { c.enqueueAuthority(obj) },
		DeleteFunc: func(obj any) { c.enqueueAuthority(obj) },
	}); err != nil {
		return fmt.Errorf("watching Authorities: %w", err)
	}
	if _, err := c.bundles.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { c.enqueueBundle(obj) },
		UpdateFunc: func(_, obj any) { c.enqueueBundle(obj) },
		DeleteFunc: func(obj any) { c.enqueueBundle(obj) },
	}); err != nil {
		return fmt.Errorf("watching ClusterTrustBundles: %w", err)
	}
	go c.authorities.RunWithContext(ctx)
	go c.bundles.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.authorities.HasSynced, c.bundles.HasSynced) {
		return fmt.Errorf("waiting for the Authority and ClusterTrustBundle caches: %w", ctx.Err())
	}
	logger.Info("Trust publisher started", "signers", c.opts.SignerNames)
	workers.Run(ctx, c.opts.Workers, c.queue, c.processNext)
	return nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	err := c.sync(ctx, key)
	c.logSyncResult(ctx, key, err)
	if err == nil {
		c.queue.Forget(key)
		return true
	}
	c.queue.AddRateLimited(key)
	return true
}

// logSyncResult logs a failed sync once per change of its message (a
// refused status write is retried with backoff, up to every 5 minutes,
// for as long as it lasts), and the first success after one.
func (c *Controller) logSyncResult(ctx context.Context, key string, err error) {
	logger := klog.FromContext(ctx)
	var r reportedError
	reported := errors.As(err, &r) // sync logged it, and logs its recovery
	c.mu.Lock()
	prev, had := c.syncErr[key]
	if err == nil || reported {
		delete(c.syncErr, key)
	} else {
		c.syncErr[key] = err.Error()
	}
	c.mu.Unlock()
	switch {
	case err == nil:
		if had {
			logger.Info("Syncing Authority works again", "authority", key, "after", prev)
		}
	case reported, had && prev == err.Error():
		// Logged already (by sync, or by the previous attempt); retried
		// with backoff.
		logger.V(4).Info("Retrying Authority", "authority", key, "err", err)
	default:
		logger.Error(err, "Syncing Authority; will retry with backoff (logged again only if the error changes)", "authority", key)
	}
}

// reportedError is a sync failure sync has already logged (once per
// change); the worker only retries it.
type reportedError struct{ err error }

func (e reportedError) Error() string { return e.err.Error() }
func (e reportedError) Unwrap() error { return e.err }

func (c *Controller) enqueueAuthority(obj any) {
	c.noAPI.Store(false) // served again
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	a, ok := obj.(*v1alpha1.Authority)
	if !ok {
		return
	}
	c.queue.Add(a.Name)
	// Another Authority naming the same signer is in or out of conflict.
	peers, _ := authclient.BySignerName(c.authorities, a.Spec.SignerName)
	for _, p := range peers {
		if p.Name != a.Name {
			c.queue.Add(p.Name)
		}
	}
}

func (c *Controller) enqueueBundle(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	b, ok := obj.(*certv1.ClusterTrustBundle)
	if !ok {
		return
	}
	peers, _ := authclient.BySignerName(c.authorities, b.Spec.SignerName)
	for _, p := range peers {
		c.queue.Add(p.Name)
	}
}

// ignore logs once that an Authority names a signer this controller does
// not act for.
func (c *Controller) ignore(ctx context.Context, a *v1alpha1.Authority) {
	c.mu.Lock()
	seen := c.ignored[a.Name]
	c.ignored[a.Name] = true
	c.mu.Unlock()
	if !seen {
		klog.FromContext(ctx).Info("Ignoring Authority: its signer name is not one this signer serves",
			"authority", a.Name, "signerName", a.Spec.SignerName, "served", c.opts.SignerNames)
	}
}

// signerNames returns the served names, sorted (for messages).
func (c *Controller) signerNames() []string {
	out := make([]string, 0, len(c.signers))
	for s := range c.signers {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// watchError says once, in words, that the cluster does not serve
// Authorities (a 404 to the list: the CRD is missing), instead of
// client-go's "Failed to watch" at every retry; other errors go to
// client-go's handler. The flag clears when an Authority event arrives.
func (c *Controller) watchError(ctx context.Context, r *cache.Reflector, err error) {
	if !apierrors.IsNotFound(err) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		return
	}
	if !c.noAPI.Swap(true) {
		klog.FromContext(ctx).Error(err, "Nothing is published: the cluster does not serve Authorities (authorities.keyward.dev); install the CRD (kubectl apply -f deploy/crds/); retrying quietly")
	}
}
