package pcr

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The informer keeps only what the controller needs of each request (its
// transform runs before an object is stored or handed to a handler):
//
//   - a pending request is trimmed to name, namespace, uid, resourceVersion,
//     creation and deletion times, spec and status, and stored as *decoded
//     with its decoded form, so it is parsed once per version of the object
//     however often the controller looks at it;
//   - a terminal request is reduced to a stub: name, namespace, uid,
//     resourceVersion, creation and deletion times, spec.signerName and the
//     terminal condition without its message.
//
// A status write of a trimmed object's DeepCopy is complete: on
// /status kube-apiserver takes spec, labels, annotations, owner references
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

// terminalCondition is the first terminal condition of conds without its
// message, or nil.
func terminalCondition(conds []metav1.Condition) []metav1.Condition {
	for _, c := range conds {
		if isTerminalCondition(c) {
			return []metav1.Condition{{Type: c.Type, Status: c.Status, Reason: c.Reason, LastTransitionTime: c.LastTransitionTime}}
		}
	}
	return nil
}
