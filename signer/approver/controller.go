// Package approver is keyward's CertificateSigningRequest approver: it
// approves or denies CSRs for the configured signer names that keyward
// approves (the two kubelet names, and csr names with an approval
// section), writing only the approval subresource. Kubelet client CSRs are
// approved exactly as kube-controller-manager's csrapproving controller
// does (a SubjectAccessReview on certificatesigningrequests/nodeclient or
// selfnodeclient); kubelet serving CSRs only for the node itself and for
// names and addresses its Node object lists; custom names by the rules of
// the configuration, deny by default. It never touches a CSR that is
// already Approved, Denied or Failed, or that has a certificate.
package approver

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/internal/workers"
	"github.com/keyward/keyward/signer/config"
	csrsigner "github.com/keyward/keyward/signer/csr"
	authorizationv1 "k8s.io/api/authorization/v1"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	certinformers "k8s.io/client-go/informers/certificates/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// DefaultNodeWait is how long a kubelet serving CSR waits for its Node
// object before it is Denied (NodeNotFound).
const DefaultNodeWait = 5 * time.Minute

// Signer names whose approval rules are built in.
var (
	kubeletClientName  = config.KubernetesSignerNames[config.ProfileKubeAPIServerClientKubelet]
	kubeletServingName = config.KubernetesSignerNames[config.ProfileKubeletServing]
)

// Options configure New.
type Options struct {
	Client kubernetes.Interface
	// Signers are the configured signer names; those the approver serves
	// are picked by Approves.
	Signers []config.Signer
	Workers int
	// NodeWait bounds how long a kubelet serving CSR whose Node does not
	// exist is looked at again before it is Denied (default DefaultNodeWait,
	// counted from the CSR's creation).
	NodeWait time.Duration
	Metrics  *Metrics
	// Recorder, if set, records an Event on each CSR approved or denied.
	Recorder record.EventRecorder
	Clock    clock.Clock
}

// Approves reports whether the approver acts on CSRs for s: the kubelet
// client name always; the kubelet serving name and a csr name only with
// an approval section (kube-controller-manager never approves serving
// CSRs: approving them is opt-in); never kubernetes.io/kube-apiserver-client.
func Approves(s config.Signer) bool {
	switch s.Profile {
	case config.ProfileKubeAPIServerClientKubelet:
		return true
	case config.ProfileKubeletServing, config.ProfileCSR:
		return s.Approval != nil
	}
	return false
}

type rules struct {
	name     string
	serving  *servingRules
	custom   *customRules
	informer cache.SharedIndexInformer
}

type queueKey struct{ signer, name string }

// ReasonNotAutoApproved is the Event reason of a CSR left for a human:
// nothing proves it bad, nothing proves its names the requester's.
const ReasonNotAutoApproved = "NotAutoApproved"

// requesterIndex indexes CSRs by spec.username, so a Node's change looks
// again at its node's undecided CSRs.
const requesterIndex = "requester"

func indexRequester(obj any) ([]string, error) {
	if c, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
		return []string{c.Spec.Username}, nil
	}
	return nil, nil
}

// Controller approves CSRs. Build it with New, run it with Run.
type Controller struct {
	opts  Options
	rules map[string]*rules
	queue workqueue.TypedRateLimitingInterface[queueKey]

	// nodeInformer (nil when no rule reads Nodes) feeds nodes.
	nodeInformer cache.SharedIndexInformer
	// nodesSynced reports whether the Node cache is complete.
	nodesSynced func() bool
	nodes       nodeCache

	synced atomic.Bool
	mu     sync.Mutex
	// held is the message a CSR left for a human was told with, so each
	// is said once (and again only if the reason changes).
	held map[queueKey]string
	// told holds what was already said at default verbosity: a refused
	// grant per signer name and refusal, an unauthorized CSR per name.
	told map[string]bool
}

// tellOnce reports whether key is new (and remembers it).
func (c *Controller) tellOnce(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.told == nil {
		c.told = map[string]bool{}
	}
	if c.told[key] {
		return false
	}
	c.told[key] = true
	return true
}

