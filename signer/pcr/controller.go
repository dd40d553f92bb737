// Package pcr is keyward's PodCertificateRequest controller. It watches only
// the signer names it owns (a spec.signerName field selector per name),
// writes only through /status, and brings each request to exactly one
// terminal condition: Issued, Denied (a policy refusal) or Failed (a
// permanent backend error, or an outage longer than FailAfter). Transient
// errors are retried with capped backoff and never become Failed by default,
// because kubelet treats Failed as permanent.
package pcr

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/profile"
	"golang.org/x/time/rate"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
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
	ReasonIssued            = "Issued"
	ReasonRateLimited       = "RateLimited"
	ReasonInvalidRequest    = "InvalidRequest"
	ReasonBackendFailure    = "BackendFailure"
	ReasonSignerUnavailable = "SignerUnavailable"
)

// Limits kube-apiserver puts on an issued certificate.
const (
	minLifetime      = time.Hour
	refreshMargin    = 10 * time.Minute
	defaultMaxExpiry = 86400
)

// Signer is one signer name the controller owns, with its policy.
type Signer struct {
	Name      string
	Authority *authority.Authority
	Profile   profile.Profile
	// Backend labels metrics (the key URI's scheme).
	Backend         string
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
	// FailAfter turns a transient outage older than this into Failed
	// (SignerUnavailable); zero never does.
	FailAfter time.Duration
	// SignTimeout bounds one backend signature (default 30s).
	SignTimeout time.Duration
	Metrics     *Metrics
	// Recorder, if set, gets an Event for each outcome.
	Recorder record.EventRecorder
	Clock    clock.Clock
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

	mu        sync.Mutex
	issued    map[types.UID]*issuedCert // signed but not yet written
	firstSeen map[types.UID]time.Time
	admitted  map[types.UID]bool // passed the rate limits; retries take no new token
	synced    bool
}

type signerState struct {
	*Signer
	informer cache.SharedIndexInformer
	limits   *limiters
}

type issuedCert struct {
	leaf  *x509.Certificate
	chain string
}

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
		issued:    map[types.UID]*issuedCert{},
		firstSeen: map[types.UID]time.Time{},
		admitted:  map[types.UID]bool{},
	}
	for _, s := range opts.Signers {
		if s.Authority == nil || s.Profile == nil {
			return nil, fmt.Errorf("signer %s needs an authority and a profile", s.Name)
		}
		if _, dup := c.signers[s.Name]; dup {
			return nil, fmt.Errorf("signer %s given twice", s.Name)
		}
		c.signers[s.Name] = &signerState{Signer: s, limits: newLimiters(s.PerNode, s.PerNamespace)}
	}
	if err := opts.Metrics.registerQueueDepth(c.queue.Len); err != nil {
		return nil, err
	}
	return c, nil
}

// HasSynced reports whether every informer has synced (for /readyz).
func (c *Controller) HasSynced() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.synced
}

// Run starts the informers and workers and blocks until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)

	var syncs []cache.InformerSynced
	for name, s := range c.signers {
		s.informer = c.api.newInformer(name)
		signer := name
		if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.enqueue(signer, obj) },
			UpdateFunc: func(_, obj any) { c.enqueue(signer, obj) },
			DeleteFunc: func(obj any) { c.forget(obj) },
		}); err != nil {
			return err
		}
		go s.informer.Run(ctx.Done())
		syncs = append(syncs, s.informer.HasSynced)
	}
	logger.Info("Waiting for caches", "signers", len(c.signers), "version", c.api.version())
	if !cache.WaitForCacheSync(ctx.Done(), syncs...) {
		return errors.New("caches did not sync before shutdown")
	}
	c.mu.Lock()
	c.synced = true
	c.mu.Unlock()
	logger.Info("Caches synced; issuing", "workers", c.opts.Workers)

	var wg sync.WaitGroup
	for range c.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			wait.UntilWithContext(ctx, c.runWorker, time.Second)
		}()
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

func (c *Controller) enqueue(signer string, obj any) {
	r, err := c.api.toRequest(obj)
	if err != nil {
		utilruntime.HandleError(err)
		return
	}
	if r.terminal {
		c.forget(obj)
		return
	}
	c.mu.Lock()
	if _, ok := c.firstSeen[r.uid]; !ok {
		c.firstSeen[r.uid] = c.opts.Clock.Now()
	}
	c.mu.Unlock()
	c.queue.Add(queueKey{signer: signer, namespace: r.namespace, name: r.name})
}

// forget drops in-memory state of a request that is gone or terminal.
func (c *Controller) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	r, err := c.api.toRequest(obj)
	if err != nil {
		return
	}
	c.drop(r.uid)
}

// drop forgets everything kept in memory for the request uid.
func (c *Controller) drop(uid types.UID) {
	c.mu.Lock()
	delete(c.issued, uid)
	delete(c.firstSeen, uid)
	delete(c.admitted, uid)
	c.mu.Unlock()
}

