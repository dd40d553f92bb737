package trustpublisher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// Condition reasons the trust publisher writes (besides the gate names,
// which are the reasons of a held Progressing condition).
const (
	ReasonAtDesiredPhases    = "AtDesiredPhases"
	ReasonMoving             = "Moving"
	ReasonPublished          = "Published"
	ReasonPublishPending     = "Pending"
	ReasonAttestForbidden    = "AttestForbidden"
	ReasonWriteForbidden     = "WriteForbidden"
	ReasonWriteFailed        = "WriteFailed"
	ReasonActiveKeyReady     = "ActiveKeyReady"
	ReasonNoActiveGeneration = "NoActiveGeneration"
	ReasonKeyNotReady        = v1alpha1.GateKeyNotReady
	ReasonConflict           = v1alpha1.GateConflict
	ReasonHealthy            = "Healthy"
	ReasonURLFailed          = "URLFailed"
	ReasonReadyPodsDropped   = "ReadyPodsDropped"
	ReasonPodsUnreadable     = "PodsUnreadable"
	// Reasons of ConditionPropagationWindowSafe (and the Warning Event
	// EventPropagationWindowShort).
	ReasonCoversKubeletSync      = "CoversKubeletSync"
	ReasonShorterThanKubeletSync = "ShorterThanKubeletSync"
)

// ownStatus is exactly the trust publisher's share of an Authority's
// status: what it applies, and what it compares to decide whether to.
type ownStatus struct {
	ObservedGeneration int64                   `json:"observedGeneration,omitempty"`
	Generations        []ownGeneration         `json:"generations,omitempty"`
	Bundles            []v1alpha1.BundleStatus `json:"bundles,omitempty"`
	Conditions         []metav1.Condition      `json:"conditions,omitempty"`
}

type ownGeneration struct {
	Name                 string           `json:"name"`
	Phase                v1alpha1.Phase   `json:"phase,omitempty"`
	Since                *metav1.Time     `json:"since,omitempty"`
	Gate                 string           `json:"gate,omitempty"`
	GateOpensAt          *metav1.Time     `json:"gateOpensAt,omitempty"`
	ReadyPodsAtSoakStart *int32           `json:"readyPodsAtSoakStart,omitempty"`
	CanarySoak           *metav1.Duration `json:"canarySoak,omitempty"`
}

// ownOf extracts the trust publisher's fields from a status.
func ownOf(a *v1alpha1.Authority) ownStatus {
	s := ownStatus{ObservedGeneration: a.Status.ObservedGeneration}
	for _, g := range a.Status.Generations {
		og := ownGeneration{Name: g.Name, Phase: g.Phase, Since: sec(g.Since), Gate: g.Gate, GateOpensAt: sec(g.GateOpensAt)}
		if g.ReadyPodsAtSoakStart != nil {
			n := *g.ReadyPodsAtSoakStart
			og.ReadyPodsAtSoakStart = &n
		}
		og.CanarySoak = g.CanarySoak.DeepCopy()
		if og == (ownGeneration{Name: g.Name}) {
			// Only the signer's fields (e.g. the keyCheck of a generation
			// gone from spec): nothing of ours.
			continue
		}
		s.Generations = append(s.Generations, og)
	}
	for _, b := range a.Status.Bundles {
		b = *b.DeepCopy()
		b.LastChangeTime = sec(b.LastChangeTime)
		s.Bundles = append(s.Bundles, b)
	}
	for _, cond := range a.Status.Conditions {
		cond.LastTransitionTime = *sec(&cond.LastTransitionTime)
		s.Conditions = append(s.Conditions, cond)
	}
	return s
}

// sec truncates a time to the second, as the apiserver stores it.
func sec(t *metav1.Time) *metav1.Time {
	if t == nil {
		return nil
	}
	return &metav1.Time{Time: t.Truncate(time.Second).UTC()}
}