// unauthorizedKey is tellOnce's key for a CSR left undecided because its
// requester is not authorized. It is forgotten once the CSR is decided or
// deleted (its sync returns nil), so a long-running approver does not keep
// one entry per CSR name it ever saw.
func unauthorizedKey(key queueKey) string { return "unauthorized/" + key.signer + "/" + key.name }

// forgetTold forgets key, so that it is told again if it comes back.
func (c *Controller) forgetTold(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.told, key)
}

// forbiddenWait is how long a CSR waits after the apiserver refused one of
// the approver's own calls (a grant is missing; backoff would only hide it).
const forbiddenWait = 30 * time.Second

// New validates opts and builds the controller. It starts nothing.
func New(opts Options) (*Controller, error) {
	if opts.Client == nil || opts.Metrics == nil {
		return nil, errors.New("approver needs a client and metrics")
	}
	if opts.Workers <= 0 {
		opts.Workers = config.DefaultWorkers
	}
	if opts.NodeWait <= 0 {
		opts.NodeWait = DefaultNodeWait
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	c := &Controller{opts: opts, rules: map[string]*rules{},
		// kube-controller-manager's certificate controllers back off from
		// 200ms to 1000s: a CSR whose SubjectAccessReview says no is looked
		// at again, rarely, in case the grant comes.
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[queueKey](200*time.Millisecond, 1000*time.Second),
			workqueue.TypedRateLimitingQueueConfig[queueKey]{Name: "keyward-approver"}),
	}
	for _, s := range opts.Signers {
		if !Approves(s) {
			continue
		}
		r := &rules{name: s.Name}
		var err error
		switch s.Profile {
		case config.ProfileKubeletServing:
			if r.serving, err = newServingRules(s.Approval); err != nil {
				return nil, fmt.Errorf("signer %s: %w", s.Name, err)
			}
		case config.ProfileCSR:
			// csr.NewPolicy's errors name the signer.
			if r.custom, err = newCustomRules(s); err != nil {
				return nil, err
			}
		}
		c.rules[s.Name] = r
	}
	// Run starts it only if a rule reads Nodes; no resync: Node events
	// requeue their node's CSRs.
	c.nodeInformer = coreinformers.NewNodeInformer(opts.Client, 0, cache.Indexers{nodeIPIndex: indexNodeIPs})
	c.nodes = nodeCache{store: c.nodeInformer.GetIndexer()}
	c.nodesSynced = c.nodeInformer.HasSynced
	return c, nil
}

// readsNodes reports whether a rule looks at Nodes: kubelet serving, and
// nodeBound csr names (IP SANs).
func (c *Controller) readsNodes() bool {
	for _, r := range c.rules {
		if r.serving != nil || r.custom != nil && r.custom.nodeBound {
			return true
		}
	}
	return false
}

// SignerNames are the names the controller approves for.
func (c *Controller) SignerNames() []string {
	var out []string
	for n := range c.rules {
		out = append(out, n)
	}
	return out
}

// HasSynced reports whether every informer has synced (for /readyz).
func (c *Controller) HasSynced() bool {
	return c.synced.Load()
}

