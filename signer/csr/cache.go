package csr

import (
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The informer keeps only what signing and the status write need of each
// CSR (trim runs before an object is stored or handed to a handler):
//
//   - a pending CSR (not yet signed, denied or failed) loses its
//     managedFields, which nothing here reads; on a status write without
//     managedFields kube-apiserver keeps the stored ones. Everything else
//     is kept, because the status write sends the cached copy back and
//     CSR /status takes metadata from the request;
//   - a terminal CSR (a certificate written, Denied or Failed) is never
//     written again and is reduced to a stub: name, uid, resourceVersion,
//     creation time, spec.signerName, its conditions' type and status,
//     and in place of its certificate the shared signedStub, so that done
//     still holds for it.

// signedStub stands in for the certificate of a signed CSR in the cache.
// It is shared by every stub and never parsed: code that needs a written
// certificate reads the CSR from the apiserver.
var signedStub = []byte("signed")

// trim is the informer's transform.
func trim(obj any) (any, error) {
	csr, ok := obj.(*certv1.CertificateSigningRequest)
	if !ok {
		// A DeletedFinalStateUnknown tombstone carries an object that was
		// trimmed when it was stored.
		return obj, nil
	}
	if !done(csr) {
		csr.ManagedFields = nil
		return csr, nil
	}
	stub := &certv1.CertificateSigningRequest{
		TypeMeta: csr.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: csr.Name, UID: csr.UID, ResourceVersion: csr.ResourceVersion,
			CreationTimestamp: csr.CreationTimestamp, DeletionTimestamp: csr.DeletionTimestamp,
		},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: csr.Spec.SignerName},
	}
	if len(csr.Status.Certificate) > 0 {
		stub.Status.Certificate = signedStub
	}
	for _, c := range csr.Status.Conditions {
		if c.Status == corev1.ConditionTrue {
			stub.Status.Conditions = append(stub.Status.Conditions, certv1.CertificateSigningRequestCondition{Type: c.Type, Status: c.Status})
		}
	}
	return stub, nil
}
