package record

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Finding is a status phase the trust publisher did not move: neither its
// record nor its latest write says so.
type Finding struct {
	Generation string
	// Phase and Since are what status says.
	Phase v1alpha1.Phase
	Since *metav1.Time
	// Recorded is the phase the trust publisher's record holds for the
	// generation's current certificate ("": none).
	Recorded v1alpha1.Phase
	// CertificateChanged: the record holds a phase for this generation,
	// reached with another certificate (a root swapped in place).
	CertificateChanged bool
	// Writer is the field manager managedFields name for the phase, and
	// WrittenAt its time. A writer picks its field manager name freely:
	// this says who claims to have written it, not who did.
	Writer    string
	WrittenAt *metav1.Time
}

// String says what was found, naming the generation and the writer.
func (f Finding) String() string {
	if f.CertificateChanged {
		return fmt.Sprintf("generation %s: its certificate changed after it reached %s: its clock restarts (a new root is a new generation)", f.Generation, f.Phase)
	}
	what := "phase " + string(f.Phase)
	if f.Phase == f.Recorded {
		what = fmt.Sprintf("phase %s since %s", f.Phase, stamp(f.Since))
	}
	writer := "an unknown writer"
	if f.Writer != "" {
		writer = "field manager " + f.Writer
		if f.Writer == v1alpha1.FieldManagerTrustPublisher {
			writer += " (a name any writer can give)"
		}
		if f.WrittenAt != nil {
			writer += " at " + stamp(f.WrittenAt)
		}
	}
	rec := "no phase"
	if f.Recorded != "" {
		rec = string(f.Recorded)
	}
	return fmt.Sprintf("generation %s: %s was written by %s, not by the trust publisher (its record: %s); not acted on", f.Generation, what, writer, rec)
}

func stamp(t *metav1.Time) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// Trusted is the phase and since of each spec generation that the trust
// publisher stands by: its own latest write (pending, by generation name;
// nil when it has written nothing this term), else its record. A
// generation it has no word on is absent.
func Trusted(a *v1alpha1.Authority, r *Record, pending map[string]Entry) map[string]Entry {
	out := map[string]Entry{}
	for _, g := range a.Spec.Generations {
		if e, ok := pending[g.Name]; ok {
			if e.CertificateDigest == CertificateDigest(g) {
				out[g.Name] = e
			}
			continue
		}
		if e, ok := r.Entry(g); ok {
			out[g.Name] = e
		}
	}
	return out
}

// Verify lists the spec generations whose status phase (or since) is not
// what Trusted says. A status phase that puts the root in no bundle
// (Retired) with nothing trusted is no finding: it publishes nothing.
func Verify(a *v1alpha1.Authority, r *Record, pending map[string]Entry) []Finding {
	trusted := Trusted(a, r, pending)
	status := map[string]v1alpha1.GenerationStatus{}
	for _, s := range a.Status.Generations {
		status[s.Name] = s
	}
	var out []Finding
	for _, g := range a.Spec.Generations {
		s := status[g.Name]
		t, ok := trusted[g.Name]
		switch {
		case ok && s.Phase == t.Phase && sameSecond(s.Since, t.Since):
			continue
		case !ok && (s.Phase == "" || s.Phase == v1alpha1.PhaseRetired):
			continue
		}
		f := Finding{Generation: g.Name, Phase: s.Phase, Since: s.Since, Recorded: t.Phase}
		if !ok && s.Phase != "" {
			f.CertificateChanged = changed(g, r, pending)
		}
		f.Writer, f.WrittenAt = PhaseWriter(a, g.Name)
		out = append(out, f)
	}
	return out
}

// changed: a phase of g is recorded (or pending) for another certificate.
func changed(g v1alpha1.Generation, r *Record, pending map[string]Entry) bool {
	if e, ok := pending[g.Name]; ok {
		return e.CertificateDigest != CertificateDigest(g)
	}
	if r == nil {
		return false
	}
	for _, e := range r.Generations {
		if e.Name == g.Name {
			return e.CertificateDigest != CertificateDigest(g)
		}
	}
	return false
}

func sameSecond(a, b *metav1.Time) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.Truncate(time.Second).Equal(b.Truncate(time.Second))
}

// PhaseWriter is the field manager that managedFields say owns
// status.generations[name].phase, and when it wrote. It is what the writer
// claimed: any identity allowed to write status names any manager.
func PhaseWriter(a *v1alpha1.Authority, name string) (string, *metav1.Time) {
	key := fmt.Sprintf(`k:{"name":%q}`, name)
	for _, mf := range a.ManagedFields {
		if mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]map[string]map[string]map[string]any
		if err := json.Unmarshal(mf.FieldsV1.Raw, &fields); err != nil {
			continue
		}
		if _, ok := fields["f:status"]["f:generations"][key]["f:phase"]; ok {
			return mf.Manager, mf.Time
		}
	}
	return "", nil
}

// Active is the generation the trust publisher's record says is Active,
// with its current certificate ("" when none is).
func Active(a *v1alpha1.Authority, r *Record) string {
	for _, g := range a.Spec.Generations {
		if r.Phase(g) == v1alpha1.PhaseActive {
			return g.Name
		}
	}
	return ""
}

// Changed are the spec generations whose trusted phase (pending, else
// recorded) was reached with another certificate: a root swapped in place.
func Changed(a *v1alpha1.Authority, r *Record, pending map[string]Entry) map[string]Entry {
	out := map[string]Entry{}
	for _, g := range a.Spec.Generations {
		if !changed(g, r, pending) {
			continue
		}
		if e, ok := pending[g.Name]; ok {
			out[g.Name] = e
			continue
		}
		for _, e := range r.Generations {
			if e.Name == g.Name {
				out[g.Name] = e
			}
		}
	}
	return out
}
