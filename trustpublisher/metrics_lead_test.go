package trustpublisher

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// keyward_trust_rotation_lead_time_seconds is what the CA-expiry alert
// compares the Active CA's remaining life with.
func TestRotationLeadTimeGauge(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) *metav1.Time { return &metav1.Time{Time: now.Add(d)} }
	for _, tc := range []struct {
		name  string
		gates v1alpha1.Gates
		gens  []v1alpha1.GenerationStatus
		want  time.Duration
	}{
		{"with default gates and no leaf issued the lead time is the soak plus the window", v1alpha1.Gates{}, nil,
			DefaultCanarySoak + DefaultPropagationWindow},
		{"configured gates replace the defaults",
			v1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: 24 * time.Hour}, PropagationWindow: &metav1.Duration{Duration: time.Hour}}, nil,
			25 * time.Hour},
		{"the Active generation's latest leaf adds the time until it expires", v1alpha1.Gates{},
			[]v1alpha1.GenerationStatus{{Name: "g1", Phase: v1alpha1.PhaseActive, LastIssuedNotAfter: at(72 * time.Hour)}},
			DefaultCanarySoak + DefaultPropagationWindow + 72*time.Hour},
		{"leaves of a generation that is not Active add nothing", v1alpha1.Gates{},
			[]v1alpha1.GenerationStatus{{Name: "g0", Phase: v1alpha1.PhaseRetiring, LastIssuedNotAfter: at(72 * time.Hour)}},
			DefaultCanarySoak + DefaultPropagationWindow},
		{"an expired latest leaf adds nothing", v1alpha1.Gates{},
			[]v1alpha1.GenerationStatus{{Name: "g1", Phase: v1alpha1.PhaseActive, LastIssuedNotAfter: at(-time.Hour)}},
			DefaultCanarySoak + DefaultPropagationWindow},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m, err := newMetrics(reg)
			if err != nil {
				t.Fatal(err)
			}
			a := &v1alpha1.Authority{
				ObjectMeta: metav1.ObjectMeta{Name: "a"},
				Spec:       v1alpha1.AuthoritySpec{SignerName: "keyward.dev/x", Gates: tc.gates},
				Status:     v1alpha1.AuthorityStatus{Generations: tc.gens},
			}
			m.observe(a, parsedGenerations{}, Plan{}, nil, nil, now)
			var got dto.Metric
			if err := m.leadTime.WithLabelValues("keyward.dev/x").Write(&got); err != nil {
				t.Fatal(err)
			}
			if got.GetGauge().GetValue() != tc.want.Seconds() {
				t.Errorf("lead time %vs, want %vs", got.GetGauge().GetValue(), tc.want.Seconds())
			}
		})
	}
}

// keyward_trust_step_held_seconds is what the stuck-rotation alert reads:
// how long a generation has sat in its phase while a gate holds it.
func TestStepHeldGauge(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	a := &v1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: "a"},
		Spec:       v1alpha1.AuthoritySpec{SignerName: "keyward.dev/x"},
		Status: v1alpha1.AuthorityStatus{Generations: []v1alpha1.GenerationStatus{
			{Name: "g1", Phase: v1alpha1.PhaseActive, Since: &metav1.Time{Time: now.Add(-90 * 24 * time.Hour)}},
			{Name: "g2", Phase: v1alpha1.PhaseStaged, Since: &metav1.Time{Time: now.Add(-3 * time.Hour)}},
			{Name: "g3", Phase: v1alpha1.PhaseStaged, Since: &metav1.Time{Time: now.Add(-2 * time.Hour)}},
		}},
	}
	plan := Plan{Steps: []Step{
		{Generation: "g1", Observed: v1alpha1.PhaseActive, Desired: v1alpha1.PhaseActive, Next: v1alpha1.PhaseActive},
		{Generation: "g2", Observed: v1alpha1.PhaseStaged, Desired: v1alpha1.PhaseActive, Next: v1alpha1.PhaseStaged, Gate: v1alpha1.GateCanaryHealth},
		{Generation: "g3", Observed: v1alpha1.PhaseStaged, Desired: v1alpha1.PhasePromoted, Next: v1alpha1.PhasePromoted},
	}}
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.observe(a, parsedGenerations{}, plan, nil, nil, now)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range families {
		if f.GetName() != "keyward_trust_step_held_seconds" {
			continue
		}
		for _, s := range f.Metric {
			l := map[string]string{}
			for _, p := range s.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			got = append(got, fmt.Sprintf("%s %s %s %v", l["generation"], l["phase"], l["gate"], s.GetGauge().GetValue()))
		}
	}
	// g1 has arrived and g3 moves now: only g2 is held, for 3 hours.
	if want := []string{"g2 Staged CanaryHealth 10800"}; !slices.Equal(got, want) {
		t.Errorf("held series %q, want %q", got, want)
	}
}
