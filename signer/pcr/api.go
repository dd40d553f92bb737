package pcr

import (
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	informerscertv1 "k8s.io/client-go/informers/certificates/v1"
	informerscertv1beta1 "k8s.io/client-go/informers/certificates/v1beta1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// API versions of PodCertificateRequest the controller speaks.
const (
	V1      = "v1"
	V1beta1 = "v1beta1"
)

// request is a PodCertificateRequest of either API version, reduced to
// what the controller needs.
type request struct {
	obj       runtime.Object // the cached object, never mutated
	namespace string
	name      string
	uid       types.UID
	created   time.Time

	signerName           string
	podName              string
	podUID               string
	serviceAccountName   string
	serviceAccountUID    string
	nodeName             string
	nodeUID              string
	maxExpirationSeconds *int32
	annotations          map[string]string
	// publicKey is the subject key, from stubPKCS10Request or (v1beta1)
	// pkixPublicKey. kube-apiserver has verified possession either way.
	publicKey crypto.PublicKey
	keyErr    error

	terminal bool
	// seen is when keyward first saw the request (set by sync).
	seen time.Time
}

// status is what the controller writes, independent of the version.
type status struct {
	conditions     []metav1.Condition
	chain          string
	notBefore      *metav1.Time
	beginRefreshAt *metav1.Time
	notAfter       *metav1.Time
}

// versionAPI hides the difference between certificates.k8s.io/v1 and
// v1beta1 PodCertificateRequests.
type versionAPI interface {
	version() string
	newInformer(signerName string) cache.SharedIndexInformer
	toRequest(obj any) (*request, error)
	writeStatus(ctx context.Context, r *request, st status) error
}

func newVersionAPI(client kubernetes.Interface, version string) (versionAPI, error) {
	switch version {
	case V1:
		return v1API{client}, nil
	case V1beta1:
		return v1beta1API{client}, nil
	}
	return nil, fmt.Errorf("unsupported PodCertificateRequest version %q", version)
}

func signerSelector(signerName string) func(*metav1.ListOptions) {
	return func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", signerName).String()
	}
}

func isTerminal(conds []metav1.Condition) bool {
	for _, c := range conds {
		switch c.Type {
		case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied, certv1.PodCertificateRequestConditionTypeFailed:
			if c.Status == metav1.ConditionTrue {
				return true
			}
		}
	}
	return false
}

func parseStub(stub []byte) (crypto.PublicKey, error) {
	if len(stub) == 0 {
		return nil, fmt.Errorf("no stubPKCS10Request")
	}
	csr, err := x509.ParseCertificateRequest(stub)
	if err != nil {
		return nil, fmt.Errorf("parsing stubPKCS10Request: %w", err)
	}
	return csr.PublicKey, nil
}

type v1API struct{ client kubernetes.Interface }

func (v1API) version() string { return V1 }

func (a v1API) newInformer(signerName string) cache.SharedIndexInformer {
	return informerscertv1.NewFilteredPodCertificateRequestInformer(a.client, metav1.NamespaceAll, 0,
		cache.Indexers{}, signerSelector(signerName))
}

func (v1API) toRequest(obj any) (*request, error) {
	p, ok := obj.(*certv1.PodCertificateRequest)
	if !ok {
		return nil, fmt.Errorf("expected *v1.PodCertificateRequest, got %T", obj)
	}
	r := &request{
		obj: p, namespace: p.Namespace, name: p.Name, uid: p.UID, created: p.CreationTimestamp.Time,
		signerName: p.Spec.SignerName, podName: p.Spec.PodName, podUID: string(p.Spec.PodUID),
		serviceAccountName: p.Spec.ServiceAccountName, serviceAccountUID: string(p.Spec.ServiceAccountUID),
		nodeName: string(p.Spec.NodeName), nodeUID: string(p.Spec.NodeUID),
		maxExpirationSeconds: p.Spec.MaxExpirationSeconds, annotations: p.Spec.UnverifiedUserAnnotations,
		terminal: isTerminal(p.Status.Conditions),
	}
	r.publicKey, r.keyErr = parseStub(p.Spec.StubPKCS10Request)
	return r, nil
}

func (a v1API) writeStatus(ctx context.Context, r *request, st status) error {
	p := r.obj.(*certv1.PodCertificateRequest).DeepCopy()
	p.Status = certv1.PodCertificateRequestStatus{
		Conditions: st.conditions, CertificateChain: st.chain,
		NotBefore: st.notBefore, BeginRefreshAt: st.beginRefreshAt, NotAfter: st.notAfter,
	}
	_, err := a.client.CertificatesV1().PodCertificateRequests(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

type v1beta1API struct{ client kubernetes.Interface }

func (v1beta1API) version() string { return V1beta1 }

func (a v1beta1API) newInformer(signerName string) cache.SharedIndexInformer {
	return informerscertv1beta1.NewFilteredPodCertificateRequestInformer(a.client, metav1.NamespaceAll, 0,
		cache.Indexers{}, signerSelector(signerName))
}

func (v1beta1API) toRequest(obj any) (*request, error) {
	p, ok := obj.(*certv1beta1.PodCertificateRequest)
	if !ok {
		return nil, fmt.Errorf("expected *v1beta1.PodCertificateRequest, got %T", obj)
	}
	r := &request{
		obj: p, namespace: p.Namespace, name: p.Name, uid: p.UID, created: p.CreationTimestamp.Time,
		signerName: p.Spec.SignerName, podName: p.Spec.PodName, podUID: string(p.Spec.PodUID),
		serviceAccountName: p.Spec.ServiceAccountName, serviceAccountUID: string(p.Spec.ServiceAccountUID),
		nodeName: string(p.Spec.NodeName), nodeUID: string(p.Spec.NodeUID),
		maxExpirationSeconds: p.Spec.MaxExpirationSeconds, annotations: p.Spec.UnverifiedUserAnnotations,
		terminal: isTerminal(p.Status.Conditions),
	}
	switch {
	case len(p.Spec.StubPKCS10Request) > 0:
		r.publicKey, r.keyErr = parseStub(p.Spec.StubPKCS10Request)
	case len(p.Spec.PKIXPublicKey) > 0:
		r.publicKey, r.keyErr = x509.ParsePKIXPublicKey(p.Spec.PKIXPublicKey)
	default:
		r.keyErr = fmt.Errorf("neither stubPKCS10Request nor pkixPublicKey is set")
	}
	return r, nil
}

func (a v1beta1API) writeStatus(ctx context.Context, r *request, st status) error {
	p := r.obj.(*certv1beta1.PodCertificateRequest).DeepCopy()
	p.Status = certv1beta1.PodCertificateRequestStatus{
		Conditions: st.conditions, CertificateChain: st.chain,
		NotBefore: st.notBefore, BeginRefreshAt: st.beginRefreshAt, NotAfter: st.notAfter,
	}
	_, err := a.client.CertificatesV1beta1().PodCertificateRequests(p.Namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}
