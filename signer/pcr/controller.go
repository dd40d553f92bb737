// Package pcr is keyward's PodCertificateRequest controller. It watches only
// the signer names it owns (a spec.signerName field selector per name),
// writes only through /status, and brings each request to exactly one
// terminal condition: Issued, Denied (a policy refusal) or Failed (a
// permanent backend error, or a CA-key outage longer than FailAfter).
// Transient errors are retried with capped backoff and never become Failed
// by default, because kubelet treats Failed as permanent. A replica signs
// once per request and writes that certificate again after a transient
// failure; it signs again only when kube-apiserver refused the
// certificate (its notBefore outside the window, once per clock-skew pause
// while that lasts) or the signature was cut off at the Lease's fence.
// After a failover the next leader signs what the last one had signed but
// not written (docs/signer.md, "High availability").
package pcr

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/internal/workers"
	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/profile"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Condition reasons keyward writes besides the apiserver's own
// UnsupportedKeyType and InvalidUnverifiedUserAnnotations.
const (
	ReasonIssued             = "Issued"
	ReasonRateLimited        = "RateLimited"
	ReasonInvalidRequest     = "InvalidRequest"
	ReasonUnsupportedKeyType = "UnsupportedKeyType"
	ReasonBackendFailure     = "BackendFailure"
	ReasonSignerUnavailable  = "SignerUnavailable"
	// ReasonStatusRejected: kube-apiserver refused the Issued status for a
	// reason signing again cannot cure.
	ReasonStatusRejected = "StatusRejected"
)

// Event reasons besides the condition reasons.
const (
	EventSigningDelayed    = "SigningDelayed"
	EventPermissionMissing = "PermissionMissing"
	EventStatusRejected    = "StatusRejected"
	EventClockSkew         = "ClockSkew"
)

// Limits kube-apiserver puts on an issued certificate.
const (
	refreshMargin    = 10 * time.Minute
	defaultMaxExpiry = 86400
)

// Waits of requests that cannot go on now.
const (
	// permissionWait: a request for a signer name whose grant is missing
	// looks again this much later. Looking is in memory (Blocked); only
	// the permission gate talks to the apiserver meanwhile.
	permissionWait = 5 * time.Second
	// parkedWait: a terminal status the apiserver refused is written again
	// this much later (never re-signed).
	parkedWait = 5 * time.Minute
	// finishTimeout bounds the status write of a request in flight when
	// shutdown begins (beyond the signature's own SignTimeout).
	finishTimeout = 10 * time.Second
	// outageGap: a CA key with no failed signature for this long is no
	// longer in the outage that failAfter counts.
	outageGap = time.Minute
	// agedAfter: a certificate keyward has held this long may have aged out
	// of kube-apiserver's ±5 minute notBefore window on its own; its refusal
	// says nothing about clock skew.
	agedAfter = time.Minute
	// notBeforeWindow is kube-apiserver's tolerance for notBefore; a leaf
	// within windowMargin of leaving it by keyward's own clock counts as
	// aged (a large backdate leaves little room).
	notBeforeWindow = 5 * time.Minute
	windowMargin    = 15 * time.Second
	// skewWait: after kube-apiserver refused the notBefore of a fresh
	// signature, the signer signs nothing for this long, then tries again.
	skewWait = time.Minute
	// unavailableWait: a request for a signer name with no generation that
	// may issue looks again this much later (the Issuer logs the cause).
	unavailableWait = time.Second
)

// Signer is one signer name the controller owns, with its policy.
type Signer struct {
	Name string
	// Issuer says which CA generation signs now (and records how long its
	// leaves may live before each signature).
	Issuer          issuer.Issuer
	Profile         profile.Profile
	AllowedKeyTypes []string
	MaxLifetime     time.Duration
	RefreshPoint    float64
	Backdate        time.Duration
	// Annotations are the recognised unverifiedUserAnnotations keys.
	Annotations  []string
	PerNode      *config.Rate
	PerNamespace *config.Rate
	DenyOnLimit  bool
}

// Options configure New.
type Options struct {
	Client kubernetes.Interface
	// Version is "v1" or "v1beta1" (kubeclient.PodCertificateVersion).
	Version string
	Signers []*Signer
	Workers int
	// FailAfter turns a transient outage of a signer's CA key that has
	// lasted this long (from its first failed signature, reset by the next
	// success) into Failed (SignerUnavailable); zero never does.
	FailAfter time.Duration
	// SignTimeout bounds one backend signature (default 30s).
	SignTimeout time.Duration
	Metrics     *Metrics
	// Permissions, if set, blocks signer names the signer may not sign
	// for (a PermissionGate); nil assumes every grant is held.
	Permissions Permissions
	// Recorder, if set, gets Events within EventPolicy.
	Recorder    record.EventRecorder
	EventPolicy EventPolicy
	Clock       clock.Clock
	// Fence, if set, bounds every signature and status write to the time
	// this replica is sure to hold the Lease (kubeclient.Fence); nil when
	// there is no leader election.
	Fence Fence
}

