package trustpublisher

import (
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Evaluate decides, for every generation of a at now, the phase it moves
// to and the gate that holds it back (docs/rotation.md has the table). It
// reads only the object: spec (desired phases, gates), status (observed
// phases, the signer's keyCheck and lastIssuedNotAfter, published bundles,
// the CanaryHealthy condition) and the override annotation. The
// controller and `keyward trust` share it, so a command refuses exactly
// what the controller would hold.
//
// A generation moves one step per evaluation, except at bootstrap (no
// generation observed Active: the one desired Active goes there at once)
// and under an override (straight to the phase the override names). The
// Active generation leaves Active only in the step that makes another one
// Active.
func Evaluate(a *v1alpha1.Authority, now time.Time) Plan {
	return evaluate(a, now, parsedGenerations{})
}

// evaluate is Evaluate reading certificates through parsed, which a sync
// shares with what it does after evaluating (bundles, metrics).
func evaluate(a *v1alpha1.Authority, now time.Time, parsed parsedGenerations) Plan {
	e := &evaluation{a: a, now: now, observed: map[string]*v1alpha1.GenerationStatus{}, parsed: parsed}
	for i := range a.Status.Generations {
		g := &a.Status.Generations[i]
		e.observed[g.Name] = g
	}
	e.soak, e.window = GateDurations(a)
	var plan Plan
	plan.Override, plan.OverrideErr = ParseOverride(a)
	e.override = plan.Override

	active := "" // the generation observed Active, if it is still in spec
	for _, g := range a.Spec.Generations {
		if e.phase(g.Name) == v1alpha1.PhaseActive {
			active = g.Name
		}
	}
	bootstrap := active == ""

	for _, g := range a.Spec.Generations {
		plan.Steps = append(plan.Steps, e.step(g, bootstrap))
	}

	// The Active generation's step is decided by its successor's.
	if active != "" {
		i := stepIndex(plan, active)
		s := &plan.Steps[i]
		succ := -1
		for j, t := range plan.Steps {
			if j != i && t.Desired == v1alpha1.PhaseActive {
				succ = j
			}
		}
		// A forced step leaves Active even without a successor when it
		// pulls the root or no successor is asked for: in an emergency,
		// issuing nothing beats issuing with a compromised key. A forced
		// hand-over to Promoted (trust activate --force) still waits for
		// the successor, or nothing would issue while a gate no override
		// skips holds it.
		emergency := s.Forced && (succ < 0 || s.Desired == v1alpha1.PhaseRetiring || s.Desired == v1alpha1.PhaseRetired)
		if s.Desired != v1alpha1.PhaseActive && !emergency {
			s.Next, s.Forced = s.Observed, false
			switch {
			case succ >= 0 && plan.Steps[succ].Next == v1alpha1.PhaseActive:
				s.Next, s.Gate, s.Message, s.OpensAt = v1alpha1.PhasePromoted, "", "", nil
				if e.forced(s.Generation, s.Desired) {
					s.Next, s.Forced = s.Desired, true
				}
			case succ >= 0:
				t := plan.Steps[succ]
				s.Gate, s.OpensAt = t.Gate, t.OpensAt
				s.Message = fmt.Sprintf("stays Active until %s becomes Active (%s: %s)", t.Generation, t.Generation, orDash(t.Message))
			default:
				s.Gate = v1alpha1.GateNoSuccessor
				s.Message = "the Active generation leaves Active only when another generation becomes Active: set one to Active (keyward trust activate)"
			}
		}
	}
	return plan
}

type evaluation struct {
	a            *v1alpha1.Authority
	now          time.Time
	observed     map[string]*v1alpha1.GenerationStatus
	soak, window time.Duration
	override     *v1alpha1.Override

	// Several gates read a generation's certificates, and published()
	// reads every generation's: each is parsed once.
	parsed          parsedGenerations
	canary, live    []Member
	bundlesComputed bool
}

// parsedGenerations holds ParseGeneration's result per generation name
// (unique in spec: listMapKey), for one Authority's spec.
type parsedGenerations map[string]parsedGeneration

type parsedGeneration struct {
	certs []*x509.Certificate
	err   error
}

// certs is ParseGeneration(g), parsed once.
func (m parsedGenerations) certs(g v1alpha1.Generation) ([]*x509.Certificate, error) {
	p, ok := m[g.Name]
	if !ok {
		p.certs, p.err = ParseGeneration(g)
		m[g.Name] = p
	}
	return p.certs, p.err
}

// bundles is BundleContents(e.a), computed once per evaluation.
func (e *evaluation) bundles() (canary, live []Member) {
	if !e.bundlesComputed {
		e.canary, e.live = bundleContents(e.a, e.parsed.certs)
		e.bundlesComputed = true
	}
	return e.canary, e.live
}

func (e *evaluation) phase(name string) v1alpha1.Phase {
	if g, ok := e.observed[name]; ok {
		return g.Phase
	}
	return ""
}

func (e *evaluation) forced(name string, desired v1alpha1.Phase) bool {
	return e.override != nil && e.override.Generations[name] == desired
}

// hop is the next phase on the way from observed to desired.
func hop(observed, desired v1alpha1.Phase) v1alpha1.Phase {
	down := desired == v1alpha1.PhaseRetiring || desired == v1alpha1.PhaseRetired
	switch observed {
	case "":
		if down {
			return v1alpha1.PhaseRetired
		}
		return v1alpha1.PhaseStaged
	case v1alpha1.PhaseStaged:
		if down {
			return v1alpha1.PhaseRetired
		}
		return v1alpha1.PhasePromoted
	case v1alpha1.PhasePromoted:
		switch desired {
		case v1alpha1.PhaseStaged:
			return v1alpha1.PhaseStaged
		case v1alpha1.PhaseActive:
			return v1alpha1.PhaseActive
		}
		return v1alpha1.PhaseRetiring
	case v1alpha1.PhaseActive:
		return v1alpha1.PhasePromoted
	case v1alpha1.PhaseRetiring:
		if desired == v1alpha1.PhaseRetired {
			return v1alpha1.PhaseRetired
		}
		return v1alpha1.PhasePromoted
	case v1alpha1.PhaseRetired:
		if down {
			return v1alpha1.PhaseRetired // Retiring is reached from Promoted only
		}
		return v1alpha1.PhaseStaged
	}
	return observed
}

// closed is one gate that holds a step.
type closed struct {
	gate    string
	message string
	opensAt *time.Time
}

func (e *evaluation) step(g v1alpha1.Generation, bootstrap bool) Step {
	desired := g.Phase
	if desired == "" {
		desired = v1alpha1.PhaseStaged
	}
	s := Step{Generation: g.Name, Observed: e.phase(g.Name), Desired: desired}
	s.Next = s.Observed
	if s.Observed == desired || (s.Observed == v1alpha1.PhaseRetired && desired == v1alpha1.PhaseRetiring) {
		return s
	}
	next := hop(s.Observed, desired)
	var gates []closed
	switch {
	case e.forced(g.Name, desired):
		next, s.Forced = desired, true
		gates = e.always(g, next)
	case bootstrap && desired == v1alpha1.PhaseActive:
		next = v1alpha1.PhaseActive
		gates = e.always(g, next)
	case s.Observed == v1alpha1.PhaseActive:
		// Decided with the successor's step (Evaluate).
		return s
	default:
		gates = e.edge(g, s.Observed, next)
	}
	if len(gates) == 0 {
		s.Next = next
		return s
	}
	s.Forced = false // an override that cannot be used is not reported as used
	s.Gate, s.Message, s.OpensAt = summarize(gates)
	s.Message = fmt.Sprintf("%s → %s: %s", orDash(string(s.Observed)), next, s.Message)
	return s
}

// always are the gates no override skips: a certificate that cannot be
// used, and (to become Active) a key the signer has not found usable.
func (e *evaluation) always(g v1alpha1.Generation, next v1alpha1.Phase) []closed {
	var out []closed
	if next == v1alpha1.PhaseStaged || next == v1alpha1.PhasePromoted || next == v1alpha1.PhaseActive {
		out = append(out, e.invalid(g)...)
	}
	if next == v1alpha1.PhaseActive {
		out = append(out, e.keyNotReady(g)...)
		out = append(out, e.notYetValid(g)...)
	}
	return out
}

// edge are the gates of one step from observed to next.
func (e *evaluation) edge(g v1alpha1.Generation, observed, next v1alpha1.Phase) []closed {
	out := e.always(g, next)
	switch {
	case next == v1alpha1.PhaseStaged && observed != v1alpha1.PhasePromoted:
		// Adding a root to the canary bundle breaks nothing.
	case observed == v1alpha1.PhaseRetiring && next == v1alpha1.PhasePromoted:
		// Neither does putting it back.
	case observed == v1alpha1.PhaseStaged && next == v1alpha1.PhasePromoted:
		out = append(out, e.published()...)
		out = append(out, e.soaked(g)...)
		out = append(out, e.propagated()...)
	case observed == v1alpha1.PhasePromoted && next == v1alpha1.PhaseActive:
		out = append(out, e.published()...)
		out = append(out, e.propagated()...)
	case observed == v1alpha1.PhasePromoted && next == v1alpha1.PhaseRetiring:
		out = append(out, e.published()...)
		out = append(out, e.leavesValid(g)...)
		out = append(out, e.propagated()...)
	case observed == v1alpha1.PhaseRetiring && next == v1alpha1.PhaseRetired:
		out = append(out, e.published()...)
		// Again: a retire that was forced past LeavesValid must not take
		// the root from live workloads too without a second override.
		out = append(out, e.leavesValid(g)...)
		out = append(out, e.soaked(g)...)
		out = append(out, e.propagated()...)
	case observed == v1alpha1.PhasePromoted && next == v1alpha1.PhaseStaged:
		out = append(out, e.published()...)
		out = append(out, e.leavesValid(g)...)
		out = append(out, e.propagated()...)
	case next == v1alpha1.PhaseRetired:
		// From Staged, or a generation never published.
		out = append(out, e.leavesValid(g)...)
	}
	return out
}

func (e *evaluation) invalid(g v1alpha1.Generation) []closed {
	certs, err := e.parsed.certs(g)
	if err != nil {
		return []closed{{gate: v1alpha1.GateInvalidCertificate, message: err.Error()}}
	}
	for _, c := range certs {
		if !e.now.Before(c.NotAfter) {
			return []closed{{gate: v1alpha1.GateInvalidCertificate, message: fmt.Sprintf("certificate %s expired at %s", c.Subject, stamp(c.NotAfter))}}
		}
	}
	return nil
}

func (e *evaluation) notYetValid(g v1alpha1.Generation) []closed {
	certs, err := e.parsed.certs(g)
	if err != nil {
		return nil // invalid() reports it
	}
	var late time.Time
	for _, c := range certs {
		if c.NotBefore.After(late) {
			late = c.NotBefore
		}
	}
	if !late.After(e.now) {
		return nil
	}
	return []closed{{gate: v1alpha1.GateNotYetValid, message: fmt.Sprintf("the CA certificate is valid from %s", stamp(late)), opensAt: &late}}
}

func (e *evaluation) keyNotReady(g v1alpha1.Generation) []closed {
	st := e.observed[g.Name]
	switch {
	case st == nil || st.KeyCheck == nil:
		return []closed{{gate: v1alpha1.GateKeyNotReady, message: "the signer has not reported on the key yet (status keyCheck)"}}
	case !record.Checks(st.KeyCheck, g):
		return []closed{{gate: v1alpha1.GateKeyNotReady, message: "the signer's keyCheck names another keyURI or certificate than spec's (checked before an edit); waiting for it to check this one"}}
	case !st.KeyCheck.Ready:
		return []closed{{gate: v1alpha1.GateKeyNotReady, message: "the signer cannot use the key: " + orDash(st.KeyCheck.Message)}}
	}
	return nil
}

func (e *evaluation) leavesValid(g v1alpha1.Generation) []closed {
	st := e.observed[g.Name]
	if st == nil || st.LastIssuedNotAfter == nil || !e.now.Before(st.LastIssuedNotAfter.Time) {
		return nil
	}
	t := st.LastIssuedNotAfter.Time
	return []closed{{gate: v1alpha1.GateLeavesValid, opensAt: &t,
		message: fmt.Sprintf("leaves signed with this key can be valid until %s (in %s)", stamp(t), t.Sub(e.now).Round(time.Second))}}
}

// published holds a step while a bundle does not hold what the observed
// phases put in it.
func (e *evaluation) published() []closed {
	canary, live := e.bundles()
	var out []closed
	for _, b := range []struct {
		version string
		members []Member
	}{{v1alpha1.BundleCanary, canary}, {v1alpha1.BundleLive, live}} {
		want := BundleDigest(b.members)
		st := e.bundle(b.version)
		switch {
		case st == nil && want == "":
		case st == nil || st.Digest != want:
			out = append(out, closed{gate: v1alpha1.GateBundleNotPublished, message: fmt.Sprintf("the %s bundle does not hold the current roots yet", b.version)})
		case !st.Published:
			out = append(out, closed{gate: v1alpha1.GateBundleNotPublished, message: e.unpublished(b.version)})
		}
	}
	return out
}

// unpublished says why a bundle status holds the current digest but not
// published: the trust publisher's latest write failed (BundlesPublished
// names the reason), or it is under way (between its status write and
// its bundle write, BundlesPublished is Pending).
func (e *evaluation) unpublished(version string) string {
	c := meta.FindStatusCondition(e.a.Status.Conditions, v1alpha1.ConditionBundlesPublished)
	if c == nil || c.Status == metav1.ConditionTrue || c.Reason == ReasonPublishPending {
		return fmt.Sprintf("the %s bundle is being written: the trust publisher has not confirmed the write yet", version)
	}
	return fmt.Sprintf("the %s bundle could not be written (%s; see condition %s)", version, c.Reason, v1alpha1.ConditionBundlesPublished)
}

func (e *evaluation) bundle(version string) *v1alpha1.BundleStatus {
	for i := range e.a.Status.Bundles {
		if e.a.Status.Bundles[i].Version == version {
			return &e.a.Status.Bundles[i]
		}
	}
	return nil
}

// propagated holds a step until every bundle change is a propagation
// window old: the longer of the window in force when the bundle changed
// and spec's now, so shortening spec.gates does not cut a window short.
func (e *evaluation) propagated() []closed {
	var last, opens time.Time
	window := e.window
	for _, b := range e.a.Status.Bundles {
		if b.LastChangeTime == nil {
			continue
		}
		w := e.window
		if b.PropagationWindow != nil && b.PropagationWindow.Duration > w {
			w = b.PropagationWindow.Duration
		}
		if o := b.LastChangeTime.Add(w); o.After(opens) {
			opens, last, window = o, b.LastChangeTime.Time, w
		}
	}
	if last.IsZero() || !e.now.Before(opens) {
		return nil
	}
	return []closed{{gate: v1alpha1.GatePropagationWindow, opensAt: &opens,
		message: fmt.Sprintf("a trust bundle changed %s ago, the propagation window is %s%s", e.now.Sub(last).Round(time.Second), window, inForce(window, e.window))}}
}

// inForce says, when a gate recorded at its start is longer than spec's
// value now, that the recorded one counts.
func inForce(recorded, spec time.Duration) string {
	if recorded <= spec {
		return ""
	}
	return fmt.Sprintf(" (in force when it began; spec.gates now says %s, which applies from the next one; only an override, recorded in an Event, cuts this one short)", spec)
}

// soaked holds a step until the generation's current phase has lasted the
// canary soak with canary health holding throughout.
func (e *evaluation) soaked(g v1alpha1.Generation) []closed {
	st := e.observed[g.Name]
	start := e.now
	if st != nil && st.Since != nil {
		start = st.Since.Time
	}
	if e.a.Spec.Gates.CanaryHealth != nil {
		c := meta.FindStatusCondition(e.a.Status.Conditions, v1alpha1.ConditionCanaryHealthy)
		switch {
		case c == nil:
			return []closed{{gate: v1alpha1.GateCanaryHealth, message: "canary health has not been checked yet"}}
		case c.Status != metav1.ConditionTrue:
			return []closed{{gate: v1alpha1.GateCanaryHealth, message: "canary health fails: " + orDash(c.Message)}}
		case c.LastTransitionTime.After(start):
			start = c.LastTransitionTime.Time
		}
	}
	soak := e.soak
	if st != nil && st.CanarySoak != nil && st.CanarySoak.Duration > soak {
		soak = st.CanarySoak.Duration
	}
	opens := start.Add(soak)
	if !e.now.Before(opens) {
		return nil
	}
	return []closed{{gate: v1alpha1.GateCanarySoak, opensAt: &opens,
		message: fmt.Sprintf("canary soak %s of %s%s", e.now.Sub(start).Round(time.Second), soak, inForce(soak, e.soak))}}
}

// summarize names the gate that holds longest: one without an end first,
// else the one that opens last. The message lists every closed gate.
func summarize(gates []closed) (string, string, *time.Time) {
	best := gates[0]
	for _, g := range gates[1:] {
		switch {
		case best.opensAt == nil:
		case g.opensAt == nil, g.opensAt.After(*best.opensAt):
			best = g
		}
	}
	var msgs []string
	for _, g := range gates {
		m := g.gate + ": " + g.message
		if g.opensAt != nil {
			m += ", opens at " + stamp(*g.opensAt)
		}
		msgs = append(msgs, m)
	}
	return best.gate, strings.Join(msgs, "; "), best.opensAt
}

func stepIndex(p Plan, name string) int {
	for i, s := range p.Steps {
		if s.Generation == name {
			return i
		}
	}
	return -1
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