// Run starts one informer per signer name (a spec.signerName field
// selector) and the workers, and blocks until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer c.queue.ShutDown()
	logger := klog.FromContext(ctx)
	if len(c.rules) == 0 {
		// A configuration shared with the signer may have nothing to
		// approve yet; say so once and idle rather than crash-loop.
		logger.Info("Nothing to approve: configure a kubeAPIServerClientKubelet or kubeletServing signer name, or a csr name with an approval section")
		c.synced.Store(true)
		<-ctx.Done()
		return nil
	}
	var syncs []cache.InformerSynced
	for name, r := range c.rules {
		r.informer = certinformers.NewFilteredCertificateSigningRequestInformer(c.opts.Client, 0, cache.Indexers{requesterIndex: indexRequester},
			func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", name).String()
			})
		if _, err := r.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.enqueue(name, obj) },
			UpdateFunc: func(_, obj any) { c.enqueue(name, obj) },
			DeleteFunc: func(obj any) { c.forgetHeld(name, obj) },
		}); err != nil {
			return fmt.Errorf("watching CSRs for %s: %w", name, err)
		}
		go r.informer.Run(ctx.Done())
		syncs = append(syncs, r.informer.HasSynced)
	}
	if c.readsNodes() {
		if _, err := c.nodeInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { c.nodeChanged(obj) },
			UpdateFunc: func(_, obj any) { c.nodeChanged(obj) },
		}); err != nil {
			return fmt.Errorf("watching Nodes: %w", err)
		}
		// Not among the caches every CSR waits for: kubelet client CSRs
		// need no Node, and a missing nodes grant must not stop them.
		// A decision that reads Nodes waits in getNode instead.
		if err := c.nodeInformer.SetWatchErrorHandlerWithContext(func(ctx context.Context, r *cache.Reflector, err error) {
			if !apierrors.IsForbidden(err) {
				cache.DefaultWatchErrorHandler(ctx, r, err)
				return
			}
			// Said once here, not by client-go at every retry.
			if c.tellOnce("forbidden/nodes") {
				klog.FromContext(ctx).Error(err, "The apiserver refused the approver's Node list: kubelet serving and nodeBound CSRs wait until its identity may list and watch nodes (keyward deploy rbac --approver; deploy/kustomize/base/rbac.yaml); kubelet client CSRs are decided meanwhile")
			} else {
				klog.FromContext(ctx).V(2).Info("Node list still refused", "err", err.Error())
			}
		}); err != nil {
			return fmt.Errorf("handling the Node informer's watch errors: %w", err)
		}
		go c.nodeInformer.Run(ctx.Done())
	}
	logger.Info("Waiting for caches", "signers", c.SignerNames())
	workers.RunSynced(ctx, syncs, func() {
		c.synced.Store(true)
		logger.Info("Caches synced; approving", "workers", c.opts.Workers)
	}, c.opts.Workers, c.queue, c.processNext)
	return nil
}

func (c *Controller) enqueue(signer string, obj any) {
	csr, ok := obj.(*certificatesv1.CertificateSigningRequest)
	if !ok || decided(csr) {
		return
	}
	c.queue.Add(queueKey{signer: signer, name: csr.Name})
}

// nodeChanged looks again at the undecided CSRs the Node's node asked
// for: its addresses (or its existence) may decide them now.
func (c *Controller) nodeChanged(obj any) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return
	}
	for name, r := range c.rules {
		if r.informer == nil || r.serving == nil && (r.custom == nil || !r.custom.nodeBound) {
			continue
		}
		objs, _ := r.informer.GetIndexer().ByIndex(requesterIndex, nodeUserPrefix+n.Name)
		for _, o := range objs {
			c.enqueue(name, o)
		}
	}
}

// forgetHeld forgets what was told of a deleted CSR.
func (c *Controller) forgetHeld(signer string, obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	if csr, ok := obj.(*certificatesv1.CertificateSigningRequest); ok {
		c.mu.Lock()
		delete(c.held, queueKey{signer: signer, name: csr.Name})
		c.mu.Unlock()
	}
}

// leave leaves a CSR for a human: said once per CSR and message at the
// default verbosity, as a NotAutoApproved Event and in the decisions
// metric (outcome "held").
func (c *Controller) leave(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, d *denial) error {
	key := queueKey{signer: csr.Spec.SignerName, name: csr.Name}
	msg := kubemsg.Truncate("Not approved automatically, left for a human to approve or deny: "+d.message, kubemsg.MaxEventMessage)
	c.mu.Lock()
	if c.held == nil {
		c.held = map[queueKey]string{}
	}
	told := c.held[key] == msg
	c.held[key] = msg
	c.mu.Unlock()
	if told {
		return nil
	}
	c.opts.Metrics.Decisions.WithLabelValues(csr.Spec.SignerName, "held", d.reason).Inc()
	klog.FromContext(ctx).Info("CSR left for a human", "csr", csr.Name, "signer", csr.Spec.SignerName, "user", csr.Spec.Username, "reason", d.reason, "message", msg)
	if c.opts.Recorder != nil {
		c.opts.Recorder.Event(csr, corev1.EventTypeWarning, ReasonNotAutoApproved, msg)
	}
	return nil
}

