package tokenservice

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"

	"github.com/keyward/keyward/signer/tokenservice/policy"
)

// Reasons a service-account token is refused (RefusedError.Reason).
const (
	ReasonMalformed          = "Malformed"
	ReasonBadSignature       = "BadSignature"
	ReasonExpired            = "Expired"
	ReasonWrongAudience      = "WrongAudience"
	ReasonNotAuthenticated   = "NotAuthenticated"
	ReasonNotServiceAccount  = "NotServiceAccount"
	ReasonNotPodBound        = "NotPodBound"
	ReasonPodGone            = "PodGone"
	ReasonPodFinished        = "PodFinished"
	ReasonServiceAccountGone = "ServiceAccountGone"
)

// The user.extra keys of a pod-bound service-account token.
const (
	extraPodName  = "authentication.kubernetes.io/pod-name"
	extraPodUID   = "authentication.kubernetes.io/pod-uid"
	extraNodeName = "authentication.kubernetes.io/node-name"
)

// ReviewRequest is what a Review is for besides the token.
type ReviewRequest struct {
	// Audiences the token must have one of (default: the reviewer's
	// Audience). A registry with its own audience passes it alone.
	Audiences []string
	// Client is the caller's remote address (host:port or host): the
	// fairness key of a token whose signature could not be verified
	// locally.
	Client string
}

const (
	// MaxTokenBytes bounds a presented service-account token (they are
	// about 1–2 KiB); a longer one is refused without asking the apiserver.
	MaxTokenBytes = 16 << 10
	// reviewTimeout bounds one shared review (TokenReview, Pod,
	// ServiceAccount), whoever waits for it.
	reviewTimeout = 10 * time.Second
	// maxCacheEntries bounds the review cache; past it, expired entries
	// are swept and, if none were, the new review is not cached.
	maxCacheEntries = 10000
	// DefaultMaxConcurrentReviews bounds the reviews under way at once. A
	// review is three requests of a few milliseconds, so a replica within
	// its client's QPS needs a handful; the bound keeps a flood of
	// distinct garbage tokens (no credential needed) from queueing
	// thousands of requests, each a goroutine for up to reviewTimeout,
	// behind the client rate limiter that the leader's Lease renewals
	// and reservation writes share.
	DefaultMaxConcurrentReviews = 64
	// DefaultMaxReviewsPerClient bounds the reviews under way for one
	// client: a token's node (from claims whose signature verified), or
	// else its remote address. One flooding node, even with validly
	// signed tokens, then holds at most a quarter of the slots.
	DefaultMaxReviewsPerClient = DefaultMaxConcurrentReviews / 4
	// maxStatusError bounds how much of the apiserver's status.error a
	// refusal quotes.
	maxStatusError = 512
	// invalidatedError is what kube-apiserver's TokenReview says of a
	// genuine service-account token whose bound object (pod, secret) is
	// gone: only then was the signature verified and the claims are the
	// cluster's (pkg/serviceaccount/claims.go).
	invalidatedError = "service account token has been invalidated"
)

// ErrUnavailable is matched (errors.Is) by a Review error that says
// nothing about the token: the apiserver could not be asked, or refused
// the token service itself (a missing RBAC grant). Callers answer 503.
var ErrUnavailable = errors.New("cannot validate service-account tokens now")

// RefusedError is a Review error for a token that is not accepted.
type RefusedError struct {
	// Reason is one of the Reason constants.
	Reason string
	// Message says why, for the caller (no secret in it).
	Message string
	// Authenticated is true when the apiserver authenticated the token
	// and a later check (pod, service account) refused it; Identity then
	// holds what is known of the caller.
	Authenticated bool
	// Signed is true when the token's signature verified against the
	// service-account issuer's keys but a local check refused it (wrong
	// audience, expired): Identity holds what its claims say.
	Signed   bool
	Identity policy.Identity
}

func (e *RefusedError) Error() string { return "service-account token refused: " + e.Message }

