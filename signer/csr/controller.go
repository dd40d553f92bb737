package csr

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/internal/workers"
	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Waits of requests that cannot go on now.
const (
	permissionWait  = 5 * time.Second
	unavailableWait = time.Second
	// finishTimeout bounds the status write of a CSR in flight when
	// shutdown begins (beyond the signature's own SignTimeout).
	finishTimeout = 10 * time.Second
)

// Signer is one CSR signer name the controller owns.
type Signer struct {
	Policy *Policy
	// Issuer is the same one the PodCertificateRequest controller uses for
	// this name (signer/generations).
	Issuer issuer.Issuer
}

// Options configure New.
type Options struct {
	Client  kubernetes.Interface
	Signers []*Signer
	Workers int
	// SignTimeout bounds one backend signature (default 30s).
	SignTimeout time.Duration
	// Permissions, if set, blocks signer names the signer may not sign for.
	Permissions pcr.Permissions
	// Recorder, if set, records a Warning Event on each Failed CSR, at
	// most EventsPerSecond (burst ten seconds' worth; default
	// config.DefaultEventsPerSecond); more are dropped.
	Recorder        record.EventRecorder
	EventsPerSecond float64
	// Metrics, if set, gets keyward_csr_outcomes_total.
	Metrics prometheus.Registerer
	Clock   clock.Clock
	// Fence, if set, bounds every signature and status write to the time
	// this replica is sure to hold the Lease (kubeclient.Fence).
	Fence pcr.Fence
}

type queueKey struct{ signer, name string }

// Controller signs CertificateSigningRequests. Build it with New, run it
// with Run.
type Controller struct {
	opts     Options
	signers  map[string]*signerState
	queue    workqueue.TypedRateLimitingInterface[queueKey]
	outcomes *prometheus.CounterVec
	events   *rate.Limiter

	synced atomic.Bool
	// informers are started once, standing by or leading.
	informers *workers.Informers
	// loud spaces the loud retry lines per signer name.
	loud workers.Loud
	// parked are the CSRs that met a shut fence, handed back to the
	// queue when it opens.
	parked workers.Parked[queueKey]

	mu      sync.Mutex
	records map[types.UID]*reqRecord
	// elsewhere holds the signer names for which a certificate by another
	// CA was seen written first (logged once per name).
	elsewhere map[string]bool
}

type signerState struct {
	*Signer
}

// reqRecord is what the controller remembers of one CSR (by UID): the
// certificate signed for it, written again (never signed again) after a
// conflict or a transient error, and whether it is written.
type reqRecord struct {
	certificate []byte
	serial      string
	notAfter    time.Time
	written     bool
}

type allowAll struct{}

func (allowAll) Blocked(string) error                    { return nil }
func (allowAll) Refused(context.Context, string, string) {}

// New validates opts and builds the controller. It starts nothing.
func New(opts Options) (*Controller, error) {
	if opts.Client == nil || len(opts.Signers) == 0 {
		return nil, errors.New("csr controller needs a client and at least one signer")
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
	if opts.Permissions == nil {
		opts.Permissions = allowAll{}
	}
	if opts.EventsPerSecond <= 0 {
		opts.EventsPerSecond = config.DefaultEventsPerSecond
	}
	c := &Controller{
		opts: opts, signers: map[string]*signerState{}, records: map[types.UID]*reqRecord{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[queueKey](100*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[queueKey]{Name: "keyward-csr"}),
		outcomes: newOutcomes(),
		events:   rate.NewLimiter(rate.Limit(opts.EventsPerSecond), int(max(1, 10*opts.EventsPerSecond))),
	}
	if opts.Metrics != nil {
		if err := opts.Metrics.Register(c.outcomes); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, fmt.Errorf("registering CSR metrics: %w", err)
			}
			c.outcomes = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	for _, s := range opts.Signers {
		if s.Policy == nil || s.Issuer == nil {
			return nil, errors.New("csr signer needs a policy and an issuer")
		}
		if _, dup := c.signers[s.Policy.Name]; dup {
			return nil, fmt.Errorf("signer %s given twice", s.Policy.Name)
		}
		c.signers[s.Policy.Name] = &signerState{Signer: s}
	}
	c.informers = workers.NewInformers(slices.Collect(maps.Keys(c.signers)), c.newInformer, workers.Handlers(c.enqueue, c.forget))
	return c, nil
}

// HasSynced reports whether every informer has synced (for /readyz).
func (c *Controller) HasSynced() bool {
	return c.synced.Load()
}

// newInformer watches the CSRs of one signer name only, trimmed (cache.go).
func (c *Controller) newInformer(name string) cache.SharedIndexInformer {
	sel := fields.OneTermEqualSelector("spec.signerName", name).String()
	csrs := c.opts.Client.CertificatesV1().CertificateSigningRequests()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return csrs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return csrs.Watch(ctx, o)
		},
	}
	inf := cache.NewSharedIndexInformer(lw, &certv1.CertificateSigningRequest{}, 0, cache.Indexers{})
	utilruntime.Must(inf.SetTransform(trim)) // fails only once started
	return inf
}

