package trustedit

import (
	"fmt"
	"maps"
	"testing"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
)

func TestSetPhase(t *testing.T) {
	gens := func(phases ...v1alpha1.Phase) *v1alpha1.Authority {
		a := &v1alpha1.Authority{}
		for i, p := range phases {
			a.Spec.Generations = append(a.Spec.Generations, v1alpha1.Generation{Name: fmt.Sprintf("g%d", i+1), Phase: p})
		}
		return a
	}
	cases := []struct {
		name    string
		a       *v1alpha1.Authority
		gen     string
		phase   v1alpha1.Phase
		changed map[string]v1alpha1.Phase
	}{
		{"activating a generation sends the current Active one back to Promoted in the same edit", gens(v1alpha1.PhaseActive, v1alpha1.PhasePromoted), "g2", v1alpha1.PhaseActive,
			map[string]v1alpha1.Phase{"g1": v1alpha1.PhasePromoted, "g2": v1alpha1.PhaseActive}},
		{"promoting changes only that generation", gens(v1alpha1.PhaseActive, v1alpha1.PhaseStaged), "g2", v1alpha1.PhasePromoted,
			map[string]v1alpha1.Phase{"g2": v1alpha1.PhasePromoted}},
		{"asking for the phase already desired changes nothing", gens(v1alpha1.PhaseActive, v1alpha1.PhaseStaged), "g2", v1alpha1.PhaseStaged,
			map[string]v1alpha1.Phase{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			changed, err := SetPhase(tc.a, tc.gen, tc.phase)
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(changed, tc.changed) {
				t.Errorf("changed %v, want %v", changed, tc.changed)
			}
			for _, g := range tc.a.Spec.Generations {
				if want, ok := tc.changed[g.Name]; ok && g.Phase != want {
					t.Errorf("%s desired %s, want %s", g.Name, g.Phase, want)
				}
			}
		})
	}
	if _, err := SetPhase(gens(v1alpha1.PhaseActive), "nope", v1alpha1.PhaseStaged); err == nil {
		t.Error("an unknown generation was accepted")
	}
}