// waitError asks for the key to be looked at again after a fixed time.
type waitError struct {
	after time.Duration
	err   error
}

func (e *waitError) Error() string { return e.err.Error() }
func (e *waitError) Unwrap() error { return e.err }

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if ctx.Err() != nil {
		return false
	}
	err := c.sync(ctx, key)
	var w *waitError
	switch {
	case err == nil:
		c.queue.Forget(key)
		c.forgetTold(unauthorizedKey(key))
	case errors.As(err, &w):
		klog.FromContext(ctx).V(2).Info("Looking again later", "csr", key.name, "signer", key.signer, "after", w.after, "reason", err)
		c.queue.Forget(key)
		c.queue.AddAfter(key, w.after)
	case apierrors.IsForbidden(err):
		// The approver's identity lacks a grant: say so once per signer
		// name (at default verbosity) and look again at a steady pace.
		if c.tellOnce("forbidden/" + key.signer) {
			klog.FromContext(ctx).Error(err, "The apiserver refused the approver: grant its identity approve on certificates.k8s.io signers "+key.signer+
				", update on certificatesigningrequests/approval, list and watch on nodes and create on subjectaccessreviews (keyward deploy rbac --approver renders them from the signer configuration; deploy/kustomize/base/rbac.yaml)",
				"signer", key.signer, "csr", key.name)
		}
		c.opts.Metrics.Retries.WithLabelValues(key.signer).Inc()
		c.queue.Forget(key)
		c.queue.AddAfter(key, forbiddenWait)
	default:
		c.opts.Metrics.Retries.WithLabelValues(key.signer).Inc()
		if errors.Is(err, errNotAuthorized) && c.tellOnce(unauthorizedKey(key)) {
			klog.FromContext(ctx).Info("Leaving kubelet client CSR undecided until its requester is authorized: bind system:certificates.k8s.io:certificatesigningrequests:nodeclient (bootstrap) or …:selfnodeclient (renewal) to the requester, as kubeadm does",
				"csr", key.name, "signer", key.signer, "reason", err.Error())
		}
		klog.FromContext(ctx).V(2).Info("Retrying with backoff", "csr", key.name, "signer", key.signer, "err", err)
		c.queue.AddRateLimited(key)
	}
	return true
}

// decided reports whether a CSR already has an outcome the approver must
// not change: Approved, Denied, Failed, or a certificate.
func decided(csr *certificatesv1.CertificateSigningRequest) bool {
	if len(csr.Status.Certificate) > 0 {
		return true
	}
	for _, cond := range csr.Status.Conditions {
		switch cond.Type {
		case certificatesv1.CertificateApproved, certificatesv1.CertificateDenied, certificatesv1.CertificateFailed:
			return true
		}
	}
	return false
}

// sync decides one CSR. Permanent outcomes are written as an Approved or
// Denied condition and return nil; a CSR the rules leave alone returns nil
// too (logged at V(2)); transient failures return an error.
func (c *Controller) sync(ctx context.Context, key queueKey) error {
	r := c.rules[key.signer]
	if r == nil {
		return nil
	}
	obj, exists, err := r.informer.GetStore().GetByKey(key.name)
	if err != nil || !exists {
		return err
	}
	return c.decide(ctx, obj.(*certificatesv1.CertificateSigningRequest))
}

