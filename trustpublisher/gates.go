// Package trustpublisher moves a signer's CA generations through a
// canary-then-live rotation and publishes their roots as
// ClusterTrustBundles. It never opens a key and never imports the signer:
// the two meet only through the Authority object.
package trustpublisher

import (
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Defaults of spec.gates when the object does not carry them (the CRD
// fills them in; a typed object built in code may not).
const (
	DefaultCanarySoak        = time.Hour
	DefaultPropagationWindow = 5 * time.Minute
)

// GateDurations are a's canary soak and propagation window: its spec.gates,
// else the defaults (also for a nil a, an Authority not created yet).
func GateDurations(a *v1alpha1.Authority) (soak, window time.Duration) {
	soak, window = DefaultCanarySoak, DefaultPropagationWindow
	if a == nil {
		return soak, window
	}
	if d := a.Spec.Gates.CanarySoak; d != nil {
		soak = d.Duration
	}
	if d := a.Spec.Gates.PropagationWindow; d != nil {
		window = d.Duration
	}
	return soak, window
}

// Step is where one generation stands at one instant and what it does next.
type Step struct {
	Generation string
	// Observed is the phase in status ("" for a generation status does not
	// list yet), Desired the one in spec, Next the phase it moves to now:
	// equal to Observed when it is held or has arrived.
	Observed, Desired, Next v1alpha1.Phase
	// Gate is the v1alpha1.Gate* that holds the step back; empty when the
	// generation moves or has nothing to do.
	Gate string
	// Message says why, naming the numbers.
	Message string
	// OpensAt is when a time-bound gate opens.
	OpensAt *time.Time
	// Forced is set when the override annotation skipped the gates.
	Forced bool
}

// Moves reports whether the step changes the generation's phase.
func (s Step) Moves() bool { return s.Next != s.Observed }

// Plan is what the controller does for one Authority at one instant.
type Plan struct {
	// Steps has one entry per spec generation, in spec order.
	Steps []Step
	// Override is the parsed override annotation, if any; OverrideErr says
	// why an annotation present could not be used.
	Override    *v1alpha1.Override
	OverrideErr error
}

// Changed reports whether any generation moves.
func (p Plan) Changed() bool {
	return slices.ContainsFunc(p.Steps, Step.Moves)
}

// Step returns the step of generation name.
func (p Plan) Step(name string) (Step, bool) {
	i := slices.IndexFunc(p.Steps, func(s Step) bool { return s.Generation == name })
	if i < 0 {
		return Step{}, false
	}
	return p.Steps[i], true
}

// Apply returns a copy of a whose status.generations carry the plan: the
// next phase, gate and gateOpensAt. A generation that moves loses its
// since (and canarySoak) until Confirm sets them: its phase takes effect
// only once the bundle writes it calls for have returned. The signer's
// fields (lastIssuedNotAfter, keyCheck) are kept; a generation no longer
// in spec is dropped. Bundles and conditions are left to the caller.
func (p Plan) Apply(a *v1alpha1.Authority, now time.Time) *v1alpha1.Authority {
	out := a.DeepCopy()
	old := map[string]v1alpha1.GenerationStatus{}
	for _, g := range a.Status.Generations {
		old[g.Name] = g
	}
	out.Status.Generations = nil
	for _, s := range p.Steps {
		g := old[s.Generation]
		g.Name = s.Generation
		if s.Moves() {
			g.Phase = s.Next
			g.Since, g.CanarySoak = nil, nil
			g.ReadyPodsAtSoakStart = nil
		}
		g.Gate = s.Gate
		g.GateOpensAt = nil
		if s.OpensAt != nil {
			g.GateOpensAt = &metav1.Time{Time: CeilSecond(*s.OpensAt)}
		}
		out.Status.Generations = append(out.Status.Generations, g)
	}
	return out
}

// Confirm sets since on every generation of a that has a phase and no
// since (moved by Apply, or written without one by hand or another tool),
// to at: the moment the bundle writes for those phases returned, rounded
// up with CeilSecond. A soaking generation (Staged, Retiring) also records
// the canary soak in force, so that shortening spec.gates later does not
// shorten it. Called once the writes are confirmed, never before: a phase
// counted from "now" at every sync would never end its soak, and one
// counted from before its bundle was written would end it early.
func Confirm(a *v1alpha1.Authority, at time.Time) {
	soak, _ := GateDurations(a)
	t := metav1.NewTime(CeilSecond(at))
	for i := range a.Status.Generations {
		g := &a.Status.Generations[i]
		if g.Phase == "" || g.Since != nil {
			continue
		}
		g.Since = t.DeepCopy()
		if soaking(g.Phase) {
			g.CanarySoak = &metav1.Duration{Duration: soak}
		}
	}
}

// CeilSecond rounds t up to the next whole second (t itself when it is
// one). The apiserver stores times to the second; a time rounded down
// would start a gate before the event it counts from.
func CeilSecond(t time.Time) time.Time {
	r := t.Truncate(time.Second)
	if r.Equal(t) {
		return r
	}
	return r.Add(time.Second)
}

// InCanary and InLive say which bundles a phase puts a generation's root in.
func InCanary(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseStaged || p == v1alpha1.PhasePromoted || p == v1alpha1.PhaseActive
}

// InLive: see InCanary.
func InLive(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhasePromoted || p == v1alpha1.PhaseActive || p == v1alpha1.PhaseRetiring
}

// Member is one root in a trust bundle.
type Member struct {
	// Generations names every generation whose root this is (several when
	// generations share a root, e.g. two intermediates under one).
	Generations []string
	Root        *x509.Certificate
}

// BundleContents returns the members of the canary and the live bundle as
// status's observed phases put them: each generation's root (the last
// certificate of certificatePEM followed by chainPEM), deduplicated by DER,
// in spec order. A generation whose certificates do not parse is left out
// (Evaluate holds it with GateInvalidCertificate).
func BundleContents(a *v1alpha1.Authority) (canary, live []Member) {
	return bundleContents(a, ParseGeneration)
}

func bundleContents(a *v1alpha1.Authority, parse func(v1alpha1.Generation) ([]*x509.Certificate, error)) (canary, live []Member) {
	observed := observedPhases(a)
	add := func(list []Member, gen string, root *x509.Certificate) []Member {
		for i := range list {
			if bytes.Equal(list[i].Root.Raw, root.Raw) {
				list[i].Generations = append(list[i].Generations, gen)
				return list
			}
		}
		return append(list, Member{Generations: []string{gen}, Root: root})
	}
	for _, g := range a.Spec.Generations {
		p := observed[g.Name]
		if !InCanary(p) && !InLive(p) {
			continue
		}
		certs, err := parse(g)
		if err != nil {
			continue
		}
		root := certs[len(certs)-1]
		if InCanary(p) {
			canary = add(canary, g.Name, root)
		}
		if InLive(p) {
			live = add(live, g.Name, root)
		}
	}
	return canary, live
}

// BundlePEM is a bundle's content: each member's root as a PEM block.
func BundlePEM(members []Member) string {
	var b strings.Builder
	for _, m := range members {
		b.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: m.Root.Raw}))
	}
	return b.String()
}