// sameStatus reports whether applying b over a would change nothing a
// reader cares about (in any order of list items). The Progressing message is not compared: it names
// numbers that move with the clock ("soak: 12m of 1h"), and writing it on
// every sync would loop on the trust publisher's own updates; it is
// refreshed with the next real change.
func sameStatus(a, b ownStatus) bool {
	strip := func(s ownStatus) ownStatus {
		s.Conditions = slices.Clone(s.Conditions)
		for i := range s.Conditions {
			if s.Conditions[i].Type == v1alpha1.ConditionProgressing {
				s.Conditions[i].Message = ""
			}
		}
		slices.SortFunc(s.Conditions, func(x, y metav1.Condition) int { return strings.Compare(x.Type, y.Type) })
		// Server-side apply merges lists by key; their order is not ours.
		s.Generations = slices.Clone(s.Generations)
		slices.SortFunc(s.Generations, func(x, y ownGeneration) int { return strings.Compare(x.Name, y.Name) })
		s.Bundles = slices.Clone(s.Bundles)
		slices.SortFunc(s.Bundles, func(x, y v1alpha1.BundleStatus) int { return strings.Compare(x.Version, y.Version) })
		return s
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}

// sync brings one Authority's status and bundles to what its spec and the
// clock allow.
func (c *Controller) sync(ctx context.Context, name string) error {
	logger := klog.FromContext(ctx).WithValues("authority", name)
	ctx = klog.NewContext(ctx, logger)
	obj, exists, err := c.authorities.GetIndexer().GetByKey(name)
	if err != nil {
		return fmt.Errorf("reading Authority %s from the cache: %w", name, err)
	}
	if !exists {
		c.forget(name)
		return nil
	}
	a := obj.(*v1alpha1.Authority)
	if c.behind(a) {
		logger.V(4).Info("Cache behind this controller's own write; waiting for the watch", "resourceVersion", a.ResourceVersion)
		return nil
	}
	if !c.signers[a.Spec.SignerName] {
		c.ignore(ctx, a)
		return nil
	}
	peers, err := authclient.BySignerName(c.authorities, a.Spec.SignerName)
	if err != nil {
		return fmt.Errorf("looking up the Authorities of signer %s: %w", a.Spec.SignerName, err)
	}
	if len(peers) > 1 {
		return c.syncConflict(ctx, a, peers)
	}
	now := c.clock.Now()

	// Only the phases the trust publisher itself moved count (its record
	// on the bundles, or its own latest write); any other is reported and
	// left out of everything below.
	rec, err := record.Lookup(record.StoreGetter(c.bundles.GetStore()), a)
	if err != nil {
		return fmt.Errorf("reading the phase record of Authority %s: %w", name, err)
	}
	pending := c.pendingOf(name)
	findings := record.Verify(a, rec, pending)
	c.reportFindings(ctx, a, findings)
	c.warnWindow(ctx, a)
	work := trustedCopy(a, rec, pending)
	c.witnessed(work)

	// Canary health first: its condition is an input of the gates.
	health, healthEvery := c.checkHealth(ctx, work, now)
	parsed := parsedGenerations{} // of a.Spec, which work, next and reportOverride's copy share
	holdChanged(a, rec, pending, parsed)
	plan := evaluate(work, now, parsed)
	next := plan.Apply(work, now)
	setSoakBaselines(next, health)

	// Status first: the observed phases lead, the bundles follow them.
	canary, live := bundleContents(next, parsed.certs)
	newRec := recordOf(next, rec, record.Changed(a, rec, pending))
	desired := []desiredBundle{
		c.desiredBundle(next, v1alpha1.BundleCanary, canary, newRec),
		c.desiredBundle(next, v1alpha1.BundleLive, live, newRec),
	}
	for i := range desired {
		desired[i].status = bundleStatusBefore(a, desired[i])
	}
	fail := c.failure(name)
	want := c.compose(next, plan, desired, fail, now)
	setProvenance(&want, a, findings, now)
	if !sameStatus(ownOf(a), want) {
		got, err := c.writer.ApplyStatus(ctx, name, want, v1alpha1.FieldManagerTrustPublisher)
		if err != nil {
			return fmt.Errorf("applying the status of Authority %s: %w", name, err)
		}
		c.wrote(a, got)
		c.setPending(name, newRec)
		logger.V(2).Info("Applied Authority status", "plan", planSummary(plan))
	}
	c.reportOverride(ctx, a, plan, parsed, now)

	// Then the bundles, unless a generation they must hold has
	// certificates that no longer parse: publishing without its root
	// would break every leaf it signed. They stay as they are.
	var published []publishResult
	if err := unparsableMember(next, parsed); err != nil {
		published = make([]publishResult, len(desired))
		for i := range published {
			published[i].err = err
		}
	} else {
		published = c.publish(ctx, a, desired)
	}
	fail = c.recordFailure(ctx, a, published)
	// Gates count from here: the writes have returned, so a node may see
	// what they wrote (rounded up, as the apiserver keeps whole seconds).
	confirmed := CeilSecond(c.clock.Now())
	_, window := GateDurations(next)
	for i := range desired {
		desired[i].status = bundleStatusAfter(desired[i].status, published[i].err == nil, confirmed, windowToRecord(a, desired[i].version, window))
	}
	if fail == nil {
		Confirm(next, confirmed)
	}
	after := c.compose(next, plan, desired, fail, now)
	setProvenance(&after, a, findings, now)
	if !sameStatus(want, after) {
		got, err := c.writer.ApplyStatus(ctx, name, after, v1alpha1.FieldManagerTrustPublisher)
		if err != nil {
			return fmt.Errorf("applying the bundle status of Authority %s: %w", name, err)
		}
		c.wrote(a, got)
		// Confirm set since after the record went out with none: this
		// write is now the trust publisher's latest word on its phases,
		// and the next sync copies it onto the bundles' record.
		c.setPending(name, recordOf(next, rec, record.Changed(a, rec, pending)))
	}
	for i, d := range desired {
		if published[i].written && published[i].err == nil {
			if d.pem == "" {
				c.event(a, corev1.EventTypeNormal, EventBundlePublished, "ClusterTrustBundle %s deleted: no generation belongs in it", d.name)
			} else {
				c.event(a, corev1.EventTypeNormal, EventBundlePublished, "ClusterTrustBundle %s holds the roots of generations [%s]", d.name, strings.Join(d.status.Generations, ", "))
			}
		}
	}
	c.metrics.observe(next, parsed, plan, desired, published, now)

	if fail != nil {
		return reportedError{fail.err}
	}
	if d, ok := requeueAfter(plan, healthEvery, now); ok {
		c.queue.AddAfter(name, d)
	}
	return nil
}

// errInvalidMember is matched by the error of a bundle left as it is
// because a generation in it has certificates that do not parse.
var errInvalidMember = errors.New("a generation in the bundle has unusable certificates")

// unparsableMember returns an error naming the first generation whose
// observed phase puts it in a bundle and whose certificates do not parse.
func unparsableMember(a *v1alpha1.Authority, parsed parsedGenerations) error {
	observed := observedPhases(a)
	for _, g := range a.Spec.Generations {
		p := observed[g.Name]
		if !InCanary(p) && !InLive(p) {
			continue
		}
		if _, err := parsed.certs(g); err != nil {
			return fmt.Errorf("%w: generation %s (%s) would leave the bundles, which are kept as published until it is fixed: %w", errInvalidMember, g.Name, p, err)
		}
	}
	return nil
}

// requeueAfter is when the Authority must be looked at again with nothing
// else happening: when the earliest time-bound gate opens, or the next
// canary health check.
func requeueAfter(plan Plan, healthEvery time.Duration, now time.Time) (time.Duration, bool) {
	var best time.Duration
	found := false
	take := func(d time.Duration) {
		if d <= 0 {
			d = time.Second
		}
		if !found || d < best {
			best, found = d, true
		}
	}
	for _, s := range plan.Steps {
		if s.OpensAt != nil {
			// A moment past the gate, so the next look finds it open.
			take(s.OpensAt.Sub(now) + 100*time.Millisecond)
		}
		if s.Moves() {
			take(time.Second)
		}
	}
	if healthEvery > 0 {
		take(healthEvery)
	}
	return best, found
}

// setSoakBaselines records readyPodsAtSoakStart on every soaking
// generation that has none yet (Plan.Apply clears it when a soak begins).
func setSoakBaselines(a *v1alpha1.Authority, h *healthResult) {
	if h == nil || h.readyPods == nil {
		return
	}
	for i := range a.Status.Generations {
		g := &a.Status.Generations[i]
		if soaking(g.Phase) && g.ReadyPodsAtSoakStart == nil {
			n := *h.readyPods
			g.ReadyPodsAtSoakStart = &n
		}
	}
}

func soaking(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseStaged || p == v1alpha1.PhaseRetiring
}

// compose builds the trust publisher's status for next (plan applied),
// with the bundles' status and the latest publish failure.
func (c *Controller) compose(next *v1alpha1.Authority, plan Plan, bundles []desiredBundle, fail *publishFailure, now time.Time) ownStatus {
	out := next.DeepCopy()
	out.Status.Bundles = nil
	for _, b := range bundles {
		out.Status.Bundles = append(out.Status.Bundles, b.status)
	}
	out.Status.ObservedGeneration = next.Generation
	t := metav1.NewTime(now.Truncate(time.Second))
	set := func(typ string, ok bool, reason, msg string) {
		st := metav1.ConditionFalse
		if ok {
			st = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&out.Status.Conditions, metav1.Condition{
			Type: typ, Status: st, Reason: reason, Message: msg, ObservedGeneration: next.Generation, LastTransitionTime: t,
		})
	}

	// Progressing: a generation not at its desired phase.
	var waits []string
	reason := ""
	for _, s := range plan.Steps {
		if s.Next == s.Desired {
			continue
		}
		line := fmt.Sprintf("%s: %s→%s", s.Generation, phaseOrNew(s.Next), s.Desired)
		if s.Gate != "" {
			line += " held by " + s.Gate
			if s.Message != "" {
				line += " (" + s.Message + ")"
			}
			if reason == "" {
				reason = s.Gate
			}
		}
		waits = append(waits, line)
	}
	if len(waits) == 0 {
		set(v1alpha1.ConditionProgressing, false, ReasonAtDesiredPhases, "every generation is at its desired phase")
	} else {
		if reason == "" {
			reason = ReasonMoving
		}
		set(v1alpha1.ConditionProgressing, true, reason, strings.Join(waits, "; "))
	}

	// BundlesPublished.
	var pending []string
	for _, b := range bundles {
		if !b.status.Published {
			pending = append(pending, b.name)
		}
	}
	switch {
	case fail != nil:
		set(v1alpha1.ConditionBundlesPublished, false, fail.reason, fail.message)
	case len(pending) > 0:
		set(v1alpha1.ConditionBundlesPublished, false, ReasonPublishPending, "not yet published: "+strings.Join(pending, ", "))
	default:
		set(v1alpha1.ConditionBundlesPublished, true, ReasonPublished, "canary and live ClusterTrustBundles hold what the observed phases put in them")
	}

	// Ready: one generation observed Active, its key reported ready.
	var active *v1alpha1.GenerationStatus
	for i := range out.Status.Generations {
		if out.Status.Generations[i].Phase == v1alpha1.PhaseActive {
			active = &out.Status.Generations[i]
		}
	}
	switch {
	case active == nil:
		set(v1alpha1.ConditionReady, false, ReasonNoActiveGeneration, "no generation is Active: nothing can be issued")
	case active.KeyCheck == nil || !active.KeyCheck.Ready || !checksSpec(next, active):
		msg := "the signer has not reported generation " + active.Name + "'s key ready"
		if active.KeyCheck != nil && active.KeyCheck.Message != "" {
			msg += ": " + active.KeyCheck.Message
		}
		set(v1alpha1.ConditionReady, false, ReasonKeyNotReady, msg)
	default:
		set(v1alpha1.ConditionReady, true, ReasonActiveKeyReady, "generation "+active.Name+" is Active and its key is ready")
	}
	if next.Spec.Gates.CanaryHealth == nil {
		meta.RemoveStatusCondition(&out.Status.Conditions, v1alpha1.ConditionCanaryHealthy)
	}
	if msg, short := c.windowShort(next); short {
		set(v1alpha1.ConditionPropagationWindowSafe, false, ReasonShorterThanKubeletSync, msg)
	} else {
		set(v1alpha1.ConditionPropagationWindowSafe, true, ReasonCoversKubeletSync, msg)
	}
	own := ownOf(out)
	return own
}

func phaseOrNew(p v1alpha1.Phase) string {
	if p == "" {
		return "(new)"
	}
	return string(p)
}

// syncConflict marks every generation of a with gate Conflict and
// publishes nothing: two Authorities name one signer.
func (c *Controller) syncConflict(ctx context.Context, a *v1alpha1.Authority, peers []*v1alpha1.Authority) error {
	var names []string
	for _, p := range peers {
		names = append(names, p.Name)
	}
	slices.Sort(names)
	msg := fmt.Sprintf("Authorities %s all name signer %s: nothing is published or moved for it until one remains", strings.Join(names, ", "), a.Spec.SignerName)
	out := a.DeepCopy()
	seen := map[string]bool{}
	for i := range out.Status.Generations {
		out.Status.Generations[i].Gate = v1alpha1.GateConflict
		out.Status.Generations[i].GateOpensAt = nil
		seen[out.Status.Generations[i].Name] = true
	}
	for _, g := range a.Spec.Generations {
		if !seen[g.Name] {
			out.Status.Generations = append(out.Status.Generations, v1alpha1.GenerationStatus{Name: g.Name, Gate: v1alpha1.GateConflict})
		}
	}
	t := metav1.NewTime(c.clock.Now().Truncate(time.Second))
	for _, typ := range []string{v1alpha1.ConditionProgressing, v1alpha1.ConditionReady} {
		st := metav1.ConditionFalse
		if typ == v1alpha1.ConditionProgressing && len(a.Spec.Generations) > 0 {
			st = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&out.Status.Conditions, metav1.Condition{Type: typ, Status: st, Reason: ReasonConflict, Message: msg, ObservedGeneration: a.Generation, LastTransitionTime: t})
	}
	out.Status.ObservedGeneration = a.Generation
	want := ownOf(out)
	if sameStatus(ownOf(a), want) {
		return nil
	}
	got, err := c.writer.ApplyStatus(ctx, a.Name, want, v1alpha1.FieldManagerTrustPublisher)
	if err != nil {
		return fmt.Errorf("applying the Conflict status of Authority %s: %w", a.Name, err)
	}
	c.wrote(a, got)
	klog.FromContext(ctx).Info("Authority conflicts with another for the same signer: nothing published", "signerName", a.Spec.SignerName, "authorities", names)
	return nil
}

// wrote notes that the controller changed a (from version read to the
// version got): the cache's copy of read is stale from now on.
func (c *Controller) wrote(read, got *v1alpha1.Authority) {
	if got == nil || got.ResourceVersion == read.ResourceVersion {
		return
	}
	c.mu.Lock()
	c.staleRV[read.Name] = read.ResourceVersion
	c.mu.Unlock()
}

// behind reports whether the cache still holds a version of a this
// controller has already written over.
func (c *Controller) behind(a *v1alpha1.Authority) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	rv, ok := c.staleRV[a.Name]
	if ok && rv == a.ResourceVersion {
		return true
	}
	delete(c.staleRV, a.Name)
	return false
}

// forget drops what the controller remembers of a deleted Authority.
func (c *Controller) forget(name string) {
	c.mu.Lock()
	delete(c.ignored, name)
	delete(c.health, name)
	delete(c.publishErr, name)
	delete(c.staleRV, name)
	delete(c.pending, name)
	delete(c.reported, name)
	c.mu.Unlock()
	c.metrics.forget(name)
}

func planSummary(p Plan) string {
	var parts []string
	for _, s := range p.Steps {
		part := fmt.Sprintf("%s %s→%s", s.Generation, phaseOrNew(s.Observed), phaseOrNew(s.Next))
		if s.Gate != "" {
			part += " [" + s.Gate + "]"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// checksSpec: st's keyCheck names its generation's current keyURI and
// certificate in a's spec.
func checksSpec(a *v1alpha1.Authority, st *v1alpha1.GenerationStatus) bool {
	for _, g := range a.Spec.Generations {
		if g.Name == st.Name {
			return record.Checks(st.KeyCheck, g)
		}
	}
	return false
}
