package nodehelper

import (
	"context"
	"crypto"
	"errors"
	"fmt"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/keyward/keyward/nodehelper/internal/listwatch"
)

// PodRef is the identity kubelet puts into a PodCertificateRequest.
type PodRef struct {
	Namespace, Name    string
	UID                types.UID
	ServiceAccountName string
	ServiceAccountUID  types.UID
	NodeName           string
	NodeUID            types.UID
}

// PodCertificateOptions are the optional parts of a request.
type PodCertificateOptions struct {
	MaxExpirationSeconds *int32
	Annotations          map[string]string
}

// NewPodCertificateRequest builds the PodCertificateRequest kubelet would
// create for ref and signerName, proving possession of key with a stub
// PKCS#10 request.
func NewPodCertificateRequest(ref PodRef, signerName string, key crypto.Signer, o PodCertificateOptions) (*certv1.PodCertificateRequest, error) {
	stub, err := NewStubPKCS10Request(key)
	if err != nil {
		return nil, err
	}
	return &certv1.PodCertificateRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: ref.Name + "-", Namespace: ref.Namespace},
		Spec: certv1.PodCertificateRequestSpec{
			SignerName:                signerName,
			PodName:                   ref.Name,
			PodUID:                    ref.UID,
			ServiceAccountName:        ref.ServiceAccountName,
			ServiceAccountUID:         ref.ServiceAccountUID,
			NodeName:                  types.NodeName(ref.NodeName),
			NodeUID:                   ref.NodeUID,
			MaxExpirationSeconds:      o.MaxExpirationSeconds,
			StubPKCS10Request:         stub,
			UnverifiedUserAnnotations: o.Annotations,
		},
	}, nil
}

// ErrDeleted: the PodCertificateRequest was deleted (or was already gone)
// before it reached a terminal condition.
var ErrDeleted = errors.New("PodCertificateRequest deleted before it was decided")

// WaitForTerminal watches the request (as its node may: by spec.nodeName)
// until it has a terminal condition, and returns it; it returns at once for
// a request already decided. A request that is deleted first, or is gone
// when the wait begins, is ErrDeleted. A watch that ends or fails (e.g.
// "too large resource version" from a lagging watch cache, an apiserver
// restart) is resumed from a fresh list with exponential backoff, as a
// client-go informer does; only ctx ends the wait otherwise.
func WaitForTerminal(ctx context.Context, client kubernetes.Interface, p *certv1.PodCertificateRequest) (*certv1.PodCertificateRequest, error) {
	pcrs := client.CertificatesV1().PodCertificateRequests(p.Namespace)
	sel := fields.OneTermEqualSelector("spec.nodeName", string(p.Spec.NodeName)).String()
	// The list is a consistent read: absence from it means the request is gone.
	lw := listwatch.Consistent(pcrs.List, pcrs.Watch, func(o *metav1.ListOptions) { o.FieldSelector = sel })
	var got *certv1.PodCertificateRequest
	decided := func(obj any) bool {
		if pcr, ok := obj.(*certv1.PodCertificateRequest); ok && pcr.Name == p.Name && len(pcr.Status.Conditions) > 0 {
			got = pcr
			return true
		}
		return false
	}
	deleted := fmt.Errorf("waiting for PodCertificateRequest %s/%s: %w", p.Namespace, p.Name, ErrDeleted)
	_, err := watchtools.UntilWithSync(ctx, lw, &certv1.PodCertificateRequest{},
		func(store cache.Store) (bool, error) {
			obj, exists, err := store.GetByKey(p.Namespace + "/" + p.Name)
			switch {
			case err != nil:
				return false, err
			case !exists:
				return false, deleted
			}
			return decided(obj), nil
		},
		func(ev watch.Event) (bool, error) {
			switch ev.Type {
			case watch.Deleted:
				if pcr, ok := ev.Object.(*certv1.PodCertificateRequest); ok && pcr.Name == p.Name {
					return false, deleted
				}
			case watch.Added, watch.Modified:
				return decided(ev.Object), nil
			}
			return false, nil
		})
	switch {
	case got != nil:
		return got, nil
	case errors.Is(err, ErrDeleted):
		return nil, err
	case ctx.Err() != nil:
		return nil, fmt.Errorf("waiting for PodCertificateRequest %s/%s: %w", p.Namespace, p.Name, ctx.Err())
	case err != nil:
		return nil, fmt.Errorf("waiting for PodCertificateRequest %s/%s: %w", p.Namespace, p.Name, err)
	}
	return nil, fmt.Errorf("waiting for PodCertificateRequest %s/%s: the watch ended without a decision", p.Namespace, p.Name)
}