// BundleDigest is the hex SHA-256 of BundlePEM, or "" for no member (a
// bundle with no member is not published at all).
func BundleDigest(members []Member) string {
	if len(members) == 0 {
		return ""
	}
	sum := sha256.Sum256([]byte(BundlePEM(members)))
	return hex.EncodeToString(sum[:])
}

// ParseGeneration parses a generation's certificatePEM and chainPEM into
// the CA certificate followed by its issuers, and checks that each is a CA
// and that each is signed by the next (ca.CheckLinked).
func ParseGeneration(g v1alpha1.Generation) ([]*x509.Certificate, error) {
	certs, err := pemcert.Parse([]byte(g.CertificatePEM))
	if err != nil {
		return nil, fmt.Errorf("certificatePEM: %w", err)
	}
	if len(certs) == 0 {
		return nil, errors.New("certificatePEM holds no CERTIFICATE block")
	}
	chain, err := pemcert.Parse([]byte(g.ChainPEM))
	if err != nil {
		return nil, fmt.Errorf("chainPEM: %w", err)
	}
	certs = append(certs, chain...)
	if err := ca.CheckLinked(certs); err != nil {
		return nil, err
	}
	return certs, nil
}

func observedPhases(a *v1alpha1.Authority) map[string]v1alpha1.Phase {
	out := map[string]v1alpha1.Phase{}
	for _, g := range a.Status.Generations {
		out[g.Name] = g.Phase
	}
	return out
}

// ParseOverride reads the override annotation; nil, nil when absent.
func ParseOverride(a *v1alpha1.Authority) (*v1alpha1.Override, error) {
	v, ok := a.Annotations[v1alpha1.OverrideAnnotation]
	if !ok {
		return nil, nil
	}
	var o v1alpha1.Override
	dec := json.NewDecoder(strings.NewReader(v))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", v1alpha1.OverrideAnnotation, err)
	}
	if strings.TrimSpace(o.Reason) == "" {
		return nil, fmt.Errorf("annotation %s: reason is required", v1alpha1.OverrideAnnotation)
	}
	if len(o.Generations) == 0 {
		return nil, fmt.Errorf("annotation %s: generations is empty", v1alpha1.OverrideAnnotation)
	}
	return &o, nil
}