// Review is an accepted service-account token: whose it is and when it
// expires.
type Review struct {
	Identity policy.Identity
	// Expiry is the token's exp claim.
	Expiry time.Time
}

// Reviewer validates service-account tokens. It MUST be safe for
// concurrent use. An error is a *RefusedError (the token is not accepted)
// or matches ErrUnavailable.
type Reviewer interface {
	Review(ctx context.Context, token string, req ReviewRequest) (*Review, error)
}

// ReviewerOptions configure NewReviewer.
type ReviewerOptions struct {
	// Client asks the apiserver (tokenreviews create, pods get,
	// serviceaccounts get). Required.
	Client kubernetes.Interface
	// Audience is the only audience accepted. Required.
	Audience string
	// CacheTTL is how long an accepted review is reused (capped at the
	// token's expiry); zero caches nothing.
	CacheTTL time.Duration
	// MaxConcurrentReviews bounds the reviews under way at once (default
	// DefaultMaxConcurrentReviews); past it a token that needs asking the
	// apiserver is answered ErrUnavailable at once. Cached reviews and
	// callers joining a review under way are not counted.
	MaxConcurrentReviews int
	// MaxReviewsPerClient bounds the reviews under way for one client
	// (default DefaultMaxReviewsPerClient, at most MaxConcurrentReviews):
	// the node a verified token names, else the remote address.
	MaxReviewsPerClient int
	// Keys, if set, verifies each token's signature against the
	// service-account issuer's public keys before any TokenReview; a
	// token they do not verify is refused (BadSignature) at once, never
	// reviewed. Nil: every token is reviewed.
	Keys *IssuerKeys
	// Metrics, if set, observes reviews and cache hits.
	Metrics *Metrics
	Clock   clock.PassiveClock
}

// KubeReviewer is the Reviewer that asks kube-apiserver: a TokenReview
// for the audience, then the bound Pod and the ServiceAccount. Accepted
// reviews are cached by the token's SHA-256; refusals never are.
// Concurrent reviews of one token share one round of requests.
type KubeReviewer struct {
	o ReviewerOptions

	mu      sync.Mutex
	cache   map[[32]byte]cached
	flights map[[32]byte]*reviewFlight
	waiting int // callers waiting for a flight (tests read it)
	// perClient counts the flights of each fairness key.
	perClient map[string]int

	grants grantLog
}

type cached struct {
	review *Review
	until  time.Time
}

type reviewFlight struct {
	client string // fairness key
	done   chan struct{}
	review *Review
	err    error
}

// NewReviewer validates o. It starts nothing.
func NewReviewer(o ReviewerOptions) (*KubeReviewer, error) {
	if o.Client == nil || o.Audience == "" {
		return nil, errors.New("the token reviewer needs a Kubernetes client and an audience")
	}
	if o.CacheTTL < 0 {
		return nil, fmt.Errorf("review cache TTL %s is negative", o.CacheTTL)
	}
	if o.MaxConcurrentReviews < 0 {
		return nil, fmt.Errorf("maximum concurrent reviews %d is negative", o.MaxConcurrentReviews)
	}
	if o.MaxConcurrentReviews == 0 {
		o.MaxConcurrentReviews = DefaultMaxConcurrentReviews
	}
	if o.MaxReviewsPerClient < 0 {
		return nil, fmt.Errorf("maximum reviews per client %d is negative", o.MaxReviewsPerClient)
	}
	if o.MaxReviewsPerClient == 0 {
		o.MaxReviewsPerClient = max(1, o.MaxConcurrentReviews*DefaultMaxReviewsPerClient/DefaultMaxConcurrentReviews)
	}
	o.MaxReviewsPerClient = min(o.MaxReviewsPerClient, o.MaxConcurrentReviews)
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &KubeReviewer{o: o, cache: map[[32]byte]cached{}, flights: map[[32]byte]*reviewFlight{}, perClient: map[string]int{}}, nil
}