// Warm reports whether Start has run and every informer has synced: a
// standby that could take over without a LIST (for /readyz).
func (c *Controller) Warm() bool { return c.informers.Warm() }

// Start starts the informers (once) on ctx, which should last as long as
// the process: a standby keeps its caches warm. It returns at once.
func (c *Controller) Start(ctx context.Context) error {
	return c.informers.Start(ctx, func() {
		klog.FromContext(ctx).Info("CSR caches warm", "signers", len(c.signers))
	})
}

// Run starts the informers unless Start did, and the workers, and blocks
// until ctx ends. Informers started before Run (a standby's) are marked
// (workers.CatchUp): until each has caught up, a CSR is read from the
// apiserver before it is signed.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	// Only a standby's caches can trail a previous leader's writes; with
	// no leader election (no Fence) there was none.
	warm := c.informers.Started() && c.opts.Fence != nil
	if err := c.Start(ctx); err != nil {
		return err
	}
	if c.opts.Fence != nil {
		go c.parked.Release(ctx, c.opts.Fence.Open, c.queue.Add)
	}
	logger.Info("Waiting for CSR caches", "signers", len(c.signers), "warm", warm)
	workers.RunSynced(ctx, c.informers.Synced(), func() {
		if warm {
			c.informers.MarkCatchUp(ctx, c.currentRV)
		}
		c.synced.Store(true)
		logger.Info("CSR caches synced; signing", "workers", c.opts.Workers)
	}, c.opts.Workers, c.queue, c.processNext)
	return nil
}

// currentRV is the resourceVersion of a quorum read of name's CSRs.
func (c *Controller) currentRV(ctx context.Context, name string) (string, error) {
	l, err := c.opts.Client.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{
		Limit: 1, FieldSelector: fields.OneTermEqualSelector("spec.signerName", name).String()})
	if err != nil {
		return "", err
	}
	return l.ResourceVersion, nil
}

func (c *Controller) enqueue(signer string, obj any) {
	csr, ok := obj.(*certv1.CertificateSigningRequest)
	if !ok {
		return
	}
	if done(csr) {
		c.drop(csr.UID)
		return
	}
	if pending(csr) {
		c.queue.Add(queueKey{signer: signer, name: csr.Name})
	}
}

func (c *Controller) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if csr, ok := obj.(*certv1.CertificateSigningRequest); ok {
		c.drop(csr.UID)
	}
}

func (c *Controller) drop(uid types.UID) {
	c.mu.Lock()
	delete(c.records, uid)
	c.mu.Unlock()
}

func (c *Controller) record(uid types.UID) *reqRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.records[uid]
	if !ok {
		r = &reqRecord{}
		c.records[uid] = r
	}
	return r
}

func (c *Controller) update(uid types.UID, f func(*reqRecord)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.records[uid]; ok {
		f(r)
	}
}

