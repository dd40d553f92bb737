package pcr

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
)

// The informer keeps only what the controller needs of each request (its
// transform runs before an object is stored or handed to a handler):
//
//   - a pending request is trimmed to name, namespace, uid, resourceVersion,
//     creation and deletion times, spec and status, and stored as *decoded
//     with its decoded form, so it is parsed once per version of the object
//     however often the controller looks at it; the spec's key material
//     (stubPKCS10Request, and in v1beta1 pkixPublicKey and
//     proofOfPossession) is dropped once parsed, about 0.3 KB a request
//     while it waits (docs/benchmarks.md, the burst's heap at its peak);
//   - a terminal request is reduced to a *stub: name, namespace, uid,
//     resourceVersion, creation and deletion times and spec.signerName, in
//     a struct of its own (a typed object with only these fields set
//     still costs its 528-byte struct and a condition).
//
// A status write of a trimmed object's DeepCopy is complete: on
// /status kube-apiserver takes spec (the key material included), labels,
// annotations, owner references
// and finalizers from the stored object, and keeps the stored managedFields
// when the request carries none (TestTransformedRequestStatusWrite in
// softhsm-tests proves it against the real apiserver).

// decoded is a trimmed pending request as the informer stores it, together
// with its decoded form. Both are never mutated after the transform.
type decoded struct {
	metav1.Object // r.obj's metadata, for the informer's keys
	r             *request
}

func newDecoded(r *request) *decoded {
	return &decoded{Object: r.obj.(metav1.Object), r: r}
}

// GetObjectKind is the trimmed object's.
func (d *decoded) GetObjectKind() schema.ObjectKind { return d.r.obj.GetObjectKind() }

// DeepCopyObject copies the trimmed object; the rest of the decoded form is
// immutable and shared.
func (d *decoded) DeepCopyObject() runtime.Object {
	r := *d.r
	r.obj = d.r.obj.DeepCopyObject()
	return newDecoded(&r)
}

// request returns a copy of the decoded form, which the caller may change
// (e.g. its seen field).
func (d *decoded) request() *request {
	r := *d.r
	return &r
}

// trimMeta is the metadata the controller needs: the object's identity, its
// resourceVersion (status writes are optimistic), its creation time and
// whether it is being deleted.
func trimMeta(m metav1.ObjectMeta) metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Name: m.Name, Namespace: m.Namespace, UID: m.UID, ResourceVersion: m.ResourceVersion,
		CreationTimestamp: m.CreationTimestamp, DeletionTimestamp: m.DeletionTimestamp,
	}
}

// stub is a terminal request as the informer stores it. It is never
// written again; the controller reads only its identity, to drop or settle
// its record. Never mutated after the transform.
type stub struct {
	namespace, name, resourceVersion, signerName string
	uid                                          types.UID
	created                                      metav1.Time
	deleted                                      *metav1.Time
}

func newStub(m metav1.ObjectMeta, signerName string) *stub {
	return &stub{
		namespace: m.Namespace, name: m.Name, resourceVersion: m.ResourceVersion, signerName: signerName,
		uid: m.UID, created: m.CreationTimestamp, deleted: m.DeletionTimestamp,
	}
}

// meta is the stub's metadata, as trimMeta keeps it.
func (s *stub) meta() metav1.ObjectMeta {
	return metav1.ObjectMeta{
		Namespace: s.namespace, Name: s.name, UID: s.uid, ResourceVersion: s.resourceVersion,
		CreationTimestamp: s.created, DeletionTimestamp: s.deleted,
	}
}

// GetObjectMeta makes the stub's metadata, for the informer's keys
// (meta.Accessor).
func (s *stub) GetObjectMeta() metav1.Object {
	m := s.meta()
	return &m
}

// GetObjectKind is empty, as for a decoded object.
func (s *stub) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }

// DeepCopyObject copies the stub.
func (s *stub) DeepCopyObject() runtime.Object {
	c := *s
	return &c
}

// request is the stub as a terminal request; obj is the typed object with
// the stub's metadata and signer name, made by the caller for its version,
// so that anything that names the request (an Event) has an object to name.
func (s *stub) request(obj runtime.Object) *request {
	return &request{
		obj: obj, namespace: s.namespace, name: s.name, uid: s.uid, created: s.created.Time,
		signerName: s.signerName, terminal: true,
	}
}