// Review validates token (see KubeReviewer).
func (r *KubeReviewer) Review(ctx context.Context, token string, req ReviewRequest) (*Review, error) {
	audiences := req.Audiences
	if len(audiences) == 0 {
		audiences = []string{r.o.Audience}
	}
	// A token reviewed for one set of audiences is not thereby accepted
	// for another.
	key := sha256.Sum256([]byte(token + "\x00" + strings.Join(audiences, "\x00")))
	// A repeat of an accepted token (every pull of an image's layers) is
	// answered from the cache before any signature check: the exact token
	// passed all of them, and its entry ends at the token's expiry.
	if rv := r.cached(key); rv != nil {
		return rv, nil
	}
	claims, err := r.precheck(ctx, token, audiences)
	if err != nil {
		return nil, err
	}
	client := "remote " + remoteHost(req.Client)
	if claims.verified && claims.node != "" {
		client = "node " + claims.node
	}
	r.mu.Lock()
	f := r.flights[key]
	if f == nil && len(r.flights) >= r.o.MaxConcurrentReviews {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %d token reviews are under way, the most this replica makes at once", ErrUnavailable, r.o.MaxConcurrentReviews)
	}
	if f == nil && r.perClient[client] >= r.o.MaxReviewsPerClient {
		r.mu.Unlock()
		return nil, fmt.Errorf("%w: %d token reviews for %s are under way, the most one client gets at once", ErrUnavailable, r.o.MaxReviewsPerClient, client)
	}
	if f == nil {
		f = &reviewFlight{client: client, done: make(chan struct{})}
		r.flights[key] = f
		r.perClient[client]++
		// The shared review outlives a caller that gives up: others wait
		// for it too.
		go r.fly(context.WithoutCancel(ctx), key, token, audiences, claims, f)
	}
	r.waiting++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.waiting--
		r.mu.Unlock()
	}()
	select {
	case <-f.done:
		return f.review, f.err
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for the token review: %w", ErrUnavailable, ctx.Err())
	}
}

func (r *KubeReviewer) fly(ctx context.Context, key [32]byte, token string, audiences []string, claims *unverifiedClaims, f *reviewFlight) {
	ctx, cancel := context.WithTimeout(ctx, reviewTimeout)
	defer cancel()
	start := r.o.Clock.Now()
	f.review, f.err = r.review(ctx, token, audiences, claims)
	r.o.Metrics.reviewed(r.o.Clock.Since(start).Seconds())
	r.mu.Lock()
	delete(r.flights, key)
	if r.perClient[f.client]--; r.perClient[f.client] <= 0 {
		delete(r.perClient, f.client)
	}
	if f.err == nil {
		r.store(key, f.review)
	}
	r.mu.Unlock()
	close(f.done)
}

// inFlight is the number of reviews under way.
func (r *KubeReviewer) inFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.flights)
}

// cached is the cached review of key, or nil.
func (r *KubeReviewer) cached(key [32]byte) *Review {
	now := r.o.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	c, ok := r.cache[key]
	if !ok {
		return nil
	}
	if !now.Before(c.until) {
		delete(r.cache, key)
		return nil
	}
	r.o.Metrics.cacheHit()
	return c.review
}

// store caches an accepted review; r.mu is held.
func (r *KubeReviewer) store(key [32]byte, rv *Review) {
	if r.o.CacheTTL <= 0 {
		return
	}
	now := r.o.Clock.Now()
	until := now.Add(r.o.CacheTTL)
	if rv.Expiry.Before(until) {
		until = rv.Expiry
	}
	if !now.Before(until) {
		return
	}
	if len(r.cache) >= maxCacheEntries {
		for k, c := range r.cache {
			if !now.Before(c.until) {
				delete(r.cache, k)
			}
		}
		if len(r.cache) >= maxCacheEntries {
			return
		}
	}
	r.cache[key] = cached{review: rv, until: until}
}

// unverifiedClaims are the claims of a token read before the apiserver
// validated it: they only make refusals clearer and cheaper, and exp is
// trusted only once the TokenReview accepted the token. When verified,
// the service-account issuer's key signed them (the pod may still be
// gone).
type unverifiedClaims struct {
	verified bool
	aud      []string
	expiry   time.Time
	// namespace, pod, podUID, node and serviceAccount are the
	// kubernetes.io claims of a pod-bound token.
	namespace, pod, podUID, node, serviceAccount string
}

