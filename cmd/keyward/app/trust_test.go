package app

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
)

func TestExitCode(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want int
	}{
		{"success exits 0", nil, 0},
		{"a held gate exits 3, also through the redacting wrapper", &redactedError{err: &GateError{Step: trustpublisher.Step{Gate: v1alpha1.GateCanarySoak}}}, ExitGateHolds},
		{"a --wait timeout exits 4", fmt.Errorf("x: %w", ErrWaitTimeout), ExitWaitTimeout},
		{"any other error exits 1", errors.New("boom"), 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Errorf("ExitCode = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestAuthorityNameFor(t *testing.T) {
	cases := []struct{ signer, want string }{
		{"example.com/workload", "example.com.workload"},
		{"keyward.dev/a_b/C", "keyward.dev.a-b.c"},
		{"example.com/x./y", "example.com.x.y"},
	}
	for _, tc := range cases {
		t.Run(tc.signer+" becomes "+tc.want, func(t *testing.T) {
			got, err := authorityNameFor(tc.signer)
			if err != nil || got != tc.want {
				t.Errorf("got %q, %v", got, err)
			}
		})
	}
}

// --wait reports the phases it saw as a sentence, not a Go map.
func TestPhaseListReadsAsASentence(t *testing.T) {
	got := phaseList(map[string]v1alpha1.Phase{"b": v1alpha1.PhasePromoted, "a": v1alpha1.PhaseActive})
	if want := "a Active, b Promoted"; got != want {
		t.Errorf("phaseList = %q, want %q", got, want)
	}
}

// --force refuses to replace an override the controller has not applied
// yet; an unusable one, or none, does not stop it.
func TestForceRefusesToReplaceAPendingOverride(t *testing.T) {
	withAnnotation := func(v string, observedB v1alpha1.Phase) *v1alpha1.Authority {
		a := &v1alpha1.Authority{}
		a.Name = "example"
		a.Spec.Generations = []v1alpha1.Generation{{Name: "a", Phase: v1alpha1.PhaseRetired}, {Name: "b", Phase: v1alpha1.PhaseActive}}
		a.Status.Generations = []v1alpha1.GenerationStatus{{Name: "a", Phase: v1alpha1.PhaseRetired}, {Name: "b", Phase: observedB}}
		if v != "" {
			a.Annotations = map[string]string{v1alpha1.OverrideAnnotation: v}
		}
		return a
	}
	const emergency = `{"reason":"INC-42","generations":{"a":"Retired","b":"Active"}}`
	for _, tc := range []struct {
		name, annotation string
		observedB        v1alpha1.Phase
		want             error
	}{
		{"no override: nothing to lose", "", v1alpha1.PhasePromoted, nil},
		{"an override with an entry still waiting is not replaced", emergency, v1alpha1.PhasePromoted, ErrOverridePending},
		{"an override whose entries all arrived is replaced (the controller removes it anyway)", emergency, v1alpha1.PhaseActive, nil},
		{"a stale override is replaced (spec asks for something else)", `{"reason":"x","generations":{"b":"Staged"}}`, v1alpha1.PhasePromoted, nil},
		{"an unusable override is replaced (the controller drops it anyway)", `{"generations":{"a":"Retired"}}`, v1alpha1.PhasePromoted, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkNoPendingOverride(withAnnotation(tc.annotation, tc.observedB), time.Now()); !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