// Fence is what the controller needs of kubeclient.Fence.
type Fence interface {
	Bound(ctx context.Context) (context.Context, context.CancelFunc, error)
	// Open reports whether the fence lets this replica act now.
	Open() bool
}

type queueKey struct {
	signer          string
	namespace, name string
}

// Controller issues PodCertificateRequests. Build it with New, run it with Run.
type Controller struct {
	opts    Options
	api     versionAPI
	signers map[string]*signerState
	queue   workqueue.TypedRateLimitingInterface[queueKey]
	records *records
	events  *eventLog

	synced atomic.Bool
	// informers are started once, standing by or leading.
	informers *workers.Informers
	// loud spaces the loud retry lines per signer name.
	loud workers.Loud
	// parked are the requests that met a shut fence (the Lease not
	// renewed in time): handed back to the queue when the next renewal
	// opens it, rather than each looked at again and again.
	parked workers.Parked[queueKey]
}

type signerState struct {
	*Signer
	limits *limiters

	mu sync.Mutex
	// outageSince is the first failed signature of the CA key's current
	// outage, lastFailure its latest; zero while it signs.
	outageSince, lastFailure time.Time
	// skewSince is when kube-apiserver first refused the notBefore of a
	// fresh signature (the clocks disagree); no signing until skewRetry.
	skewSince, skewRetry time.Time
}

// failing notes a transient failure at now and returns when the current
// outage began and whether it began now. An outage ends at the next
// successful signature, or when no failure was seen for outageGap (the
// backend may have come back while nothing needed signing).
func (s *signerState) failing(now time.Time) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	began := s.outageSince.IsZero() || now.Sub(s.lastFailure) > outageGap
	if began {
		s.outageSince = now
	}
	s.lastFailure = now
	return s.outageSince, began
}

// signed ends the current outage, if any, and returns when it began.
func (s *signerState) signed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	since := s.outageSince
	s.outageSince, s.lastFailure = time.Time{}, time.Time{}
	return since
}

// skewed notes a fresh signature refused for its notBefore: the signer
// signs nothing more for skewWait. It returns whether skew was not
// suspected before.
func (s *signerState) skewed(now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := s.skewSince.IsZero()
	if first {
		s.skewSince = now
	}
	s.skewRetry = now.Add(skewWait)
	return first
}

// skewWaitLeft is how long signing stays paused for suspected clock skew.
// When the pause is over, one caller gets 0 (it may sign one request, the
// probe) and the pause is renewed for the others.
func (s *signerState) skewWaitLeft(now time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.skewSince.IsZero() {
		return 0
	}
	if left := s.skewRetry.Sub(now); left > 0 {
		return left
	}
	s.skewRetry = now.Add(skewWait)
	return 0
}

// written ends a suspected skew (kube-apiserver accepted a certificate)
// and returns since when it was suspected.
func (s *signerState) written() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	since := s.skewSince
	s.skewSince, s.skewRetry = time.Time{}, time.Time{}
	return since
}

type allowAll struct{}

func (allowAll) Blocked(string) error                    { return nil }
func (allowAll) Refused(context.Context, string, string) {}

