package trustpublisher

import (
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
