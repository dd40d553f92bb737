package nodehelper

import (
	"context"
	"crypto"
	"fmt"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
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

// WaitForTerminal watches the request (as its node may: by spec.nodeName)
// until it has a terminal condition, and returns it. A watch that ends or
// errors (e.g. "too large resource version" from a lagging watch cache) is
// resumed from a fresh read.
func WaitForTerminal(ctx context.Context, client kubernetes.Interface, p *certv1.PodCertificateRequest) (*certv1.PodCertificateRequest, error) {
	pcrs := client.CertificatesV1().PodCertificateRequests(p.Namespace)
	sel := fields.OneTermEqualSelector("spec.nodeName", string(p.Spec.NodeName)).String()
	for {
		list, err := pcrs.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			return nil, fmt.Errorf("listing PodCertificateRequests of node %s: %w", p.Spec.NodeName, err)
		}
		for i := range list.Items {
			if got := &list.Items[i]; got.Name == p.Name && len(got.Status.Conditions) > 0 {
				return got, nil
			}
		}
		w, err := pcrs.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return nil, fmt.Errorf("watching PodCertificateRequest %s/%s: %w", p.Namespace, p.Name, err)
		}
		got, err := awaitTerminal(ctx, w, p.Name)
		w.Stop()
		if got != nil || err != nil {
			return got, err
		}
	}
}

// awaitTerminal returns the request once terminal, or (nil, nil) when the
// watch ends or errors and should be resumed.
func awaitTerminal(ctx context.Context, w watch.Interface, name string) (*certv1.PodCertificateRequest, error) {
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for PodCertificateRequest %s: %w", name, ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok || ev.Type == watch.Error {
				return nil, nil
			}
			got, isPCR := ev.Object.(*certv1.PodCertificateRequest)
			if isPCR && got.Name == name && len(got.Status.Conditions) > 0 {
				return got, nil
			}
		}
	}
}
