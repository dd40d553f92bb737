package softhsmtests

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// managedEntry names one managedFields entry.
type managedEntry struct{ manager, operation, subresource string }

func managedEntries(m []metav1.ManagedFieldsEntry) map[managedEntry]bool {
	out := map[managedEntry]bool{}
	for _, e := range m {
		out[managedEntry{e.Manager, string(e.Operation), e.Subresource}] = true
	}
	return out
}

// decoratedPCR has w's node create a v1 request for signerName, then an
// admin add a label, an annotation and an owner reference to the pod, so
// that the request carries every kind of metadata keyward's informer
// transform drops. It returns the stored request.
func decoratedPCR(t *testing.T, ctx context.Context, w *controlplane.WorkloadObjects, signerName string) *certv1.PodCertificateRequest {
	t.Helper()
	created, _ := createPCR(t, ctx, w, signerName, pcrOptions{})
	created.Labels = map[string]string{"team": "payments"}
	created.Annotations = map[string]string{"example.com/note": "kept by the apiserver"}
	created.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: w.Pod.Name, UID: w.Pod.UID}}
	updated, err := cp.AdminClient().CertificatesV1().PodCertificateRequests(created.Namespace).Update(ctx, created, metav1.UpdateOptions{FieldManager: "test-admin"})
	if err != nil {
		t.Fatalf("admin decorating the PCR: %v", err)
	}
	if len(updated.ManagedFields) < 2 {
		t.Fatalf("want the node's and the admin's managedFields, got %+v", updated.ManagedFields)
	}
	return updated
}

// checkKept fails unless after has before's spec, labels, annotations,
// owners and managedFields entries, plus one for /status.
func checkKept(t *testing.T, before *certv1.PodCertificateRequest, after *certv1.PodCertificateRequest) {
	t.Helper()
	if !equality.Semantic.DeepEqual(after.Spec, before.Spec) {
		t.Errorf("spec changed:\n%+v\nwas\n%+v", after.Spec, before.Spec)
	}
	if !equality.Semantic.DeepEqual(after.Labels, before.Labels) || !equality.Semantic.DeepEqual(after.Annotations, before.Annotations) ||
		!equality.Semantic.DeepEqual(after.OwnerReferences, before.OwnerReferences) {
		t.Errorf("metadata changed: labels %v annotations %v owners %v", after.Labels, after.Annotations, after.OwnerReferences)
	}
	got := managedEntries(after.ManagedFields)
	for e := range managedEntries(before.ManagedFields) {
		if !got[e] {
			t.Errorf("managedFields entry %+v lost: %+v", e, after.ManagedFields)
		}
	}
	status := false
	for e := range got {
		status = status || e.subresource == "status"
	}
	if !status {
		t.Errorf("no managedFields entry for the status write: %+v", after.ManagedFields)
	}
}

// The controller writes status from what its informer transform keeps (no
// managedFields, labels, annotations or owners; a terminal request is never
// written again). The real apiserver must take the rest from the stored
// object: spec and metadata from it on /status, and managedFields kept when
// the request carries none. Proven here with an object trimmed further
// than the transform trims (no spec at all), through both versions.
func TestTransformedRequestStatusWrite(t *testing.T) {
	ctx := testContext(t)
	name := "keyward.dev/trim-" + uniqueName(t, "s")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)

	for _, version := range []string{"v1", "v1beta1"} {
		t.Run("a status written through "+version+" from metadata identity alone keeps everything else", func(t *testing.T) {
			before := decoratedPCR(t, ctx, w, name)
			trimmed := metav1.ObjectMeta{Name: before.Name, Namespace: before.Namespace, UID: before.UID, ResourceVersion: before.ResourceVersion}
			denied := []metav1.Condition{{Type: "Denied", Status: metav1.ConditionTrue, Reason: "TrimTest",
				Message: "written from a trimmed object", LastTransitionTime: metav1.NewTime(time.Now())}}
			var err error
			switch version {
			case "v1":
				_, err = signerClient(t).CertificatesV1().PodCertificateRequests(before.Namespace).UpdateStatus(ctx,
					&certv1.PodCertificateRequest{ObjectMeta: trimmed, Status: certv1.PodCertificateRequestStatus{Conditions: denied}}, metav1.UpdateOptions{})
			case "v1beta1":
				_, err = signerClient(t).CertificatesV1beta1().PodCertificateRequests(before.Namespace).UpdateStatus(ctx,
					&certv1beta1.PodCertificateRequest{ObjectMeta: trimmed, Status: certv1beta1.PodCertificateRequestStatus{Conditions: denied}}, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Fatalf("status write from a trimmed object refused: %v", err)
			}
			after, err := cp.AdminClient().CertificatesV1().PodCertificateRequests(before.Namespace).Get(ctx, before.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if len(after.Status.Conditions) != 1 || after.Status.Conditions[0].Reason != "TrimTest" {
				t.Fatalf("status not written: %+v", after.Status)
			}
			checkKept(t, before, after)
		})
	}

	// v1 forced, and discovery (which reads through v1beta1 here).
	for _, version := range []string{"v1", ""} {
		t.Run("the signer ("+map[string]string{"v1": "v1 forced", "": "discovery"}[version]+") issues from its trimmed cache and the request keeps its metadata", func(t *testing.T) {
			// Created before the signer starts, so that the decoration is
			// in place when the signer first sees it.
			before := decoratedPCR(t, ctx, w, name)
			suffix := uniqueName(t, "c")
			keyURI, caFile, root := caInToken(t, "ca-"+suffix)
			runSignerVersion(t, baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile)), "replica-0", version)
			after := waitTerminal(t, ctx, before, 30*time.Second)
			if c := condition(after); c.Type != "Issued" {
				t.Fatalf("%s/%s: %s", c.Type, c.Reason, c.Message)
			}
			parseChain(t, after.Status.CertificateChain, root)
			checkKept(t, before, after)
			if !bytes.Equal(after.Spec.StubPKCS10Request, before.Spec.StubPKCS10Request) {
				t.Fatal("stub request changed")
			}
		})
	}
}