// New validates opts and builds the controller. It starts nothing.
func New(opts Options) (*Controller, error) {
	if opts.Client == nil || opts.Metrics == nil || len(opts.Signers) == 0 {
		return nil, errors.New("pcr controller needs a client, metrics and at least one signer")
	}
	if opts.Workers <= 0 {
		opts.Workers = config.DefaultWorkers
	}
	if opts.SignTimeout <= 0 {
		opts.SignTimeout = 30 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Version == "" {
		opts.Version = V1
	}
	if opts.Permissions == nil {
		opts.Permissions = allowAll{}
	}
	api, err := newVersionAPI(opts.Client, opts.Version)
	if err != nil {
		return nil, err
	}
	c := &Controller{
		opts: opts, api: api, signers: map[string]*signerState{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedMaxOfRateLimiter(
				workqueue.NewTypedItemExponentialFailureRateLimiter[queueKey](100*time.Millisecond, 10*time.Second),
				&workqueue.TypedBucketRateLimiter[queueKey]{Limiter: rate.NewLimiter(rate.Limit(50), 300)},
			),
			workqueue.TypedRateLimitingQueueConfig[queueKey]{Name: "keyward-pcr"}),
		records: newRecords(),
		events:  newEventLog(opts.Recorder, opts.EventPolicy, opts.Clock, opts.Metrics),
	}
	for _, s := range opts.Signers {
		if s.Issuer == nil || s.Profile == nil {
			return nil, fmt.Errorf("signer %s needs an issuer and a profile", s.Name)
		}
		if _, dup := c.signers[s.Name]; dup {
			return nil, fmt.Errorf("signer %s given twice", s.Name)
		}
		c.signers[s.Name] = &signerState{Signer: s, limits: newLimiters(s.PerNode, s.PerNamespace)}
	}
	c.informers = workers.NewInformers(slices.Collect(maps.Keys(c.signers)), api.newInformer, workers.Handlers(c.enqueue, c.forget))
	if err := opts.Metrics.registerQueueGauges(c.queue.Len, c.records.pending); err != nil {
		return nil, err
	}
	return c, nil
}

// HasSynced reports whether every informer has synced (for /readyz).
func (c *Controller) HasSynced() bool {
	return c.synced.Load()
}

// Warm reports whether Start has run and every informer has synced: a
// standby that could take over without a LIST (for /readyz).
func (c *Controller) Warm() bool { return c.informers.Warm() }

// Start starts the informers (once) on ctx, which should last as long as
// the process: a standby keeps its caches warm, so that taking over needs
// no LIST. It returns at once.
func (c *Controller) Start(ctx context.Context) error {
	return c.informers.Start(ctx, func() {
		// See Run: the initial list is garbage now, on a standby as on a
		// leader; returned here, not at a takeover.
		debug.FreeOSMemory()
		klog.FromContext(ctx).Info("Caches warm", "signers", len(c.signers))
	})
}

// Run starts the informers unless Start did, and the workers, and blocks
// until ctx ends. A ctx that ends before the caches synced is a normal
// shutdown, not an error. Informers started by Start before Run (a
// standby's) are marked: until each has caught up with what was written
// before now, a request is read from the apiserver before it is signed.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	// Only a standby's caches can trail a previous leader's writes; with
	// no leader election (no Fence) there was none.
	startedBefore := c.informers.Started()
	warm := startedBefore && c.opts.Fence != nil
	if err := c.Start(ctx); err != nil {
		return err
	}
	if c.opts.Fence != nil {
		go c.parked.Release(ctx, c.opts.Fence.Open, c.queue.Add)
	}
	logger.Info("Waiting for caches", "signers", len(c.signers), "version", c.api.version(), "warm", warm)
	workers.RunSynced(ctx, c.informers.Synced(), func() {
		if warm {
			c.informers.MarkCatchUp(ctx, c.api.currentRV)
		}
		c.synced.Store(true)
		// The initial list is garbage now that the caches hold trimmed
		// copies: when kube-apiserver cannot stream it (watch-list needs
		// etcd's progress notifications) it is one response holding every
		// request in full, 28 MB for 10 000, and the next GC and the
		// scavenger would return it only minutes later. One forced GC at
		// start returns it now (docs/benchmarks.md, restart-of-steady).
		if !startedBefore {
			debug.FreeOSMemory()
		}
		logger.Info("Caches synced; issuing", "workers", c.opts.Workers)
	}, c.opts.Workers, c.queue, c.processNext)
	return nil
}

func (c *Controller) enqueue(signer string, obj any) {
	r, err := c.api.toRequest(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	if r.terminal {
		if rec, ok := c.records.lookup(r.uid); ok && rec.cert != nil && !rec.written {
			// A certificate was signed for it and its write not seen to
			// succeed: sync reads which certificate was stored.
			c.queue.Add(queueKey{signer: signer, namespace: r.namespace, name: r.name})
			return
		}
		c.records.drop(r.uid)
		return
	}
	c.records.get(r.uid, c.opts.Clock.Now())
	c.queue.Add(queueKey{signer: signer, namespace: r.namespace, name: r.name})
}

// forget drops in-memory state of a request that is gone.
func (c *Controller) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	r, err := c.api.toRequest(obj)
	if err != nil {
		return
	}
	c.records.drop(r.uid)
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		// Shutting down (or the Lease is gone): the work queue still hands
		// out what it holds, but nothing new is started; the next leader
		// lists these requests again.
		return false
	}
	requeueAfter, err := c.sync(ctx, key)
	workers.Settle(c.queue, key, requeueAfter, err, func(loud bool, attempts int) {
		c.opts.Metrics.Retries.WithLabelValues(key.signer).Inc()
		logger := klog.FromContext(ctx)
		if loud {
			loud, held := c.loud.Allow(key.signer, c.opts.Clock.Now())
			if loud {
				logger.Error(err, "Request still not done; retrying with backoff (one such line per signer name a minute; keyward_pcr_retries_total counts every retry)",
					"pcr", klog.KRef(key.namespace, key.name), "signer", key.signer, "attempts", attempts, "othersHeldBack", held)
				return
			}
		}
		logger.V(2).Info("Retrying", "pcr", klog.KRef(key.namespace, key.name), "err", err)
	})
	return true
}

