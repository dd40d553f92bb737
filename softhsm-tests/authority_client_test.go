package softhsmtests

import (
	"testing"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The signer and the trust publisher write different fields of the same
// status.generations entries by server-side apply: neither erases the
// other's, and the CRD's defaults for gates are served.
func TestAuthorityStatusHasTwoWriters(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c, err := authclient.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t, "two-writers")
	a, err := c.Create(ctx, &kwv1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kwv1alpha1.AuthoritySpec{SignerName: "example.com/" + name, Generations: []kwv1alpha1.Generation{
			{Name: "g1", KeyURI: "file:/nowhere", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseActive},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if g := a.Spec.Gates; g.CanarySoak == nil || g.CanarySoak.Duration != time.Hour || g.PropagationWindow == nil || g.PropagationWindow.Duration != 5*time.Minute {
		t.Fatalf("gates defaults = %+v, want canarySoak 1h and propagationWindow 5m", g)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "g1", "phase": "Active", "since": now}}},
		kwv1alpha1.FieldManagerTrustPublisher); err != nil {
		t.Fatalf("trust publisher's apply: %v", err)
	}
	if _, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "g1", "lastIssuedNotAfter": now, "keyCheck": map[string]any{"ready": true}}}},
		kwv1alpha1.FieldManagerSigner); err != nil {
		t.Fatalf("signer's apply: %v", err)
	}
	// The trust publisher applies again without the signer's fields.
	got, err := c.ApplyStatus(ctx, name, map[string]any{"generations": []map[string]any{{"name": "g1", "phase": "Active", "since": now, "gate": kwv1alpha1.GateNoSuccessor}}},
		kwv1alpha1.FieldManagerTrustPublisher)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Generations) != 1 {
		t.Fatalf("status generations = %+v", got.Status.Generations)
	}
	g := got.Status.Generations[0]
	if g.Phase != kwv1alpha1.PhaseActive || g.Gate != kwv1alpha1.GateNoSuccessor || g.LastIssuedNotAfter == nil || g.KeyCheck == nil || !g.KeyCheck.Ready {
		t.Fatalf("status generation = %+v: one writer erased the other's fields", g)
	}
	list, err := c.List(ctx, metav1.ListOptions{})
	if err != nil || len(list.Items) == 0 {
		t.Fatalf("list: %v (%d items)", err, len(list.Items))
	}
}