// identity is what the claims say of the caller.
func (c *unverifiedClaims) identity() policy.Identity {
	return policy.Identity{Namespace: c.namespace, ServiceAccount: c.serviceAccount, PodName: c.pod, PodUID: c.podUID, NodeName: c.node}
}

// precheck refuses, without asking the apiserver, a token that cannot be
// accepted: too long, not a JWT, not signed by the service-account
// issuer's keys (when known), for another audience, expired.
func (r *KubeReviewer) precheck(ctx context.Context, token string, audiences []string) (*unverifiedClaims, error) {
	if len(token) > MaxTokenBytes {
		return nil, &RefusedError{Reason: ReasonMalformed, Message: fmt.Sprintf("the token is %d bytes long; service-account tokens are at most %d", len(token), MaxTokenBytes)}
	}
	c, err := parseClaims(token)
	if err != nil {
		return nil, &RefusedError{Reason: ReasonMalformed, Message: "not a service-account token: " + err.Error()}
	}
	if r.o.Keys != nil {
		_, err := r.o.Keys.verify(ctx, token)
		switch {
		case err == nil:
			c.verified = true
		case errors.Is(err, errBadSignature):
			return nil, &RefusedError{Reason: ReasonBadSignature, Message: "not signed by the cluster's service-account issuer: " + err.Error()}
		} // errNoIssuerKeys: the TokenReview decides alone
	}
	refused := func(reason, msg string) error {
		e := &RefusedError{Reason: reason, Message: msg, Signed: c.verified}
		if c.verified {
			e.Identity = c.identity()
		}
		return e
	}
	if !slices.ContainsFunc(c.aud, func(a string) bool { return slices.Contains(audiences, a) }) {
		return nil, refused(ReasonWrongAudience,
			fmt.Sprintf("the token is for audience %q, not %q (the kubelet's tokenAttributes.serviceAccountTokenAudience for this registry must be that)", c.aud, strings.Join(audiences, `" or "`)))
	}
	if now := r.o.Clock.Now(); !now.Before(c.expiry) {
		return nil, refused(ReasonExpired, fmt.Sprintf("the token expired at %s; this token service's clock reads %s (a token the kubelet just issued: a clock is wrong)",
			c.expiry.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339)))
	}
	return c, nil
}

// remoteHost is the host of a host:port address (the address itself when
// it has no port).
func remoteHost(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// parseClaims reads aud and exp from a JWT's payload without verifying
// anything.
func parseClaims(token string) (*unverifiedClaims, error) {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil, errors.New("not a JWT (want three dot-separated parts)")
	}
	payload, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return nil, errors.New("not a JWT (payload is not base64url)")
	}
	var raw struct {
		Aud  json.RawMessage `json:"aud"`
		Exp  *json.Number    `json:"exp"`
		Kube struct {
			Namespace string `json:"namespace"`
			Pod       struct {
				Name string `json:"name"`
				UID  string `json:"uid"`
			} `json:"pod"`
			Node struct {
				Name string `json:"name"`
			} `json:"node"`
			ServiceAccount struct {
				Name string `json:"name"`
			} `json:"serviceaccount"`
		} `json:"kubernetes.io"`
	}
	if err := json.Unmarshal(payload, &raw); err != nil {
		return nil, errors.New("not a JWT (payload is not a JSON object)")
	}
	c := &unverifiedClaims{namespace: raw.Kube.Namespace, pod: raw.Kube.Pod.Name, podUID: raw.Kube.Pod.UID,
		node: raw.Kube.Node.Name, serviceAccount: raw.Kube.ServiceAccount.Name}
	if len(raw.Aud) > 0 {
		var one string
		if json.Unmarshal(raw.Aud, &one) == nil {
			c.aud = []string{one}
		} else if err := json.Unmarshal(raw.Aud, &c.aud); err != nil {
			return nil, errors.New("the aud claim is neither a string nor a list of strings")
		}
	}
	if raw.Exp == nil {
		return nil, errors.New("the token has no exp claim (a legacy Secret-based token?)")
	}
	exp, err := raw.Exp.Float64()
	if err != nil || exp <= 0 || exp > 1<<40 {
		return nil, errors.New("the exp claim is not a time")
	}
	c.expiry = time.Unix(int64(exp), 0)
	return c, nil
}