// sync brings one request to a terminal status. A returned error means a
// transient failure: the key is retried with backoff; a positive duration
// means "look again then". Once ctx has ended no new signature starts; a
// signature under way and the write of a certificate already signed are
// finished on a context of their own (bounded by SignTimeout +
// finishTimeout), so that the next leader need not sign them again.
func (c *Controller) sync(ctx context.Context, key queueKey) (time.Duration, error) {
	stop := ctx
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SignTimeout+finishTimeout)
	defer cancel()
	s := c.signers[key.signer]
	// Asked before the read: the store only moves forward, so if it had
	// caught up with the takeover's mark then, the object read shows every
	// write up to it (asked after, a stale copy read first could pass).
	fresh := c.informers.Get(key.signer).Fresh()
	obj, exists, err := c.informers.Get(key.signer).GetIndexer().GetByKey(key.namespace + "/" + key.name)
	if err != nil || !exists {
		return 0, err
	}
	r, err := c.api.toRequest(obj)
	if err != nil {
		return 0, err
	}
	if r.signerName != s.Name {
		return 0, nil
	}
	if r.terminal {
		return 0, c.settleUnconfirmed(ctx, s, r)
	}
	now := c.opts.Clock.Now()
	// Records are made and dropped only by the informer's handlers: none
	// means a delete or terminal event came after this key was queued.
	rec, ok := c.records.lookup(r.uid)
	if !ok {
		return 0, nil
	}
	if rec.written {
		// Our terminal status is written; the informer has not shown it
		// yet. Nothing more to do, and nothing to sign.
		return 0, nil
	}
	if c.opts.Fence != nil {
		// Nothing is signed or written once a standby may have taken the
		// Lease: every call below ends at the fence.
		fctx, cancelFence, err := c.opts.Fence.Bound(ctx)
		if err != nil {
			c.parked.Park(key) // until the fence opens again
			return 0, nil
		}
		defer cancelFence()
		ctx = fctx
	}
	if d := rec.decided; d != nil {
		// A Denied or Failed status decided earlier and refused: only it
		// is written again.
		return c.terminal(ctx, s, r, d.typ, d.reason, d.message)
	}
	r.seen = rec.firstSeen
	// creationTimestamp has whole seconds; trust it only when the request
	// waited longer than that before keyward saw it (e.g. a failover).
	if !r.created.IsZero() && r.seen.Sub(r.created) > time.Second {
		r.seen = r.created
	}
	if err := c.opts.Permissions.Blocked(s.Name); err != nil {
		// Signing now would only make a certificate the apiserver refuses.
		return permissionWait, nil
	}
	if wait := s.skewWaitLeft(now); wait > 0 && rec.cert == nil {
		return wait, nil
	}

	cert := rec.cert
	if cert == nil {
		if !fresh {
			// Just took over, and the cache may not show yet what the
			// previous leader wrote: one quorum read says whether the
			// request is still to be decided (before a rate-limit token
			// is spent on it).
			stored, _, err := c.api.stored(ctx, r.namespace, r.name)
			switch {
			case apierrors.IsNotFound(err):
				return 0, nil
			case err != nil:
				return 0, err
			case stored.uid != r.uid || stored.terminal:
				// Decided already; the informer's event drops the record.
				return 0, nil
			}
		}
		if d := c.check(s, r); d != nil {
			return c.terminal(ctx, s, r, "Denied", d.Reason, d.Message)
		}
		// One token per request: a retry after a backend error must not
		// spend another, or an outage would turn into RateLimited denials.
		if !rec.admitted {
			if wait, d := c.takeToken(s, r); d != nil {
				return c.terminal(ctx, s, r, "Denied", d.Reason, d.Message)
			} else if wait > 0 {
				return wait, nil
			}
			c.records.update(r.uid, func(rec *requestRecord) { rec.admitted = true })
		}
		if err := stop.Err(); err != nil {
			return 0, err
		}
		auth, gen, err := s.Issuer.Current()
		if err != nil {
			// No generation may issue (the Issuer logs why, once): the
			// request waits; it is not a CA-key outage.
			c.delayed(r, EventSigningDelayed, "waiting for a CA generation that may issue: %v", err)
			return unavailableWait, nil
		}
		cert, err = c.issue(ctx, s, r, auth, gen)
		if err != nil && errors.Is(context.Cause(ctx), kubeclient.ErrFenced) {
			// Cut off at the fence: not the CA key's failure.
			c.parked.Park(key) // until the fence opens again
			return 0, nil
		}
		if errors.Is(err, issuer.ErrUnavailable) {
			// The reservation was not recorded: nothing was signed.
			c.delayed(r, EventSigningDelayed, "will retry: %v", err)
			return 0, err
		}
		if err != nil {
			return c.issueFailed(ctx, s, r, auth, err)
		}
		if since := s.signed(); !since.IsZero() {
			klog.FromContext(ctx).Info("CA key signs again", "signer", s.Name, "key", auth.Signer().URI(),
				"outage", c.opts.Clock.Since(since).Round(time.Second))
		}
		c.records.update(r.uid, func(rec *requestRecord) { rec.cert = cert })
		// The first audit line, before the status write: a replica killed
		// while the write is on the wire never reads the answer, so the
		// "Issued" line alone could miss a certificate the apiserver
		// stored. Every certificate that can exist is named here.
		klog.FromContext(ctx).Info("Signed", "pcr", klog.KRef(r.namespace, r.name), "signer", s.Name,
			"serial", cert.leaf.SerialNumber.Text(16), "uid", string(r.uid), "caKeyID", cert.key)
	}

	err = c.api.writeStatus(ctx, r, c.issuedStatus(s, cert))
	return c.afterIssuedWrite(ctx, s, r, cert, err)
}