// condition reports whether csr has a condition of type t with status True.
func condition(csr *certv1.CertificateSigningRequest, t certv1.RequestConditionType) bool {
	for _, cond := range csr.Status.Conditions {
		if cond.Type == t && cond.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// done: nothing will ever be signed for csr (signed, denied or failed).
func done(csr *certv1.CertificateSigningRequest) bool {
	return len(csr.Status.Certificate) > 0 || condition(csr, certv1.CertificateDenied) || condition(csr, certv1.CertificateFailed)
}

// pending: csr is approved and waits for its certificate.
func pending(csr *certv1.CertificateSigningRequest) bool {
	return !done(csr) && condition(csr, certv1.CertificateApproved)
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		return false
	}
	after, err := c.sync(ctx, key)
	workers.Settle(c.queue, key, after, err, func(loud bool, attempts int) {
		logger := klog.FromContext(ctx)
		if loud {
			loud, held := c.loud.Allow(key.signer, c.opts.Clock.Now())
			if loud {
				logger.Error(err, "CSR still not signed; retrying with backoff (one such line per signer name a minute)",
					"csr", key.name, "signer", key.signer, "attempts", attempts, "othersHeldBack", held)
				return
			}
		}
		logger.V(2).Info("Retrying CSR", "csr", key.name, "signer", key.signer, "err", err)
	})
	return true
}

// sync signs one approved CSR, or marks it Failed with the rule it broke.
// An error means transient: retried with backoff. A certificate signed
// for a UID is kept until written; it is never signed twice in one
// process. Once ctx has ended no new signature starts; a signature under
// way and its status write finish on a context of their own, so that the
// next leader need not sign again.
func (c *Controller) sync(ctx context.Context, key queueKey) (time.Duration, error) {
	stop := ctx
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.SignTimeout+finishTimeout)
	defer cancel()
	s := c.signers[key.signer]
	// Asked before the read: the store only moves forward, so if it had
	// caught up with the takeover's mark then, the object read shows every
	// write up to it (asked after, a stale copy read first could pass).
	fresh := c.informers.Get(key.signer).Fresh()
	obj, exists, err := c.informers.Get(key.signer).GetIndexer().GetByKey(key.name)
	if err != nil || !exists {
		return 0, err
	}
	csr := obj.(*certv1.CertificateSigningRequest)
	if csr.Spec.SignerName != s.Policy.Name || !pending(csr) {
		return 0, nil
	}
	rec := c.record(csr.UID)
	c.mu.Lock()
	written, cert := rec.written, rec.certificate
	c.mu.Unlock()
	if written {
		return 0, nil
	}
	if err := c.opts.Permissions.Blocked(s.Policy.Name); err != nil {
		return permissionWait, nil
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
	if cert == nil {
		req, err := ParseRequest(csr.Spec.Request)
		if err != nil {
			var v *Violation
			if !errors.As(err, &v) {
				v = violation(ReasonInvalidRequest, "%v", err)
			}
			return c.fail(ctx, s, csr, v)
		}
		if v := s.Policy.Check(req, csr.Spec.Usages); v != nil {
			return c.fail(ctx, s, csr, v)
		}
		if err := stop.Err(); err != nil {
			return 0, err
		}
		if !fresh {
			// Just took over: one quorum read says whether the previous
			// leader signed it already.
			fresh, err := c.opts.Client.CertificatesV1().CertificateSigningRequests().Get(ctx, csr.Name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				return 0, nil
			case err != nil:
				return 0, err
			case fresh.UID != csr.UID || !pending(fresh):
				return 0, nil
			}
		}
		auth, gen, err := s.Issuer.Current()
		if err != nil {
			// No generation may issue (the Issuer logs why, once).
			return unavailableWait, nil
		}
		cert, err = c.issue(ctx, s, csr, req, auth, gen)
		if err != nil && errors.Is(context.Cause(ctx), kubeclient.ErrFenced) {
			c.parked.Park(key) // until the fence opens again
			return 0, nil
		}
		if err != nil {
			if pcr.Classify(err) == pcr.Transient {
				return 0, err
			}
			return c.fail(ctx, s, csr, violation(ReasonBackendFailure, "signing with the CA key failed: %v", err))
		}
	}
	return c.write(ctx, s, csr, cert)
}

// issue signs the leaf under the Active generation, after Reserve, and
// keeps it in the CSR's record.
func (c *Controller) issue(ctx context.Context, s *signerState, csr *certv1.CertificateSigningRequest, req *x509.CertificateRequest, auth *authority.Authority, gen string) ([]byte, error) {
	tmpl, err := Template(req, csr.Spec.Usages)
	if err != nil {
		return nil, err
	}
	lifetime := s.Policy.Lifetime(csr.Spec.ExpirationSeconds)
	sctx, cancel := context.WithTimeout(ctx, c.opts.SignTimeout)
	defer cancel()
	now := c.opts.Clock.Now()
	if err := s.Issuer.Reserve(sctx, gen, now.Add(lifetime)); err != nil {
		return nil, err
	}
	leaf, err := auth.Sign(sctx, tmpl, req.PublicKey, authority.Policy{
		Lifetime: lifetime, Backdate: min(s.Policy.Backdate, lifetime/2), MinLifetime: min(lifetime, config.MinLifetime),
		Now: func() time.Time { return now },
	})
	if err != nil {
		return nil, err
	}
	// The leaf, then the issuers up to (not including) a self-signed root.
	out := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw})
	out = append(out, auth.IssuersPEM()...)
	c.update(csr.UID, func(r *reqRecord) {
		r.certificate, r.serial, r.notAfter = out, leaf.SerialNumber.Text(16), leaf.NotAfter
	})
	// Before the write, as for PCRs: a certificate whose write answer is
	// lost, or a replica killed mid-write, is still named in the log.
	klog.FromContext(ctx).Info("CSR certificate signed", "csr", csr.Name, "signer", s.Policy.Name, "uid", string(csr.UID),
		"serial", leaf.SerialNumber.Text(16), "caKeyID", auth.Signer().KeyVersion())
	return out, nil
}

