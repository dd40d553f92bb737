package pcr

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"time"

	"github.com/keyward/keyward/signer/profile"
	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	informerscertv1 "k8s.io/client-go/informers/certificates/v1"
	informerscertv1beta1 "k8s.io/client-go/informers/certificates/v1beta1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// API versions of PodCertificateRequest the controller speaks.
const (
	V1      = "v1"
	V1beta1 = "v1beta1"
)

// request is a PodCertificateRequest of either API version, reduced to
// what the controller needs.
type request struct {
	obj       runtime.Object // the cached (trimmed) object, never mutated
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
	// publicKey is the subject key, from stubPKCS10Request (kube-apiserver
	// has verified its signature) or (v1beta1) pkixPublicKey, whose
	// proofOfPossession keyward verifies as the apiserver does. keyErr says
	// why there is none: a *profile.Denial when the request is to be
	// denied with its Reason (InvalidProofOfPossession, UnsupportedKeyType).
	// Neither is set for a terminal request.
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
	// stored reads the request from kube-apiserver (not the cache, which
	// keeps no certificate of a terminal request): its decoded form and
	// status.certificateChain.
	stored(ctx context.Context, namespace, name string) (*request, string, error)
	// currentRV is the resourceVersion of a quorum read of signerName's
	// requests (workers.CatchUp).
	currentRV(ctx context.Context, signerName string) (string, error)
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

// isTerminal reports whether conds hold a terminal condition (Issued,
// Denied or Failed with status True).
func isTerminal(conds []metav1.Condition) bool {
	for _, c := range conds {
		if isTerminalCondition(c) {
			return true
		}
	}
	return false
}

func isTerminalCondition(c metav1.Condition) bool {
	switch c.Type {
	case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied, certv1.PodCertificateRequestConditionTypeFailed:
		return c.Status == metav1.ConditionTrue
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
	switch csr.PublicKey.(type) {
	case *rsa.PublicKey, *ecdsa.PublicKey, ed25519.PublicKey:
		return csr.PublicKey, nil
	}
	// crypto/x509 parses DSA keys and leaves the key nil, without an
	// error, for an algorithm it does not know (X25519 among them): no
	// certificate can be issued for either, so refuse here as for a
	// pkixPublicKey (the apiserver admits neither, but the check must not
	// rest on that).
	alg := csr.PublicKeyAlgorithm.String()
	if csr.PublicKey == nil {
		alg = "of algorithm " + spkiAlgorithm(csr.RawSubjectPublicKeyInfo)
	}
	return nil, &profile.Denial{Reason: ReasonUnsupportedKeyType, Message: fmt.Sprintf(
		"spec.stubPKCS10Request holds a %s key, which keyward does not issue for; use Ed25519, ECDSA or RSA", alg)}
}

// spkiAlgorithm is the algorithm OID of a DER SubjectPublicKeyInfo, for
// an error message.
func spkiAlgorithm(spki []byte) string {
	var info struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(spki, &info); err != nil {
		return "unknown"
	}
	return info.Algorithm.Algorithm.String()
}

// ReasonInvalidProofOfPossession denies a v1beta1 request whose
// proofOfPossession does not verify against its pkixPublicKey.
const ReasonInvalidProofOfPossession = "InvalidProofOfPossession"

// parsePKIX parses a v1beta1 pkixPublicKey and verifies its proof of
// possession over podUID. A proof that does not verify, or a key type that
// has no proof scheme, is a *profile.Denial.
func parsePKIX(der []byte, podUID string, proof []byte) (crypto.PublicKey, error) {
	pub, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		return nil, fmt.Errorf("parsing pkixPublicKey: %w", err)
	}
	if err := verifyProofOfPossession(pub, podUID, proof); err != nil {
		return nil, err
	}
	return pub, nil
}

// verifyProofOfPossession checks proof exactly as kube-apiserver's v1beta1
// validation does (pkg/apis/certificates/validation,
// validateDeprecatedPKIXPublicKey, v1.37.1): an Ed25519 key signs the bytes
// of the pod UID; an ECDSA key signs their SHA-256 digest (ASN.1 DER
// signature); an RSA key signs their SHA-256 digest with RSASSA-PSS (salt
// length detected on verification).
func verifyProofOfPossession(pub crypto.PublicKey, podUID string, proof []byte) error {
	var ok bool
	var scheme string
	digest := sha256.Sum256([]byte(podUID))
	switch k := pub.(type) {
	case ed25519.PublicKey:
		ok, scheme = ed25519.Verify(k, []byte(podUID), proof), "an Ed25519 signature of spec.podUID"
	case *ecdsa.PublicKey:
		ok, scheme = ecdsa.VerifyASN1(k, digest[:], proof), "an ECDSA signature (ASN.1) of the SHA-256 digest of spec.podUID"
	case *rsa.PublicKey:
		ok, scheme = rsa.VerifyPSS(k, crypto.SHA256, digest[:], proof, nil) == nil, "an RSASSA-PSS (SHA-256) signature of the SHA-256 digest of spec.podUID"
	default:
		// kube-apiserver's reason; controller.go's check() uses it too.
		return &profile.Denial{Reason: ReasonUnsupportedKeyType, Message: fmt.Sprintf(
			"spec.pkixPublicKey holds a %s key, which has no proof-of-possession scheme; use Ed25519, ECDSA or RSA", KeyType(pub))}
	}
	if !ok {
		return &profile.Denial{Reason: ReasonInvalidProofOfPossession, Message: fmt.Sprintf(
			"spec.proofOfPossession (%d bytes) is not %s %q by the %s key in spec.pkixPublicKey", len(proof), scheme, podUID, KeyType(pub))}
	}
	return nil
}

type v1API struct{ client kubernetes.Interface }

func (v1API) version() string { return V1 }

// newInformer watches signerName's requests and keeps them trimmed and
// decoded (see cache.go).
func (a v1API) newInformer(signerName string) cache.SharedIndexInformer {
	inf := informerscertv1.NewFilteredPodCertificateRequestInformer(a.client, metav1.NamespaceAll, 0,
		cache.Indexers{}, signerSelector(signerName))
	utilruntime.Must(inf.SetTransform(a.transform)) // fails only once started
	return inf
}

// transform trims a request for the informer's store: a terminal request to
// a stub, a pending one to what the controller reads, decoded once.
func (v1API) transform(obj any) (any, error) {
	p, ok := obj.(*certv1.PodCertificateRequest)
	if !ok {
		return obj, nil // already transformed, or a tombstone
	}
	if isTerminal(p.Status.Conditions) {
		return newStub(p.ObjectMeta, p.Spec.SignerName), nil
	}
	p.ObjectMeta = trimMeta(p.ObjectMeta)
	d := newDecoded(decodeV1(p))
	// Parsed now; a status write does not need it (cache.go).
	p.Spec.StubPKCS10Request = nil
	return d, nil
}

func (v1API) toRequest(obj any) (*request, error) {
	switch p := obj.(type) {
	case *decoded:
		return p.request(), nil
	case *stub:
		return p.request(&certv1.PodCertificateRequest{ObjectMeta: p.meta(),
			Spec: certv1.PodCertificateRequestSpec{SignerName: p.signerName}}), nil
	case *certv1.PodCertificateRequest:
		return decodeV1(p), nil
	}
	return nil, fmt.Errorf("expected *v1.PodCertificateRequest, got %T", obj)
}

func decodeV1(p *certv1.PodCertificateRequest) *request {
	r := &request{
		obj: p, namespace: p.Namespace, name: p.Name, uid: p.UID, created: p.CreationTimestamp.Time,
		signerName: p.Spec.SignerName, podName: p.Spec.PodName, podUID: string(p.Spec.PodUID),
		serviceAccountName: p.Spec.ServiceAccountName, serviceAccountUID: string(p.Spec.ServiceAccountUID),
		nodeName: string(p.Spec.NodeName), nodeUID: string(p.Spec.NodeUID),
		maxExpirationSeconds: p.Spec.MaxExpirationSeconds, annotations: p.Spec.UnverifiedUserAnnotations,
		terminal: isTerminal(p.Status.Conditions),
	}
	if !r.terminal {
		r.publicKey, r.keyErr = parseStub(p.Spec.StubPKCS10Request)
	}
	return r
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

func (a v1API) stored(ctx context.Context, namespace, name string) (*request, string, error) {
	p, err := a.client.CertificatesV1().PodCertificateRequests(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	return decodeV1(p), p.Status.CertificateChain, nil
}

func (a v1API) currentRV(ctx context.Context, signerName string) (string, error) {
	o := metav1.ListOptions{Limit: 1}
	signerSelector(signerName)(&o)
	l, err := a.client.CertificatesV1().PodCertificateRequests(metav1.NamespaceAll).List(ctx, o)
	if err != nil {
		return "", err
	}
	return l.ResourceVersion, nil
}

// v1beta1API reads requests through certificates.k8s.io/v1beta1, which shows
// both key forms: stubPKCS10Request and the older pkixPublicKey +
// proofOfPossession that kubelets before 1.37 create.
type v1beta1API struct{ client kubernetes.Interface }

func (v1beta1API) version() string { return V1beta1 }

// newInformer watches signerName's requests and keeps them trimmed and
// decoded (see cache.go).
func (a v1beta1API) newInformer(signerName string) cache.SharedIndexInformer {
	inf := informerscertv1beta1.NewFilteredPodCertificateRequestInformer(a.client, metav1.NamespaceAll, 0,
		cache.Indexers{}, signerSelector(signerName))
	// Both fail only once the informer has started.
	utilruntime.Must(inf.SetTransform(a.transform))
	utilruntime.Must(inf.SetWatchErrorHandlerWithContext(v1beta1WatchError))
	return inf
}

// v1beta1WatchError says what to do when the apiserver stops serving
// v1beta1 under a running signer (the version is chosen at start), and
// leaves every other error to client-go's handler.
func v1beta1WatchError(ctx context.Context, r *cache.Reflector, err error) {
	if apierrors.IsNotFound(err) {
		klog.FromContext(ctx).Error(err, "certificates.k8s.io/v1beta1 no longer serves PodCertificateRequests; restart keyward to read them through v1")
		return
	}
	cache.DefaultWatchErrorHandler(ctx, r, err)
}

// transform is v1API.transform for v1beta1.
func (v1beta1API) transform(obj any) (any, error) {
	p, ok := obj.(*certv1beta1.PodCertificateRequest)
	if !ok {
		return obj, nil
	}
	if isTerminal(p.Status.Conditions) {
		return newStub(p.ObjectMeta, p.Spec.SignerName), nil
	}
	p.ObjectMeta = trimMeta(p.ObjectMeta)
	d := newDecoded(decodeV1beta1(p))
	// Parsed (and the proof checked) now; a status write does not need
	// them (cache.go).
	p.Spec.StubPKCS10Request, p.Spec.PKIXPublicKey, p.Spec.ProofOfPossession = nil, nil, nil
	return d, nil
}

func (v1beta1API) toRequest(obj any) (*request, error) {
	switch p := obj.(type) {
	case *decoded:
		return p.request(), nil
	case *stub:
		return p.request(&certv1beta1.PodCertificateRequest{ObjectMeta: p.meta(),
			Spec: certv1beta1.PodCertificateRequestSpec{SignerName: p.signerName}}), nil
	case *certv1beta1.PodCertificateRequest:
		return decodeV1beta1(p), nil
	}
	return nil, fmt.Errorf("expected *v1beta1.PodCertificateRequest, got %T", obj)
}

func decodeV1beta1(p *certv1beta1.PodCertificateRequest) *request {
	r := &request{
		obj: p, namespace: p.Namespace, name: p.Name, uid: p.UID, created: p.CreationTimestamp.Time,
		signerName: p.Spec.SignerName, podName: p.Spec.PodName, podUID: string(p.Spec.PodUID),
		serviceAccountName: p.Spec.ServiceAccountName, serviceAccountUID: string(p.Spec.ServiceAccountUID),
		nodeName: string(p.Spec.NodeName), nodeUID: string(p.Spec.NodeUID),
		maxExpirationSeconds: p.Spec.MaxExpirationSeconds, annotations: p.Spec.UnverifiedUserAnnotations,
		terminal: isTerminal(p.Status.Conditions),
	}
	switch {
	case r.terminal:
	case len(p.Spec.StubPKCS10Request) > 0:
		r.publicKey, r.keyErr = parseStub(p.Spec.StubPKCS10Request)
	case len(p.Spec.PKIXPublicKey) > 0:
		r.publicKey, r.keyErr = parsePKIX(p.Spec.PKIXPublicKey, string(p.Spec.PodUID), p.Spec.ProofOfPossession)
	default:
		r.keyErr = fmt.Errorf("neither stubPKCS10Request nor pkixPublicKey is set")
	}
	return r
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

func (a v1beta1API) stored(ctx context.Context, namespace, name string) (*request, string, error) {
	p, err := a.client.CertificatesV1beta1().PodCertificateRequests(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", err
	}
	return decodeV1beta1(p), p.Status.CertificateChain, nil
}

func (a v1beta1API) currentRV(ctx context.Context, signerName string) (string, error) {
	o := metav1.ListOptions{Limit: 1}
	signerSelector(signerName)(&o)
	l, err := a.client.CertificatesV1beta1().PodCertificateRequests(metav1.NamespaceAll).List(ctx, o)
	if err != nil {
		return "", err
	}
	return l.ResourceVersion, nil
}