// decide is sync for one CSR as the cache holds it (not modified).
func (c *Controller) decide(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) error {
	r := c.rules[csr.Spec.SignerName]
	if r == nil || decided(csr) {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("csr", csr.Name, "signer", r.name, "user", csr.Spec.Username)
	req, err := csrsigner.ParseRequest(csr.Spec.Request)
	if err != nil {
		// The apiserver parses spec.request on create, so this is not
		// expected. kube-controller-manager leaves such a kubelet client
		// CSR undecided; for the names with keyward's own rules, no rule
		// can approve it.
		if r.name == kubeletClientName {
			logger.V(2).Info("Leaving CSR undecided: spec.request does not parse", "err", err)
			return nil
		}
		return c.write(ctx, csr, false, ReasonInvalidRequest, fmt.Sprintf("parsing spec.request: %v", err))
	}
	switch {
	case r.name == kubeletClientName:
		return c.syncKubeletClient(ctx, logger, csr, req)
	case r.serving != nil:
		return c.syncKubeletServing(ctx, r.serving, csr, req)
	case r.custom != nil:
		return c.syncCustom(ctx, r.custom, csr, req)
	}
	return nil
}

func (c *Controller) syncCustom(ctx context.Context, r *customRules, csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) error {
	if d := r.check(csr, req); d != nil {
		return c.write(ctx, csr, false, d.reason, d.message)
	}
	if !r.nodeBound {
		return c.write(ctx, csr, true, ReasonAutoApproved, "Approved by keyward: the requester is in approval.users/groups and the request is within the signer's csr rules")
	}
	nodeName, _ := requestingNode(csr) // check made sure it is one
	if len(req.IPAddresses) > 0 {
		node, err := c.getNode(ctx, csr, nodeName)
		if node == nil {
			return err
		}
		if d := nodeIPs(req, node, c.nodes); d != nil {
			return c.write(ctx, csr, false, d.reason, d.message)
		}
	}
	return c.write(ctx, csr, true, ReasonAutoApproved, fmt.Sprintf("Approved by keyward: requested by node %s for its own names (approval.nodeBound), within approval.users/groups and the signer's csr rules", nodeName))
}

// getNode gets the Node a CSR names. While it does not exist it returns
// a waitError until Options.NodeWait after the CSR's creation, then writes
// the NodeNotFound denial; either way the Node is nil.
func (c *Controller) getNode(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, nodeName string) (*corev1.Node, error) {
	// An unsynced cache would miss the Node, or another Node holding the
	// same IP: nothing is decided on it.
	if c.nodesSynced != nil && !c.nodesSynced() {
		return nil, &waitError{after: 10 * time.Second, err: errors.New("the Node cache has not synced yet (can the approver list and watch nodes?)")}
	}
	node, ok := c.nodes.get(nodeName)
	if !ok {
		waited := c.opts.Clock.Since(csr.CreationTimestamp.Time)
		if waited >= c.opts.NodeWait {
			return nil, c.write(ctx, csr, false, ReasonNodeNotFound, fmt.Sprintf("Node %s does not exist (waited %s after the CSR was created)", nodeName, c.opts.NodeWait))
		}
		return nil, &waitError{after: min(10*time.Second, c.opts.NodeWait-waited), err: fmt.Errorf("Node %s does not exist yet", nodeName)}
	}
	return node, nil
}

// errNotAuthorized: a recognised kubelet client CSR whose requester the
// SubjectAccessReviews did not allow; left undecided and looked at again
// with backoff, as kube-controller-manager does.
var errNotAuthorized = errors.New("recognised as a kubelet client CSR but no SubjectAccessReview allowed the requester")

type recognizer struct {
	subresource string
	self        bool
	message     string
}

// The order is kube-controller-manager's: a node renewing its own
// credential first, then bootstrap.
var kubeletClientRecognizers = []recognizer{
	{subresource: "selfnodeclient", self: true, message: "Auto approving self kubelet client certificate after SubjectAccessReview (keyward)."},
	{subresource: "nodeclient", message: "Auto approving kubelet client certificate after SubjectAccessReview (keyward)."},
}

func (c *Controller) syncKubeletClient(ctx context.Context, logger klog.Logger, csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) error {
	if v := csrsigner.CheckKubeletClient(req, csr.Spec.Usages); v != nil {
		logger.V(2).Info("Leaving CSR undecided: not a kubelet client CSR kube-controller-manager would approve", "why", v.Message)
		return nil
	}
	var tried []string
	for _, rec := range kubeletClientRecognizers {
		if rec.self && csr.Spec.Username != req.Subject.CommonName {
			continue
		}
		tried = append(tried, rec.subresource)
		allowed, err := c.authorize(ctx, csr, rec.subresource)
		if err != nil {
			return err
		}
		if allowed {
			return c.write(ctx, csr, true, ReasonAutoApproved, rec.message)
		}
	}
	return fmt.Errorf("%w (create on certificatesigningrequests/%v)", errNotAuthorized, tried)
}

// authorize asks the apiserver whether the CSR's requester may create
// certificatesigningrequests/subresource.
func (c *Controller) authorize(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, subresource string) (bool, error) {
	extra := map[string]authorizationv1.ExtraValue{}
	for k, v := range csr.Spec.Extra {
		extra[k] = authorizationv1.ExtraValue(v)
	}
	sar, err := c.opts.Client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User: csr.Spec.Username, UID: csr.Spec.UID, Groups: csr.Spec.Groups, Extra: extra,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Verb: "create", Subresource: subresource,
			},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("creating a SubjectAccessReview for %s: %w", subresource, err)
	}
	return sar.Status.Allowed, nil
}