// logIssued writes the audit line of an issuance: the uid ties the serial
// to this request, not to a later one of the same name (the fault tests
// reconcile it). extra is appended to its key/value pairs.
func logIssued(logger klog.Logger, r *request, cert *issuedCert, extra ...any) {
	logger.Info("Issued", append([]any{
		"serial", cert.leaf.SerialNumber.Text(16), "uid", string(r.uid), "namespace", r.namespace, "pod", r.podName,
		"serviceAccount", r.serviceAccountName, "node", r.nodeName, "keyType", KeyType(cert.leaf.PublicKey),
		"notAfter", cert.leaf.NotAfter.UTC().Format(time.RFC3339), "caKeyID", cert.key}, extra...)...)
}

// settleUnconfirmed handles a request the informer shows terminal while
// keyward holds a certificate it signed for it and never saw stored: a
// status write whose answer was lost (a kube-apiserver or etcd restart cut
// it off) and a retry refused as a conflict. One GET says whose status
// is stored: if it is this certificate, its Issued line is written now;
// if not (another replica's, or a denial), the line says this serial was
// never stored. Either way nothing more is done for the request.
func (c *Controller) settleUnconfirmed(ctx context.Context, s *signerState, r *request) error {
	rec, ok := c.records.lookup(r.uid)
	if !ok || rec.cert == nil || rec.written {
		c.records.drop(r.uid)
		return nil
	}
	stored, chain, err := c.api.stored(ctx, r.namespace, r.name)
	if apierrors.IsNotFound(err) || (err == nil && stored.uid != r.uid) {
		c.records.drop(r.uid)
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("pcr", klog.KRef(r.namespace, r.name), "signer", s.Name)
	if apierrors.IsForbidden(err) {
		// RBAC without get on podcertificaterequests: retrying cannot
		// help. The Signed line stays the only record of this serial.
		c.records.drop(r.uid)
		logger.Error(err, "Cannot read the stored status to confirm a certificate whose write answer was lost; grant get on podcertificaterequests",
			"serial", rec.cert.leaf.SerialNumber.Text(16), "uid", string(r.uid))
		return nil
	}
	if err != nil {
		return err // retried with backoff
	}
	c.records.drop(r.uid)
	if leaf, _ := pem.Decode([]byte(chain)); leaf != nil && bytes.Equal(leaf.Bytes, rec.cert.leaf.Raw) {
		stored.seen = rec.firstSeen
		c.observe(s, stored, "Issued", ReasonIssued)
		logIssued(logger, stored, rec.cert, "answerLost", true)
		return nil
	}
	logger.Info("Signed certificate was not stored: the request's status was written by another writer",
		"serial", rec.cert.leaf.SerialNumber.Text(16), "uid", string(r.uid), "caKeyID", rec.cert.key)
	return nil
}

// issueFailed handles an error from building or signing the certificate.
func (c *Controller) issueFailed(ctx context.Context, s *signerState, r *request, auth *authority.Authority, err error) (time.Duration, error) {
	switch Classify(err) {
	case Denial:
		var d *profile.Denial
		errors.As(err, &d)
		return c.terminal(ctx, s, r, "Denied", d.Reason, d.Message)
	case Transient:
		now := c.opts.Clock.Now()
		since, began := s.failing(now)
		if began {
			klog.FromContext(ctx).Error(err, "CA key cannot sign; requests wait and are retried", "signer", s.Name,
				"key", auth.Signer().URI(), "failAfter", c.opts.FailAfter)
		}
		if c.opts.FailAfter > 0 && now.Sub(since) > c.opts.FailAfter {
			return c.terminal(ctx, s, r, "Failed", ReasonSignerUnavailable, fmt.Sprintf(
				"the signer could not sign with its CA key for %s (since %s, failAfter %s): %v",
				now.Sub(since).Round(time.Second), since.UTC().Format(time.RFC3339), c.opts.FailAfter, err))
		}
		c.delayed(r, EventSigningDelayed, "will retry: %v", err)
		return 0, err
	}
	return c.terminal(ctx, s, r, "Failed", ReasonBackendFailure, err.Error())
}

// delayed records a coalesced Warning for a request that waits: at most one
// per request every delayedEventEvery.
func (c *Controller) delayed(r *request, reason, format string, args ...any) {
	now := c.opts.Clock.Now()
	emit := false
	c.records.update(r.uid, func(rec *requestRecord) {
		if rec.lastDelayedEvent.IsZero() || now.Sub(rec.lastDelayedEvent) >= delayedEventEvery {
			rec.lastDelayedEvent, emit = now, true
		}
	})
	if emit {
		c.events.warning(r.obj, reason, format, args...)
	}
}

// afterIssuedWrite acts on kube-apiserver's answer to an Issued status.
func (c *Controller) afterIssuedWrite(ctx context.Context, s *signerState, r *request, cert *issuedCert, err error) (time.Duration, error) {
	res := classifyWrite(err)
	if wait, done, err := c.afterWrite(ctx, s, r, res, err); done {
		return wait, err
	}
	logger := klog.FromContext(ctx).WithValues("pcr", klog.KRef(r.namespace, r.name), "signer", s.Name)
	now := c.opts.Clock.Now()
	switch res {
	case writeOK:
		c.records.markWritten(r.uid)
		if since := s.written(); !since.IsZero() {
			logger.Info("kube-apiserver accepts notBefore again; issuing", "skewSuspectedFor", now.Sub(since).Round(time.Second))
			c.opts.Metrics.ClockSkew.WithLabelValues(s.Name).Set(0)
		}
		c.observe(s, r, "Issued", ReasonIssued)
		logIssued(logger, r, cert)
		c.events.issued(r.obj, "issued certificate serial %s by %s, valid until %s",
			cert.leaf.SerialNumber.Text(16), s.Name, cert.leaf.NotAfter.UTC().Format(time.RFC3339))
		return 0, nil
	case writeConflict, writeTransient:
		// The certificate signed for this UID is written again, never
		// re-signed.
		return 0, err
	case writeNotBeforeWindow:
		// The certificate is dropped either way: only a fresh one can pass.
		c.records.update(r.uid, func(rec *requestRecord) { rec.cert = nil })
		if now.Sub(cert.signedAt) >= agedAfter || now.Sub(cert.leaf.NotBefore) >= notBeforeWindow-windowMargin {
			// It aged in keyward's hands (retries, a slow apiserver).
			logger.V(2).Info("Certificate aged out of kube-apiserver's notBefore window while waiting; signing afresh",
				"notBefore", cert.leaf.NotBefore.UTC().Format(time.RFC3339), "held", now.Sub(cert.signedAt).Round(time.Second))
			return 0, err
		}
		// A fresh signature refused: the clocks disagree. Skew is the
		// signer's, not the request's: sign nothing for a while, then try
		// again; requests wait, none is Failed.
		if s.skewed(now) {
			logger.Error(err, "kube-apiserver refused the notBefore of a fresh certificate: the signer's clock and kube-apiserver's differ by more than 5 minutes minus the backdate; signing paused, fix the time sync",
				"notBefore", cert.leaf.NotBefore.UTC().Format(time.RFC3339), "backdate", s.Backdate, "retryIn", skewWait)
			c.opts.Metrics.ClockSkew.WithLabelValues(s.Name).Set(1)
		}
		c.delayed(r, EventClockSkew, "kube-apiserver refused notBefore %s of a fresh certificate: the signer's clock is skewed; will retry", cert.leaf.NotBefore.UTC().Format(time.RFC3339))
		return skewWait, nil
	}
	// writeRejected: signing again would be refused the same way. The
	// certificate is dropped; from now on only the Failed status is
	// written (terminal keeps it as the decision if it is refused too).
	c.records.update(r.uid, func(rec *requestRecord) { rec.cert = nil })
	logger.Error(err, "kube-apiserver refused the Issued status")
	return c.terminal(ctx, s, r, "Failed", ReasonStatusRejected, "kube-apiserver refused the issued status: "+err.Error())
}

// afterWrite handles the answers to a status write that mean the same
// whatever was written: it counts refusals and reports done for gone,
// already terminal and no permission.
func (c *Controller) afterWrite(ctx context.Context, s *signerState, r *request, res writeResult, err error) (time.Duration, bool, error) {
	if res != writeOK {
		c.opts.Metrics.StatusRejected.WithLabelValues(s.Name, res.String()).Inc()
	}
	switch res {
	case writeGone, writeAlreadyTerminal:
		// Never signed again: the informer's delete or terminal event
		// drops the record.
		c.records.markWritten(r.uid)
		return 0, true, nil
	case writeNoPermission:
		// Nothing is signed for this signer name until the gate finds the
		// grant; a certificate already signed is kept and written then.
		c.opts.Permissions.Refused(ctx, s.Name, err.Error())
		c.delayed(r, EventPermissionMissing, "the signer may not write this status; not retrying until its RBAC grants it: %v", err)
		return permissionWait, true, nil
	}
	return 0, false, nil
}

// check applies the policy that needs no signing: key, annotations.
func (c *Controller) check(s *signerState, r *request) *profile.Denial {
	if r.keyErr != nil {
		var d *profile.Denial
		if errors.As(r.keyErr, &d) {
			return d
		}
		return &profile.Denial{Reason: ReasonInvalidRequest, Message: r.keyErr.Error()}
	}
	kt := KeyType(r.publicKey)
	if !slices.Contains(s.AllowedKeyTypes, kt) {
		return &profile.Denial{Reason: ReasonUnsupportedKeyType, Message: fmt.Sprintf(
			"signer %s does not issue for %s keys; use %s (allowed: %s)", s.Name, kt, s.AllowedKeyTypes[0], strings.Join(s.AllowedKeyTypes, ", "))}
	}
	var unknown []string
	for k := range r.annotations {
		if !slices.Contains(s.Annotations, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		known := "none"
		if len(s.Annotations) > 0 {
			known = strings.Join(s.Annotations, ", ")
		}
		const listed = 5
		var quoted []string
		for _, k := range unknown[:min(len(unknown), listed)] {
			quoted = append(quoted, profile.Quote(k))
		}
		if len(unknown) > listed {
			quoted = append(quoted, fmt.Sprintf("and %d more", len(unknown)-listed))
		}
		return &profile.Denial{Reason: profile.ReasonInvalidAnnotations, Message: fmt.Sprintf(
			"signer %s does not recognise unverifiedUserAnnotations %s (recognised: %s)", s.Name, strings.Join(quoted, ", "), known)}
	}
	return nil
}

// takeToken applies the per-node and per-namespace rate limits: either a
// wait before trying again, or (deny mode) a denial.
func (c *Controller) takeToken(s *signerState, r *request) (time.Duration, *profile.Denial) {
	wait := s.limits.reserve(r.nodeName, r.namespace, c.opts.Clock.Now())
	if wait <= 0 {
		return 0, nil
	}
	if s.DenyOnLimit {
		return 0, &profile.Denial{Reason: ReasonRateLimited, Message: fmt.Sprintf(
			"node %s or namespace %s exceeded signer %s's issuance rate", r.nodeName, r.namespace, s.Name)}
	}
	return wait, nil
}

// issue signs a certificate for r with auth, generation gen, after the
// Issuer recorded that a leaf of gen may live until now + lifetime.
func (c *Controller) issue(ctx context.Context, s *signerState, r *request, auth *authority.Authority, gen string) (*issuedCert, error) {
	lifetime := time.Duration(defaultMaxExpiry) * time.Second
	if r.maxExpirationSeconds != nil {
		lifetime = time.Duration(*r.maxExpirationSeconds) * time.Second
	}
	lifetime = min(lifetime, s.MaxLifetime)
	req := profile.Request{
		SignerName: s.Name, Namespace: r.namespace,
		PodName: r.podName, PodUID: r.podUID, ServiceAccountName: r.serviceAccountName, ServiceAccountUID: r.serviceAccountUID,
		NodeName: r.nodeName, NodeUID: r.nodeUID, Annotations: r.annotations, PublicKey: r.publicKey,
	}
	tmpl, err := s.Profile.Template(req)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, c.opts.SignTimeout)
	defer cancel()
	// The leaf ends at the latest at now + lifetime (Sign backdates
	// notBefore, which only brings notAfter earlier); the leaf is dated
	// from this same now, so the reservation covers it exactly.
	now := c.opts.Clock.Now()
	if err := s.Issuer.Reserve(sctx, gen, now.Add(lifetime)); err != nil {
		return nil, err
	}
	key := auth.Signer().KeyVersion()
	leaf, err := auth.Sign(sctx, tmpl, r.publicKey, authority.Policy{
		Lifetime: lifetime, Backdate: s.Backdate, MinLifetime: config.MinLifetime, Now: func() time.Time { return now },
	})
	if err != nil {
		return nil, err
	}
	var chain strings.Builder
	chain.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}))
	for _, ca := range auth.Chain() {
		chain.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}))
	}
	return &issuedCert{leaf: leaf, chain: chain.String(), key: key, signedAt: c.opts.Clock.Now()}, nil
}

