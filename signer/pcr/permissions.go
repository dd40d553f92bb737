package pcr

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/keyward/keyward/internal/kubemsg"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Permissions answers whether the signer may write statuses for a signer
// name. The controller signs nothing for a name that is Blocked, so a
// missing grant costs no CA-key signatures.
type Permissions interface {
	// Blocked is nil when the signer may issue for signerName, else why not.
	Blocked(signerName string) error
	// Refused tells that kube-apiserver refused a status write for
	// signerName for lack of permission; detail is its answer.
	Refused(ctx context.Context, signerName, detail string)
}

// MissingPermissionError is an RBAC grant the signer needs and lacks.
type MissingPermissionError struct {
	Verb, Resource, Subresource, Name string
}

func (e *MissingPermissionError) Error() string {
	res := e.Resource + ".certificates.k8s.io"
	if e.Subresource != "" {
		res = e.Resource + "/" + e.Subresource + ".certificates.k8s.io"
	}
	rule := fmt.Sprintf(`{apiGroups: ["certificates.k8s.io"], resources: [%q], verbs: [%q]`, e.resourcePath(), e.Verb)
	target := res
	if e.Name != "" {
		target += " " + strconv.Quote(e.Name)
		rule = fmt.Sprintf(`{apiGroups: ["certificates.k8s.io"], resources: [%q], resourceNames: [%q], verbs: [%q]`, e.resourcePath(), e.Name, e.Verb)
	}
	return fmt.Sprintf("missing RBAC permission: verb %q on %s; add the rule %s} to the signer's ClusterRole", e.Verb, target, rule)
}

func (e *MissingPermissionError) resourcePath() string {
	if e.Subresource != "" {
		return e.Resource + "/" + e.Subresource
	}
	return e.Resource
}

// requiredPermissions are what the PodCertificateRequest signer needs,
// besides `sign` on each signer name.
var requiredPermissions = []MissingPermissionError{
	// get: the re-read after a takeover and of a status whose write answer
	// was lost.
	{Verb: "get", Resource: "podcertificaterequests"},
	{Verb: "list", Resource: "podcertificaterequests"},
	{Verb: "watch", Resource: "podcertificaterequests"},
	{Verb: "update", Resource: "podcertificaterequests", Subresource: "status"},
}

// csrPermissions are what the CertificateSigningRequest signer needs,
// besides `sign` on each of its signer names.
var csrPermissions = []MissingPermissionError{
	// get: the re-read after a takeover and before writing again after a
	// conflict.
	{Verb: "get", Resource: "certificatesigningrequests"},
	{Verb: "list", Resource: "certificatesigningrequests"},
	{Verb: "watch", Resource: "certificatesigningrequests"},
	{Verb: "update", Resource: "certificatesigningrequests", Subresource: "status"},
}

// RequiredPermissions are the grants (besides `sign`) of a signer that
// serves PodCertificateRequests (pcrs), CertificateSigningRequests (csrs)
// or both: a PermissionGate's Required.
func RequiredPermissions(pcrs, csrs bool) []MissingPermissionError {
	var out []MissingPermissionError
	if pcrs {
		out = append(out, requiredPermissions...)
	}
	if csrs {
		out = append(out, csrPermissions...)
	}
	return out
}

// Recheck intervals of the PermissionGate.
const (
	// recheckMissing is how often a missing grant is looked for again.
	recheckMissing = 30 * time.Second
	// recheckFailed is how soon a check whose reviews failed is retried.
	recheckFailed = 5 * time.Second
	// checkTimeout bounds one Check (all its reviews).
	checkTimeout = 30 * time.Second
)

// PermissionGate checks with SelfSubjectAccessReviews that the signer holds
// every grant it needs: at start, after kube-apiserver refuses a status
// write for lack of one, and every recheckMissing while one is missing. It
// is safe for concurrent use.
type PermissionGate struct {
	client  kubernetes.Interface
	names   []string
	clock   clock.Clock
	onState func(signerName string, missing bool)
	// Recheck is how often a missing grant is looked for again (default
	// 30s); set before Run.
	Recheck time.Duration
	// Required are the grants besides `sign` (default: the
	// PodCertificateRequest signer's; RequiredPermissions); set before
	// Check.
	Required []MissingPermissionError

	mu      sync.Mutex
	checked bool
	general error            // a grant every signer name needs
	missing map[string]error // per signer name
	recheck chan struct{}
}

// NewPermissionGate returns a gate for signerNames. onState, if set, is
// told when a signer name's permission goes missing or comes back (for a
// metric).
func NewPermissionGate(client kubernetes.Interface, signerNames []string, c clock.Clock, onState func(string, bool)) *PermissionGate {
	if c == nil {
		c = clock.RealClock{}
	}
	return &PermissionGate{client: client, names: slices.Clone(signerNames), clock: c, onState: onState, Recheck: recheckMissing,
		Required: slices.Clone(requiredPermissions), missing: map[string]error{}, recheck: make(chan struct{}, 1)}
}