func (c *Controller) syncKubeletServing(ctx context.Context, r *servingRules, csr *certificatesv1.CertificateSigningRequest, req *x509.CertificateRequest) error {
	nodeName, d := servingShape(csr, req)
	if d != nil {
		return c.write(ctx, csr, false, d.reason, d.message)
	}
	node, err := c.getNode(ctx, csr, nodeName)
	if node == nil {
		return err
	}
	if d := r.servingSANs(req, node, c.nodes); d != nil {
		if d.hold {
			return c.leave(ctx, csr, d)
		}
		return c.write(ctx, csr, false, d.reason, d.message)
	}
	return c.write(ctx, csr, true, ReasonAutoApproved, fmt.Sprintf("Approved by keyward: requested by node %s itself; every DNS subjectAltName is its name or its name under approval.allowedDNSSuffixes, every IP one of Node %s's addresses in approval.allowedIPRanges and of no other Node", nodeName, nodeName))
}

// write adds the Approved or Denied condition through the approval
// subresource, records the outcome and logs it once.
func (c *Controller) write(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, approve bool, reason, message string) error {
	csr = csr.DeepCopy()
	message = kubemsg.Truncate(message, kubemsg.MaxConditionMessage)
	typ, outcome, eventType := certificatesv1.CertificateDenied, "denied", corev1.EventTypeWarning
	if approve {
		typ, outcome, eventType = certificatesv1.CertificateApproved, "approved", corev1.EventTypeNormal
	}
	now := metav1.NewTime(c.opts.Clock.Now())
	csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
		Type: typ, Status: corev1.ConditionTrue, Reason: reason, Message: message, LastUpdateTime: now, LastTransitionTime: now,
	})
	if _, err := c.opts.Client.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, csr.Name, csr, metav1.UpdateOptions{}); err != nil {
		return fmt.Errorf("writing the %s condition: %w", typ, err)
	}
	c.opts.Metrics.Decisions.WithLabelValues(csr.Spec.SignerName, outcome, reason).Inc()
	klog.FromContext(ctx).Info("CSR "+outcome, "csr", csr.Name, "signer", csr.Spec.SignerName, "user", csr.Spec.Username, "reason", reason, "message", kubemsg.Truncate(message, kubemsg.MaxEventMessage))
	if c.opts.Recorder != nil {
		c.opts.Recorder.Event(csr, eventType, reason, kubemsg.Truncate(message, kubemsg.MaxEventMessage))
	}
	return nil
}