// write sets status.certificate once. On a conflict it reads the CSR
// anew: done elsewhere means nothing more to do; still approved and
// unsigned, the same certificate is written to the fresh copy.
func (c *Controller) write(ctx context.Context, s *signerState, csr *certv1.CertificateSigningRequest, cert []byte) (time.Duration, error) {
	csrs := c.opts.Client.CertificatesV1().CertificateSigningRequests()
	cur := csr.DeepCopy()
	// Read before writing: once the write lands, the informer's update can
	// drop the record before this function logs.
	c.mu.Lock()
	serial, notAfter := "", time.Time{}
	if rec := c.records[csr.UID]; rec != nil {
		serial, notAfter = rec.serial, rec.notAfter
	}
	c.mu.Unlock()
	for attempt := 0; ; attempt++ {
		cur.Status.Certificate = cert
		_, err := csrs.UpdateStatus(ctx, cur, metav1.UpdateOptions{})
		switch {
		case err == nil:
			c.update(csr.UID, func(r *reqRecord) { r.written, r.certificate = true, nil })
			c.outcomes.WithLabelValues(s.Policy.Name, "Issued", "Issued").Inc()
			klog.FromContext(ctx).Info("Signed CSR", "csr", csr.Name, "signer", s.Policy.Name, "user", csr.Spec.Username,
				"serial", serial, "notAfter", notAfter.UTC().Format(time.RFC3339))
			return 0, nil
		case apierrors.IsNotFound(err):
			c.drop(csr.UID)
			return 0, nil
		case pcr.IsMissingGrant(err):
			c.opts.Permissions.Refused(ctx, s.Policy.Name, err.Error())
			return permissionWait, nil
		case apierrors.IsConflict(err) && attempt < 3:
			fresh, gerr := csrs.Get(ctx, csr.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(gerr) {
				c.drop(csr.UID)
				return 0, nil
			}
			if gerr != nil {
				return 0, gerr
			}
			if fresh.UID != csr.UID || !pending(fresh) {
				// Signed, denied or failed meanwhile (or a new CSR of the
				// same name): this certificate is never written.
				c.update(csr.UID, func(r *reqRecord) { r.written, r.certificate = true, nil })
				if fresh.UID == csr.UID && len(fresh.Status.Certificate) > 0 {
					c.signedElsewhere(ctx, s, csr, cert, fresh.Status.Certificate)
				}
				return 0, nil
			}
			cur = fresh.DeepCopy()
		case apierrors.IsInvalid(err) || apierrors.IsForbidden(err):
			// Invalid, or refused by an admission webhook or policy (a
			// missing grant is handled above).
			c.update(csr.UID, func(r *reqRecord) { r.certificate = nil })
			return c.fail(ctx, s, csr, violation(ReasonStatusRejected, "kube-apiserver refused the certificate: %v", err))
		default:
			return 0, err
		}
	}
}

// signedElsewhere reports a CSR whose certificate another signer wrote
// first: a leaf from another CA (not the issuer of ours) means a second
// signer serves this name, most likely kube-controller-manager's
// csrsigning controller. Said once per signer name at default verbosity;
// a leaf of our own CA (a previous leader's, during a handover) only at V(2).
func (c *Controller) signedElsewhere(ctx context.Context, s *signerState, csr *certv1.CertificateSigningRequest, ours, written []byte) {
	logger := klog.FromContext(ctx)
	theirLeaf := firstCertificate(written)
	if sameIssuers(ours, written) {
		logger.V(2).Info("CSR already carries a certificate of this CA (written by another replica)", "csr", csr.Name, "signer", s.Policy.Name)
		return
	}
	c.outcomes.WithLabelValues(s.Policy.Name, "SignedElsewhere", "SignedElsewhere").Inc()
	issuer := "unparsable certificate"
	if theirLeaf != nil {
		issuer = theirLeaf.Issuer.String()
	}
	c.mu.Lock()
	first := !c.elsewhere[s.Policy.Name]
	if c.elsewhere == nil {
		c.elsewhere = map[string]bool{}
	}
	c.elsewhere[s.Policy.Name] = true
	c.mu.Unlock()
	if first {
		logger.Error(nil, "Another signer wrote this CSR's certificate first; is kube-controller-manager's csrsigning controller still signing this name? (docs/signers.md, Handing the kubernetes.io names to keyward)",
			"csr", csr.Name, "signer", s.Policy.Name, "issuer", issuer)
	} else {
		logger.V(2).Info("Another signer wrote this CSR's certificate first", "csr", csr.Name, "signer", s.Policy.Name, "issuer", issuer)
	}
}

// firstCertificate parses the first CERTIFICATE block of PEM data, or nil.
// sameIssuers reports whether two certificate chains share an issuer
// (subject and key id) at any level: the same CA generation, directly or
// through an in-memory intermediate (signers[].intermediate), which
// differs from replica to replica.
func sameIssuers(a, b []byte) bool {
	issuers := map[string]bool{}
	for _, c := range certificates(a) {
		issuers[string(c.RawIssuer)+"\x00"+string(c.AuthorityKeyId)] = true
	}
	for _, c := range certificates(b) {
		if issuers[string(c.RawIssuer)+"\x00"+string(c.AuthorityKeyId)] {
			return true
		}
	}
	return false
}

// certificates parses every CERTIFICATE block of data, stopping at the
// first that does not parse.
func certificates(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return out
		}
		if b.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return out
			}
			out = append(out, c)
		}
	}
}

