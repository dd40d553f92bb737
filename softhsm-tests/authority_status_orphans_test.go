package softhsmtests

import (
	"fmt"
	"testing"
	"time"

	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// What the apiserver does with a status.generations entry only the signer
// still applies (the generation is gone from spec, the trust publisher
// dropped its fields): it stays, and once orphans fill the 8 items the
// signer's next apply that adds a generation — its reservation included —
// is refused. Applying only spec's generations lets the entry go.
func TestSignerOrphanStatusEntriesFillStatus(t *testing.T) {
	ctx := testContext(t)
	c := authorities(t)
	name := uniqueName(t, "orphans")
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	var spec []kwv1alpha1.Generation
	for i := range 8 {
		spec = append(spec, kwv1alpha1.Generation{Name: fmt.Sprintf("g%d", i), KeyURI: "file:/nowhere", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseRetired})
	}
	spec[7].Phase = kwv1alpha1.PhaseActive
	a, err := c.Create(ctx, &kwv1alpha1.Authority{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kwv1alpha1.AuthoritySpec{SignerName: "example.com/" + name, Generations: spec}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	entries := func(names ...string) []map[string]any {
		var out []map[string]any
		for _, n := range names {
			out = append(out, map[string]any{"name": n, "lastIssuedNotAfter": now})
		}
		return out
	}
	var all []string
	for _, g := range spec {
		all = append(all, g.Name)
	}
	if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": entries(all...)}, kwv1alpha1.FieldManagerSigner); err != nil {
		t.Fatal(err)
	}
	// g0..g6 retired and removed from spec; the trust publisher reports g7 only.
	if a, err = c.Get(ctx, name); err != nil {
		t.Fatal(err)
	}
	a.Spec.Generations = a.Spec.Generations[7:]
	if _, err := c.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "g7", "phase": "Active"}}}, kwv1alpha1.FieldManagerTrustPublisher); err != nil {
		t.Fatal(err)
	}
	// The signer as it was: spec then status names.
	got, err := c.ApplyStatus(ctx, name, map[string]any{"generations": entries(all...)}, kwv1alpha1.FieldManagerSigner)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(got.Status.Generations); n != 8 {
		t.Fatalf("%d status generations, want the 7 orphans kept alongside g7", n)
	}
	// A new generation in spec: the signer's apply carrying its keyCheck
	// (and with it the Active one's reservation) is refused.
	cur, err := c.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.Generations = append(cur.Spec.Generations, kwv1alpha1.Generation{Name: "g8", KeyURI: "file:/nowhere", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseStaged})
	if _, err := c.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = c.ApplyStatus(ctx, name, map[string]any{"generations": entries(append(all, "g8")...)}, kwv1alpha1.FieldManagerSigner)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("apply with a 9th entry = %v, want Invalid (too many items)", err)
	}
	// The signer as it is now: spec's generations only. The orphans go.
	got, err = c.ApplyStatus(ctx, name, map[string]any{"generations": entries("g7", "g8")}, kwv1alpha1.FieldManagerSigner)
	if err != nil {
		t.Fatalf("apply of spec's generations only: %v", err)
	}
	if n := len(got.Status.Generations); n != 2 {
		t.Fatalf("status generations = %+v, want g7 and g8 only", got.Status.Generations)
	}
}
