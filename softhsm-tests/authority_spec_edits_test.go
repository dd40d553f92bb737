package softhsmtests

import (
	"testing"
	"time"

	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Spec edits that pull a root out of both trust bundles while leaves it
// signed can still be valid (BundleContents reads roots from spec only,
// so the trust publisher publishes without it on its next sync) must be
// refused by the apiserver: nothing in the trust publisher can hold them.
func TestSpecEditsCannotDropARootStillInUse(t *testing.T) {
	ctx := testContext(t)
	c := authorities(t)
	cases := []struct {
		name string
		edit func(a *kwv1alpha1.Authority)
	}{
		{"a generation observed Active is removed from spec after its spec phase is set Retired", func(a *kwv1alpha1.Authority) {
			a.Spec.Generations = a.Spec.Generations[1:]
		}},
		{"the certificate of a generation observed Active is replaced", func(a *kwv1alpha1.Authority) {
			a.Spec.Generations[0].CertificatePEM = testCACertPEM + testCACertPEM
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			name := uniqueName(t, "spec-edit")
			future := metav1.NewTime(time.Now().Add(24 * time.Hour).Truncate(time.Second))
			if _, err := c.Create(ctx, &kwv1alpha1.Authority{ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: kwv1alpha1.AuthoritySpec{SignerName: "example.com/" + name, Generations: []kwv1alpha1.Generation{
					{Name: "a", KeyURI: "file:/a", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseActive},
					{Name: "b", KeyURI: "file:/b", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseStaged},
				}}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "a", "phase": "Active"}, {"name": "b", "phase": "Staged"}}},
				kwv1alpha1.FieldManagerTrustPublisher); err != nil {
				t.Fatal(err)
			}
			if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "a", "lastIssuedNotAfter": future}}},
				kwv1alpha1.FieldManagerSigner); err != nil {
				t.Fatal(err)
			}
			// Spec asks for Retired (accepted: the trust publisher holds it
			// with NoSuccessor / LeavesValid).
			a, err := c.Get(ctx, name)
			if err != nil {
				t.Fatal(err)
			}
			a.Spec.Generations[0].Phase = kwv1alpha1.PhaseRetired
			if a, err = c.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			tc.edit(a)
			if _, err := c.Update(ctx, a, metav1.UpdateOptions{}); err == nil {
				t.Fatal("the apiserver accepted the edit while status shows the generation Active with leaves valid for 24h: its root leaves both bundles at once")
			}
		})
	}
}

// docs/rotation.md: even a generation that never signed (no
// lastIssuedNotAfter) cannot get another key or certificate once status
// puts its root in a bundle (here Active): a swapped root would inherit
// the old one's soak. A new root is a new generation.
func TestSpecEditsCannotSwapTheRootOfAGenerationThatNeverSigned(t *testing.T) {
	ctx := testContext(t)
	c := authorities(t)
	name := uniqueName(t, "spec-fix")
	if _, err := c.Create(ctx, &kwv1alpha1.Authority{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kwv1alpha1.AuthoritySpec{SignerName: "example.com/" + name, Generations: []kwv1alpha1.Generation{
			{Name: "a", KeyURI: "file:/a", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseActive},
		}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "a", "phase": "Active"}}},
		kwv1alpha1.FieldManagerTrustPublisher); err != nil {
		t.Fatal(err)
	}
	a, err := c.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	a.Spec.Generations[0].KeyURI = "file:/a2"
	a.Spec.Generations[0].CertificatePEM = testCACertPEM + testCACertPEM
	if _, err := c.Update(ctx, a, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("swapping the key and certificate of an Active generation that never signed: %v, want Invalid", err)
	}
}