// review asks the apiserver.
func (r *KubeReviewer) review(ctx context.Context, token string, audiences []string, claims *unverifiedClaims) (*Review, error) {
	tr, err := r.o.Client.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: audiences},
	}, metav1.CreateOptions{})
	if err := r.grants.check(ctx, `"create" on tokenreviews (authentication.k8s.io)`, err); err != nil {
		return nil, fmt.Errorf("%w: creating a TokenReview: %w", ErrUnavailable, err)
	}
	st := tr.Status
	if !st.Authenticated {
		msg := "the apiserver did not authenticate it"
		if st.Error != "" {
			e := st.Error
			if len(e) > maxStatusError {
				e = e[:maxStatusError] + "…"
			}
			msg += ": " + e
		}
		// Only then: the claims of a token the apiserver did not
		// authenticate are the caller's own words, and looking up the pod
		// they name would tell anyone whether a pod of any namespace
		// exists, and its UID.
		if !strings.Contains(st.Error, invalidatedError) {
			return nil, &RefusedError{Reason: ReasonNotAuthenticated, Message: msg}
		}
		if gone := r.podGone(ctx, claims); gone != "" {
			// The apiserver says only "service account token has been
			// invalidated" when the bound pod is gone.
			return nil, &RefusedError{Reason: ReasonPodGone, Message: gone + " (" + msg + ")"}
		}
		return nil, &RefusedError{Reason: ReasonNotAuthenticated, Message: msg}
	}
	if !slices.ContainsFunc(st.Audiences, func(a string) bool { return slices.Contains(audiences, a) }) {
		return nil, &RefusedError{Reason: ReasonWrongAudience, Authenticated: true,
			Message: fmt.Sprintf("the apiserver authenticated it for audiences %q, not %q", st.Audiences, audiences)}
	}
	ns, sa, ok := serviceAccount(st.User.Username)
	if !ok {
		return nil, &RefusedError{Reason: ReasonNotServiceAccount, Authenticated: true,
			Message: fmt.Sprintf("it authenticates %q, not a service account", st.User.Username)}
	}
	id := policy.Identity{Namespace: ns, ServiceAccount: sa,
		PodName: first(st.User.Extra[extraPodName]), PodUID: first(st.User.Extra[extraPodUID]), NodeName: first(st.User.Extra[extraNodeName])}
	if id.PodName == "" || id.PodUID == "" {
		return nil, &RefusedError{Reason: ReasonNotPodBound, Authenticated: true, Identity: id,
			Message: fmt.Sprintf("the token of service account %s/%s is not bound to a pod (kubelet's image credential provider tokens are)", ns, sa)}
	}
	pod, err := r.o.Client.CoreV1().Pods(ns).Get(ctx, id.PodName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &RefusedError{Reason: ReasonPodGone, Authenticated: true, Identity: id,
			Message: fmt.Sprintf("pod %s/%s, to which the token is bound, no longer exists", ns, id.PodName)}
	}
	if err := r.grants.check(ctx, `"get" on pods`, err); err != nil {
		return nil, fmt.Errorf("%w: reading pod %s/%s: %w", ErrUnavailable, ns, id.PodName, err)
	}
	if string(pod.UID) != id.PodUID {
		return nil, &RefusedError{Reason: ReasonPodGone, Authenticated: true, Identity: id,
			Message: fmt.Sprintf("pod %s/%s (uid %s), to which the token is bound, no longer exists (a pod of that name has uid %s)", ns, id.PodName, id.PodUID, pod.UID)}
	}
	if p := pod.Status.Phase; p == corev1.PodSucceeded || p == corev1.PodFailed {
		return nil, &RefusedError{Reason: ReasonPodFinished, Authenticated: true, Identity: id,
			Message: fmt.Sprintf("pod %s/%s, to which the token is bound, has finished (phase %s)", ns, id.PodName, p)}
	}
	if id.NodeName == "" {
		id.NodeName = pod.Spec.NodeName
	}
	acct, err := r.o.Client.CoreV1().ServiceAccounts(ns).Get(ctx, sa, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, &RefusedError{Reason: ReasonServiceAccountGone, Authenticated: true, Identity: id,
			Message: fmt.Sprintf("service account %s/%s no longer exists", ns, sa)}
	}
	if err := r.grants.check(ctx, `"get" on serviceaccounts`, err); err != nil {
		return nil, fmt.Errorf("%w: reading service account %s/%s: %w", ErrUnavailable, ns, sa, err)
	}
	id.Annotations = maps.Clone(acct.Annotations)
	return &Review{Identity: id, Expiry: claims.expiry}, nil
}

