package trustpublisher

import (
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Between the trust publisher's two status writes the status holds the
// new digest, not yet published, with BundlesPublished Pending: a promote
// refused then must say the write is under way, not that it failed; a
// write that did fail says so and names the reason.
func TestBundleNotPublishedSaysWhetherTheWriteFailed(t *testing.T) {
	old, next := rootCA(t, "old root"), rootCA(t, "new root")
	cases := []struct {
		name          string
		cond          *metav1.Condition
		want, wantNot string
	}{
		{"between the two status writes", &metav1.Condition{Type: v1alpha1.ConditionBundlesPublished, Status: metav1.ConditionFalse, Reason: ReasonPublishPending, Message: "not yet published: x:canary"},
			"canary bundle is being written", "could not be written"},
		{"before any condition", nil, "canary bundle is being written", "could not be written"},
		{"after a refused write", &metav1.Condition{Type: v1alpha1.ConditionBundlesPublished, Status: metav1.ConditionFalse, Reason: ReasonAttestForbidden, Message: "missing grant: verb attest"},
			"canary bundle could not be written (" + ReasonAttestForbidden, "being written"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(time.Second, time.Second).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
				gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-time.Hour)).published(t0.Add(-time.Hour))
			for i := range f.a.Status.Bundles {
				if f.a.Status.Bundles[i].Version == v1alpha1.BundleCanary {
					f.a.Status.Bundles[i].Published = false
				}
			}
			if tc.cond != nil {
				f.a.Status.Conditions = append(f.a.Status.Conditions, *tc.cond)
			}
			s, _ := Evaluate(f.a, t0).Step("b")
			if s.Gate != v1alpha1.GateBundleNotPublished || !strings.Contains(s.Message, tc.want) || strings.Contains(s.Message, tc.wantNot) {
				t.Fatalf("b held by %s: %q; want %s saying %q, not %q", s.Gate, s.Message, v1alpha1.GateBundleNotPublished, tc.want, tc.wantNot)
			}
		})
	}
}
