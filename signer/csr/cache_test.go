package csr

import (
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// cachedCSR is a CSR as the informer receives it: managedFields, a label,
// an annotation, the request, and the given conditions and certificate.
func cachedCSR(conds []certv1.CertificateSigningRequestCondition, cert []byte) *certv1.CertificateSigningRequest {
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{
			Name: "csr-1", UID: "uid-1", ResourceVersion: "42", CreationTimestamp: now,
			Labels: map[string]string{"team": "payments"}, Annotations: map[string]string{"example.com/note": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationUpdate,
				FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:spec":{"f:request":{}}}`)}}},
		},
		Spec: certv1.CertificateSigningRequestSpec{
			SignerName: "keyward.dev/node-daemons", Request: []byte("-----BEGIN CERTIFICATE REQUEST-----"),
			Username: "system:node:n1", Usages: []certv1.KeyUsage{certv1.UsageClientAuth},
		},
		Status: certv1.CertificateSigningRequestStatus{Conditions: conds, Certificate: cert},
	}
}

func cond(t certv1.RequestConditionType) certv1.CertificateSigningRequestCondition {
	return certv1.CertificateSigningRequestCondition{Type: t, Status: corev1.ConditionTrue, Reason: "Test",
		Message: "a long message the cache need not keep", LastUpdateTime: metav1.Now()}
}

func TestTheInformerTransformKeepsWhatSigningNeeds(t *testing.T) {
	approved := []certv1.CertificateSigningRequestCondition{cond(certv1.CertificateApproved)}
	for _, tc := range []struct {
		name       string
		in         *certv1.CertificateSigningRequest
		wantStub   bool
		wantSigned bool
	}{
		{name: "a pending approved CSR keeps all but its managedFields", in: cachedCSR(approved, nil)},
		{name: "an unapproved CSR keeps all but its managedFields", in: cachedCSR(nil, nil)},
		{name: "a signed CSR becomes a stub that is still done", in: cachedCSR(approved, []byte("-----BEGIN CERTIFICATE-----")), wantStub: true, wantSigned: true},
		{name: "a denied CSR becomes a stub that is still done", in: cachedCSR([]certv1.CertificateSigningRequestCondition{cond(certv1.CertificateDenied)}, nil), wantStub: true},
		{name: "a failed CSR becomes a stub that is still done", in: cachedCSR(append(approved, cond(certv1.CertificateFailed)), nil), wantStub: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			orig := tc.in.DeepCopy()
			out, err := trim(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			got := out.(*certv1.CertificateSigningRequest)
			if got.ManagedFields != nil {
				t.Errorf("managedFields kept: %+v", got.ManagedFields)
			}
			if got.Name != orig.Name || got.UID != orig.UID || got.ResourceVersion != orig.ResourceVersion || got.Spec.SignerName != orig.Spec.SignerName {
				t.Errorf("identity lost: %+v", got.ObjectMeta)
			}
			if done(got) != done(orig) || pending(got) != pending(orig) {
				t.Errorf("done/pending %v/%v, was %v/%v", done(got), pending(got), done(orig), pending(orig))
			}
			if !tc.wantStub {
				want := orig.DeepCopy()
				want.ManagedFields = nil
				if !equality.Semantic.DeepEqual(got, want) {
					t.Errorf("pending CSR changed beyond managedFields:\n%+v\nwant\n%+v", got, want)
				}
				return
			}
			if got.Spec.Request != nil || got.Labels != nil || got.Annotations != nil || got.Spec.Username != "" {
				t.Errorf("stub keeps more than its identity: %+v", got)
			}
			if signed := len(got.Status.Certificate) > 0; signed != tc.wantSigned {
				t.Errorf("stub signed = %v, want %v", signed, tc.wantSigned)
			}
			for _, c := range got.Status.Conditions {
				if c.Message != "" || c.Reason != "" {
					t.Errorf("stub condition keeps its text: %+v", c)
				}
			}
		})
	}
	t.Run("a tombstone passes through", func(t *testing.T) {
		ts := cache.DeletedFinalStateUnknown{Key: "csr-1", Obj: cachedCSR(nil, nil)}
		out, err := trim(ts)
		if err != nil || !equality.Semantic.DeepEqual(out, ts) {
			t.Fatalf("got %+v, %v", out, err)
		}
	})
}