func (c *Controller) runWorker(ctx context.Context) {
	for c.processNext(ctx) {
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	requeueAfter, err := c.sync(ctx, key)
	switch {
	case err != nil:
		c.opts.Metrics.Retries.WithLabelValues(key.signer).Inc()
		klog.FromContext(ctx).V(2).Info("Retrying", "pcr", klog.KRef(key.namespace, key.name), "err", err)
		c.queue.AddRateLimited(key)
	case requeueAfter > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, requeueAfter)
	default:
		c.queue.Forget(key)
	}
	return true
}

// sync brings one request to a terminal status. A returned error means a
// transient failure: the key is retried with backoff.
func (c *Controller) sync(ctx context.Context, key queueKey) (time.Duration, error) {
	s := c.signers[key.signer]
	obj, exists, err := s.informer.GetIndexer().GetByKey(key.namespace + "/" + key.name)
	if err != nil || !exists {
		return 0, err
	}
	r, err := c.api.toRequest(obj)
	if err != nil {
		return 0, err
	}
	if r.terminal || r.signerName != s.Name {
		return 0, nil
	}
	logger := klog.FromContext(ctx).WithValues("pcr", klog.KRef(r.namespace, r.name), "signer", s.Name)

	c.mu.Lock()
	cert := c.issued[r.uid]
	seen, ok := c.firstSeen[r.uid]
	admitted := c.admitted[r.uid]
	c.mu.Unlock()
	if !ok {
		seen = c.opts.Clock.Now()
	}
	// creationTimestamp has whole seconds; trust it only when the request
	// waited longer than that before keyward saw it (e.g. a failover).
	if !r.created.IsZero() && seen.Sub(r.created) > time.Second {
		seen = r.created
	}
	r.seen = seen
	if cert == nil {
		if d := c.check(s, r); d != nil {
			return 0, c.deny(ctx, s, r, d.Reason, d.Message)
		}
		// One token per request: a retry after a backend error must not
		// spend another, or an outage would turn into RateLimited denials.
		if !admitted {
			if wait, d := c.takeToken(s, r); d != nil {
				return 0, c.deny(ctx, s, r, d.Reason, d.Message)
			} else if wait > 0 {
				return wait, nil
			}
			c.mu.Lock()
			c.admitted[r.uid] = true
			c.mu.Unlock()
		}
		cert, err = c.issue(ctx, s, r)
		if err != nil {
			var denial *profile.Denial
			switch {
			case errors.As(err, &denial):
				return 0, c.deny(ctx, s, r, denial.Reason, denial.Message)
			case backends.IsTransient(err) || errors.Is(err, authority.ErrCAExpiresTooSoon) || errors.Is(err, context.DeadlineExceeded):
				if c.opts.FailAfter > 0 && c.opts.Clock.Since(r.created) > c.opts.FailAfter {
					return 0, c.fail(ctx, s, r, ReasonSignerUnavailable,
						fmt.Sprintf("the signer could not reach its CA key for more than %s: %v", c.opts.FailAfter, err))
				}
				c.event(r, corev1.EventTypeWarning, "SigningDelayed", "will retry: %v", err)
				return 0, err
			default:
				return 0, c.fail(ctx, s, r, ReasonBackendFailure, err.Error())
			}
		}
		c.mu.Lock()
		c.issued[r.uid] = cert
		c.mu.Unlock()
	}

	st := c.issuedStatus(s, cert)
	if err := c.api.writeStatus(ctx, r, st); err != nil {
		switch {
		case apierrors.IsNotFound(err):
			c.drop(r.uid)
			return 0, nil
		case apierrors.IsConflict(err):
			// The informer brings the newer object; the certificate
			// already signed for this UID is reused, never re-signed.
			return 0, err
		case apierrors.IsInvalid(err):
			// The apiserver judged the status (e.g. notBefore outside its
			// ±5 minute window): sign afresh next time.
			c.mu.Lock()
			delete(c.issued, r.uid)
			c.mu.Unlock()
			c.event(r, corev1.EventTypeWarning, "StatusRejected", "kube-apiserver rejected the issued status: %v", err)
			return 0, err
		}
		return 0, err
	}
	c.observe(s, r, "Issued", ReasonIssued)
	logger.Info("Issued",
		"serial", cert.leaf.SerialNumber.Text(16), "namespace", r.namespace, "pod", r.podName,
		"serviceAccount", r.serviceAccountName, "node", r.nodeName, "keyType", keyType(r.publicKey),
		"notAfter", cert.leaf.NotAfter.UTC().Format(time.RFC3339), "caKeyID", s.Authority.Signer().KeyVersion())
	c.event(r, corev1.EventTypeNormal, ReasonIssued, "issued certificate serial %s by %s, valid until %s",
		cert.leaf.SerialNumber.Text(16), s.Name, cert.leaf.NotAfter.UTC().Format(time.RFC3339))
	c.drop(r.uid)
	return 0, nil
}