// podGone explains a token the apiserver refused whose (unverified) claims
// name a pod that no longer exists: it returns the explanation, or "" when
// the pod exists or cannot be read.
func (r *KubeReviewer) podGone(ctx context.Context, c *unverifiedClaims) string {
	if c.namespace == "" || c.pod == "" || c.podUID == "" {
		return ""
	}
	pod, err := r.o.Client.CoreV1().Pods(c.namespace).Get(ctx, c.pod, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("pod %s/%s, to which the token is bound, no longer exists", c.namespace, c.pod)
	case err == nil && string(pod.UID) != c.podUID:
		return fmt.Sprintf("pod %s/%s (uid %s), to which the token is bound, no longer exists (a pod of that name has uid %s)", c.namespace, c.pod, c.podUID, pod.UID)
	}
	return ""
}

// serviceAccount splits system:serviceaccount:NS:SA.
func serviceAccount(user string) (ns, sa string, ok bool) {
	rest, ok := strings.CutPrefix(user, "system:serviceaccount:")
	if !ok {
		return "", "", false
	}
	ns, sa, ok = strings.Cut(rest, ":")
	if !ok || ns == "" || sa == "" || strings.Contains(sa, ":") {
		return "", "", false
	}
	return ns, sa, true
}

func first(v authnv1.ExtraValue) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// grantLog reports each RBAC grant the token service lacks once, when a
// request first meets its absence, and once more when it is back: every
// review fails meanwhile, and a line per request would hide everything
// else.
type grantLog struct {
	mu      sync.Mutex
	missing map[string]bool
}

// MissingGrantError is the error of a request the apiserver refused
// because the token service's identity lacks Grant.
type MissingGrantError struct {
	Grant string
	Err   error
}

func (e *MissingGrantError) Error() string {
	return fmt.Sprintf("the token service's identity lacks the RBAC grant %s: %v", e.Grant, e.Err)
}
func (e *MissingGrantError) Unwrap() error { return e.Err }

// check returns err, as a *MissingGrantError when the apiserver answered
// 403, and logs the first 403 and the first success after one.
func (g *grantLog) check(ctx context.Context, grant string, err error) error {
	forbidden := apierrors.IsForbidden(err)
	if err != nil && !forbidden {
		return err
	}
	g.mu.Lock()
	was := g.missing[grant]
	if forbidden && !was {
		if g.missing == nil {
			g.missing = map[string]bool{}
		}
		g.missing[grant] = true
	} else if !forbidden && was {
		delete(g.missing, grant)
	}
	g.mu.Unlock()
	if !forbidden {
		if was {
			klog.FromContext(ctx).Info("The token service's RBAC grant is back; service-account tokens are validated again", "grant", grant)
		}
		return nil
	}
	merr := &MissingGrantError{Grant: grant, Err: err}
	if !was {
		klog.FromContext(ctx).Error(merr, "Every service-account token is answered 503 until the token service is granted this (logged once)", "grant", grant)
	}
	return merr
}