// issuedStatus is the Issued status for cert: times equal to the leaf's,
// refresh at RefreshPoint of the lifetime, kept 10 minutes from either end
// as the apiserver requires.
func (c *Controller) issuedStatus(s *signerState, cert *issuedCert) status {
	nb, na := cert.leaf.NotBefore, cert.leaf.NotAfter
	refresh := nb.Add(time.Duration(float64(na.Sub(nb)) * s.RefreshPoint)).Truncate(time.Second)
	if lo := nb.Add(refreshMargin); refresh.Before(lo) {
		refresh = lo
	}
	if hi := na.Add(-refreshMargin); refresh.After(hi) {
		refresh = hi
	}
	mnb, mna, mr := metav1.NewTime(nb), metav1.NewTime(na), metav1.NewTime(refresh)
	return status{
		conditions: []metav1.Condition{{
			Type: "Issued", Status: metav1.ConditionTrue, Reason: ReasonIssued,
			Message:            fmt.Sprintf("issued by %s, serial %s", s.Name, cert.leaf.SerialNumber.Text(16)),
			LastTransitionTime: metav1.NewTime(c.opts.Clock.Now()),
		}},
		chain: cert.chain, notBefore: &mnb, notAfter: &mna, beginRefreshAt: &mr,
	}
}