// check applies the policy that needs no signing: key, annotations.
func (c *Controller) check(s *signerState, r *request) *profile.Denial {
	if r.keyErr != nil {
		return &profile.Denial{Reason: ReasonInvalidRequest, Message: r.keyErr.Error()}
	}
	kt := keyType(r.publicKey)
	if !slices.Contains(s.AllowedKeyTypes, kt) {
		return &profile.Denial{Reason: "UnsupportedKeyType", Message: fmt.Sprintf(
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
		return &profile.Denial{Reason: profile.ReasonInvalidAnnotations, Message: fmt.Sprintf(
			"signer %s does not recognise unverifiedUserAnnotations %s (recognised: %s)", s.Name, strings.Join(unknown, ", "), known)}
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

func (c *Controller) issue(ctx context.Context, s *signerState, r *request) (*issuedCert, error) {
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
	began := c.opts.Clock.Now()
	leaf, err := s.Authority.Sign(sctx, tmpl, r.publicKey, authority.Policy{
		Lifetime: lifetime, Backdate: s.Backdate, MinLifetime: minLifetime, Now: c.opts.Clock.Now,
	})
	c.opts.Metrics.SignDuration.WithLabelValues(s.Backend).Observe(c.opts.Clock.Since(began).Seconds())
	if err != nil {
		kind := "permanent"
		if backends.IsTransient(err) || errors.Is(err, context.DeadlineExceeded) {
			kind = "transient"
		}
		c.opts.Metrics.SignErrors.WithLabelValues(s.Backend, kind).Inc()
		return nil, err
	}
	var chain strings.Builder
	chain.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}))
	for _, ca := range s.Authority.Chain() {
		chain.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw}))
	}
	return &issuedCert{leaf: leaf, chain: chain.String()}, nil
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

func (c *Controller) deny(ctx context.Context, s *signerState, r *request, reason, msg string) error {
	return c.terminal(ctx, s, r, "Denied", reason, msg)
}

func (c *Controller) fail(ctx context.Context, s *signerState, r *request, reason, msg string) error {
	return c.terminal(ctx, s, r, "Failed", reason, msg)
}

// terminal writes a Denied or Failed condition and nothing else.
func (c *Controller) terminal(ctx context.Context, s *signerState, r *request, typ, reason, msg string) error {
	err := c.api.writeStatus(ctx, r, status{conditions: []metav1.Condition{{
		Type: typ, Status: metav1.ConditionTrue, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(c.opts.Clock.Now()),
	}}})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	c.observe(s, r, typ, reason)
	klog.FromContext(ctx).Info(typ, "pcr", klog.KRef(r.namespace, r.name), "signer", s.Name, "reason", reason, "message", msg)
	c.event(r, corev1.EventTypeWarning, reason, "%s: %s", typ, msg)
	c.drop(r.uid)
	return nil
}

// observe counts an outcome and its latency: from when keyward first saw
// the request, or its creation if that was over a second earlier (read at
// the start of sync: the watch event of our own status write may already
// have dropped it).
func (c *Controller) observe(s *signerState, r *request, outcome, reason string) {
	c.opts.Metrics.Issuances.WithLabelValues(s.Name, outcome, reason).Inc()
	if !r.seen.IsZero() {
		c.opts.Metrics.Latency.WithLabelValues(s.Name).Observe(c.opts.Clock.Since(r.seen).Seconds())
	}
}

func (c *Controller) event(r *request, typ, reason, format string, args ...any) {
	if c.opts.Recorder != nil {
		c.opts.Recorder.Eventf(r.obj, typ, reason, format, args...)
	}
}

// keyType names pub the way PodCertificateProjection.keyType does.
func keyType(pub crypto.PublicKey) string {
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

// limiters are token buckets per node and per namespace.
type limiters struct {
	perNode, perNamespace *config.Rate
	mu                    sync.Mutex
	nodes, namespaces     map[string]*rate.Limiter
}

func newLimiters(perNode, perNamespace *config.Rate) *limiters {
	return &limiters{perNode: perNode, perNamespace: perNamespace,
		nodes: map[string]*rate.Limiter{}, namespaces: map[string]*rate.Limiter{}}
}

// reserve takes a token from both buckets if both have one now; otherwise it
// takes none and returns how long until they would.
func (l *limiters) reserve(node, namespace string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rs []*rate.Reservation
	if l.perNode != nil {
		rs = append(rs, bucket(l.nodes, node, l.perNode, now).ReserveN(now, 1))
	}
	if l.perNamespace != nil {
		rs = append(rs, bucket(l.namespaces, namespace, l.perNamespace, now).ReserveN(now, 1))
	}
	var wait time.Duration
	for _, r := range rs {
		wait = max(wait, r.DelayFrom(now))
	}
	if wait > 0 {
		for _, r := range rs {
			r.CancelAt(now)
		}
	}
	return wait
}

// maxBuckets bounds each bucket map: beyond it, buckets that are full again
// (their node or namespace has been quiet) are dropped; a new bucket starts
// full, so dropping one changes nothing for its key.
const maxBuckets = 4096

func bucket(m map[string]*rate.Limiter, key string, r *config.Rate, now time.Time) *rate.Limiter {
	l, ok := m[key]
	if !ok {
		if len(m) >= maxBuckets {
			for k, old := range m {
				if old.TokensAt(now) >= float64(old.Burst()) {
					delete(m, k)
				}
			}
		}
		l = rate.NewLimiter(rate.Limit(r.QPS), r.Burst)
		m[key] = l
	}
	return l
}