func firstCertificate(data []byte) *x509.Certificate {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil
		}
		if b.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				return nil
			}
			return c
		}
	}
}

// fail adds a Failed condition naming the broken rule. Nothing is signed
// for the CSR afterwards.
func (c *Controller) fail(ctx context.Context, s *signerState, csr *certv1.CertificateSigningRequest, v *Violation) (time.Duration, error) {
	msg := kubemsg.Truncate(v.Message, kubemsg.MaxConditionMessage)
	cur := csr.DeepCopy()
	now := metav1.NewTime(c.opts.Clock.Now())
	cur.Status.Conditions = append(cur.Status.Conditions, certv1.CertificateSigningRequestCondition{
		Type: certv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: v.Reason, Message: msg,
		LastUpdateTime: now, LastTransitionTime: now,
	})
	_, err := c.opts.Client.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.drop(csr.UID)
		return 0, nil
	case pcr.IsMissingGrant(err):
		c.opts.Permissions.Refused(ctx, s.Policy.Name, err.Error())
		return permissionWait, nil
	case err != nil:
		// A conflict is retried on the informer's newer copy; a refusal
		// by an admission webhook or policy, with backoff.
		return 0, err
	}
	c.update(csr.UID, func(r *reqRecord) { r.written, r.certificate = true, nil })
	c.outcomes.WithLabelValues(s.Policy.Name, "Failed", v.Reason).Inc()
	klog.FromContext(ctx).Info("CSR Failed", "csr", csr.Name, "signer", s.Policy.Name, "user", csr.Spec.Username, "reason", v.Reason, "message", msg)
	if c.opts.Recorder != nil && c.events.Allow() {
		c.opts.Recorder.Event(cur, corev1.EventTypeWarning, v.Reason, kubemsg.Truncate("Failed: "+msg, kubemsg.MaxEventMessage))
	}
	return 0, nil
}

func newOutcomes() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "keyward_csr_outcomes_total",
		Help: "CertificateSigningRequests signed or marked Failed, by signer, outcome and reason.",
	}, []string{"signer", "outcome", "reason"})
}

// RegisterMetrics registers the series the CertificateSigningRequest
// controller exports on reg, as New does; the metrics reference
// (deploy/observability) reads them from there.
func RegisterMetrics(reg prometheus.Registerer) error {
	return reg.Register(newOutcomes())
}