// terminal writes a Denied or Failed condition and nothing else. The
// message is cut to fit the apiserver's limits with room to spare.
func (c *Controller) terminal(ctx context.Context, s *signerState, r *request, typ, reason, msg string) (time.Duration, error) {
	msg = kubemsg.Truncate(msg, kubemsg.MaxConditionMessage)
	err := c.api.writeStatus(ctx, r, status{conditions: []metav1.Condition{{
		Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(c.opts.Clock.Now()),
	}}})
	res := classifyWrite(err)
	if wait, done, err := c.afterWrite(ctx, s, r, res, err); done {
		return wait, err
	}
	switch res {
	case writeOK:
	case writeRejected, writeNotBeforeWindow:
		c.records.update(r.uid, func(rec *requestRecord) {
			rec.cert, rec.decided = nil, &decision{typ: typ, reason: reason, message: msg}
		})
		klog.FromContext(ctx).Error(err, "kube-apiserver refused a terminal status; writing it again later",
			"pcr", klog.KRef(r.namespace, r.name), "signer", s.Name, "condition", typ, "reason", reason, "retryIn", parkedWait)
		c.delayed(r, EventStatusRejected, "kube-apiserver refused the %s status: %v", typ, err)
		return parkedWait, nil
	default:
		return 0, err
	}
	c.records.markWritten(r.uid)
	c.observe(s, r, typ, reason)
	klog.FromContext(ctx).Info(typ, "pcr", klog.KRef(r.namespace, r.name), "signer", s.Name, "reason", reason, "message", kubemsg.Truncate(msg, kubemsg.MaxEventMessage))
	c.events.warning(r.obj, reason, "%s: %s", typ, msg)
	return 0, nil
}

// observe counts an outcome and its latency: from when keyward first saw
// the request, or its creation if that was over a second earlier.
func (c *Controller) observe(s *signerState, r *request, outcome, reason string) {
	c.opts.Metrics.Issuances.WithLabelValues(s.Name, outcome, reason).Inc()
	if !r.seen.IsZero() {
		c.opts.Metrics.Latency.WithLabelValues(s.Name).Observe(c.opts.Clock.Since(r.seen).Seconds())
	}
}

// KeyType names pub the way PodCertificateProjection.keyType (and
// allowedKeyTypes) does.
func KeyType(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA%d", k.N.BitLen())
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return "ECDSAP256"
		case elliptic.P384():
			return "ECDSAP384"
		case elliptic.P521():
			return "ECDSAP521"
		}
		return "ECDSA" + k.Curve.Params().Name
	case ed25519.PublicKey:
		return "ED25519"
	}
	return fmt.Sprintf("%T", pub)
}