// Check asks kube-apiserver about every grant and returns what is missing
// (nil when all are held). It logs each change at default verbosity. When
// a review itself fails, nothing changes and that error is returned.
func (g *PermissionGate) Check(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	var general []error
	var missingErr *MissingPermissionError
	for _, p := range g.Required {
		if err := g.review(ctx, p); errors.As(err, &missingErr) {
			general = append(general, err)
		} else if err != nil {
			return err
		}
	}
	missing := map[string]error{}
	for _, n := range g.names {
		if err := g.reviewSign(ctx, n); errors.As(err, &missingErr) {
			missing[n] = err
		} else if err != nil {
			return err
		}
	}
	g.mu.Lock()
	g.checked = true
	oldGeneral, newGeneral := g.general, errors.Join(general...)
	g.general = newGeneral
	old := g.missing
	g.missing = missing
	g.mu.Unlock()
	// Log and report changes only: a grant missing for hours is one error
	// line, not one per recheck.
	logger := klog.FromContext(ctx)
	if newGeneral != nil && (oldGeneral == nil || oldGeneral.Error() != newGeneral.Error()) {
		logger.Error(newGeneral, "Not issuing for any signer name until the grants are added")
	}
	for _, n := range g.names {
		was, is := old[n] != nil || oldGeneral != nil, missing[n] != nil || newGeneral != nil
		if missing[n] != nil && old[n] == nil {
			logger.Error(missing[n], "Not issuing for this signer name until the grant is added", "signer", n)
		}
		if was && !is {
			logger.Info("Permissions are back; issuing again", "signer", n)
		}
		if g.onState != nil && was != is {
			g.onState(n, is)
		}
	}
	return g.Err()
}

// reviewSign asks as kube-apiserver does before it accepts a status: `sign`
// on the exact signer name, else on "<domain>/*".
func (g *PermissionGate) reviewSign(ctx context.Context, name string) error {
	exact := MissingPermissionError{Verb: "sign", Resource: "signers", Name: name}
	err := g.review(ctx, exact)
	var missing *MissingPermissionError
	if !errors.As(err, &missing) {
		return err
	}
	domain, _, _ := strings.Cut(name, "/")
	if err := g.review(ctx, MissingPermissionError{Verb: "sign", Resource: "signers", Name: domain + "/*"}); !errors.As(err, &missing) {
		return err
	}
	return &exact
}

// review asks whether this identity holds p. An error of the review itself
// is returned as is (it says nothing about the grant).
func (g *PermissionGate) review(ctx context.Context, p MissingPermissionError) error {
	ssar := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: "certificates.k8s.io", Resource: p.Resource, Subresource: p.Subresource, Name: p.Name, Verb: p.Verb,
		}}}
	res, err := g.client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, ssar, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("checking permission %q on %s: %w", p.Verb, p.resourcePath(), err)
	}
	if !res.Status.Allowed {
		return &p
	}
	return nil
}

// Err is every missing grant, or nil (for /readyz).
func (g *PermissionGate) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.checked {
		return errors.New("RBAC permissions not checked yet")
	}
	errs := []error{g.general}
	for _, n := range g.names {
		errs = append(errs, g.missing[n])
	}
	return errors.Join(errs...)
}

// Blocked implements Permissions. Until a check has answered, every name
// is blocked: a signer that cannot ask must not sign in the dark.
func (g *PermissionGate) Blocked(signerName string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.checked {
		return errors.New("RBAC permissions not checked yet")
	}
	if g.general != nil {
		return g.general
	}
	return g.missing[signerName]
}

// Refused implements Permissions: the name is blocked until the next check
// finds the grant.
func (g *PermissionGate) Refused(ctx context.Context, signerName, detail string) {
	g.mu.Lock()
	was := g.missing[signerName] != nil || g.general != nil
	if g.missing[signerName] == nil {
		g.missing[signerName] = fmt.Errorf("kube-apiserver refused a status write for lack of permission: %s", kubemsg.Truncate(detail, 512))
	}
	g.mu.Unlock()
	if !was {
		klog.FromContext(ctx).Error(nil, "kube-apiserver refused a status write for lack of permission; not signing for this signer name until a permission check passes",
			"signer", signerName, "answer", kubemsg.Truncate(detail, 512))
		if g.onState != nil {
			g.onState(signerName, true)
		}
	}
	select {
	case g.recheck <- struct{}{}:
	default:
	}
}

// Run rechecks every recheckMissing while a grant is missing (and soon
// after a refusal), until ctx ends.
func (g *PermissionGate) Run(ctx context.Context) {
	for {
		every := g.Recheck
		g.mu.Lock()
		if !g.checked {
			every = min(every, recheckFailed)
		}
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-g.clock.After(every):
		case <-g.recheck:
			// Let a burst of refusals settle into one review.
			select {
			case <-ctx.Done():
				return
			case <-g.clock.After(time.Second):
			}
		}
		if g.Err() == nil {
			continue
		}
		var missing *MissingPermissionError
		if err := g.Check(ctx); err != nil && ctx.Err() == nil && !errors.As(err, &missing) {
			// Missing grants are logged by Check when they change.
			klog.FromContext(ctx).Error(err, "Checking RBAC permissions failed; nothing is signed until a check answers")
		}
	}
}
