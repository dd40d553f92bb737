// Package csrclient requests a certificate with a CertificateSigningRequest
// (certificates.k8s.io/v1) in a way a process can resume after a crash: the
// CSR's name is derived from what it asks for, so asking again for the same
// key finds the request an earlier run made instead of making another one
// (KEP-266, as kubelet's certificate manager does).
package csrclient

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base32"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"hash"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/client-go/util/certificate/csr"
	"k8s.io/klog/v2"

	"github.com/keyward/keyward/nodehelper/internal/listwatch"
)

var (
	// ErrDeleted says the CertificateSigningRequest being waited for was
	// deleted (or replaced by another of the same name) before it was
	// issued or decided. A new request is the way on.
	ErrDeleted = errors.New("CertificateSigningRequest was deleted")
	// ErrConflict says a CertificateSigningRequest of the derived name
	// exists but asks for something else (another key, signer, subject,
	// SANs, usages or expiration). The name digests all of these, so the
	// other request was made by someone else, e.g. another node that read
	// this key's request and re-made it under its name after the original
	// was deleted: retrying with the same key meets it again for as long as
	// it exists. The key's request is spent: discard the pending key and
	// ask with a new one (certstore.DiscardPending).
	ErrConflict = errors.New("a CertificateSigningRequest of that name asks for something else")
)

// DecisionError is a CertificateSigningRequest's refusal: a Denied (by an
// approver) or Failed (by the signer) condition. Both are permanent for
// that request.
type DecisionError struct {
	Name            string
	Type            certv1.RequestConditionType
	Reason, Message string
}

func (e *DecisionError) Error() string {
	return fmt.Sprintf("CertificateSigningRequest %s is %s, reason %q: %s", e.Name, e.Type, e.Reason, e.Message)
}

// Request is what to ask a signer for.
type Request struct {
	SignerName string
	// Template gives the subject and the DNS, IP, URI and email SANs, and
	// nothing else (extra extensions and attributes are refused).
	Template          *x509.CertificateRequest
	Usages            []certv1.KeyUsage
	ExpirationSeconds *int32
	// Key is the subject key; it signs the PKCS#10 request.
	Key crypto.Signer
	// NamePrefix starts the CSR's name, e.g. "keyward-node-daemon-"; the
	// name must stay a DNS subdomain.
	NamePrefix string
}

func (r Request) validate() error {
	switch {
	case r.SignerName == "":
		return errors.New("request has no signer name")
	case r.Template == nil:
		return errors.New("request has no template")
	case r.Key == nil:
		return errors.New("request has no key")
	case len(r.Usages) == 0:
		return errors.New("request has no usages")
	case len(r.Template.ExtraExtensions) > 0 || len(r.Template.Attributes) > 0:
		// Name does not digest them, so two requests differing only
		// there would share a name; signers take usages from spec.usages.
		return errors.New("request template has extra extensions or attributes; only the subject and DNS, IP, URI and email SANs are requested")
	}
	return nil
}

// Name is the CSR name for r: NamePrefix and a SHA-256 digest (base32, lower
// case, no padding) of the public key, signer name, subject, SANs, usages
// (as a set) and expiration. The same request always gets the same name;
// a new key gets a new name.
func Name(r Request) (string, error) {
	if err := r.validate(); err != nil {
		return "", err
	}
	spki, err := x509.MarshalPKIXPublicKey(r.Key.Public())
	if err != nil {
		return "", fmt.Errorf("encoding the request's public key: %w", err)
	}
	subject, err := subjectDER(r.Template)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	field(h, "key", spki)
	field(h, "signer", []byte(r.SignerName))
	field(h, "subject", subject)
	for _, n := range r.Template.DNSNames {
		field(h, "dns", []byte(n))
	}
	for _, ip := range r.Template.IPAddresses {
		field(h, "ip", ipBytes(ip))
	}
	for _, u := range r.Template.URIs {
		field(h, "uri", []byte(u.String()))
	}
	for _, e := range r.Template.EmailAddresses {
		field(h, "email", []byte(e))
	}
	for _, u := range sortedUsages(r.Usages) {
		field(h, "usage", []byte(u))
	}
	if r.ExpirationSeconds != nil {
		field(h, "expiration", binary.BigEndian.AppendUint32(nil, uint32(*r.ExpirationSeconds)))
	}
	digest := base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(h.Sum(nil))
	name := r.NamePrefix + strings.ToLower(digest)
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("CertificateSigningRequest name %q from prefix %q: %s", name, r.NamePrefix, strings.Join(errs, "; "))
	}
	return name, nil
}

// field writes one length-prefixed, tagged field, so that no two different
// requests hash the same bytes.
func field(h hash.Hash, tag string, b []byte) {
	h.Write([]byte(tag))
	h.Write(binary.BigEndian.AppendUint32(nil, uint32(len(b))))
	h.Write(b)
}

// subjectDER is the subject exactly as x509.CreateCertificateRequest
// encodes it, and as x509.ParseCertificateRequest returns it in RawSubject.
func subjectDER(t *x509.CertificateRequest) ([]byte, error) {
	if len(t.RawSubject) > 0 {
		return t.RawSubject, nil
	}
	der, err := asn1.Marshal(t.Subject.ToRDNSequence())
	if err != nil {
		return nil, fmt.Errorf("encoding the request's subject: %w", err)
	}
	return der, nil
}

func ipBytes(ip net.IP) []byte {
	if v4 := ip.To4(); v4 != nil {
		return v4
	}
	return ip
}

func sortedUsages(us []certv1.KeyUsage) []certv1.KeyUsage {
	s := slices.Clone(us)
	slices.Sort(s)
	return slices.Compact(s)
}

// Submit creates the CertificateSigningRequest Name(r), or returns the one
// an earlier run created for the same request, whatever its state (issued,
// denied, even with an expired certificate: Wait and the caller judge
// that). One of that name asking for something else is ErrConflict.
func Submit(ctx context.Context, c kubernetes.Interface, r Request) (*certv1.CertificateSigningRequest, error) {
	name, err := Name(r)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, r.Template, r.Key)
	if err != nil {
		return nil, fmt.Errorf("creating the PKCS#10 request for %s: %w", name, err)
	}
	request := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
	var duration *time.Duration
	if r.ExpirationSeconds != nil {
		d := csr.ExpirationSecondsToDuration(*r.ExpirationSeconds)
		duration = &d
	}
	// client-go's helper creates the CSR or, when it exists, checks that it
	// is for the same subject, signer and key. It says why not only in
	// text and also refuses a CSR whose certificate has expired, so the
	// outcome is judged again from the CSR itself.
	_, _, createErr := csr.RequestCertificateWithContext(ctx, c, request, name, r.SignerName, duration, r.Usages, r.Key)
	got, err := c.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
	case createErr != nil:
		return nil, fmt.Errorf("creating CertificateSigningRequest %s: %w", name, createErr)
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("reading CertificateSigningRequest %s just created: %w", name, ErrDeleted)
	default:
		return nil, fmt.Errorf("reading CertificateSigningRequest %s: %w", name, err)
	}
	if why := sameRequest(got, r); why != nil {
		return nil, fmt.Errorf("CertificateSigningRequest %s: %w: %w", name, ErrConflict, why)
	}
	return got, nil
}

// sameRequest says why got does not ask for r, or nil if it does.
func sameRequest(got *certv1.CertificateSigningRequest, r Request) error {
	if got.Spec.SignerName != r.SignerName {
		return fmt.Errorf("signer name %q, not %q", got.Spec.SignerName, r.SignerName)
	}
	if !slices.Equal(sortedUsages(got.Spec.Usages), sortedUsages(r.Usages)) {
		return fmt.Errorf("usages %q, not %q", got.Spec.Usages, r.Usages)
	}
	if (got.Spec.ExpirationSeconds == nil) != (r.ExpirationSeconds == nil) ||
		got.Spec.ExpirationSeconds != nil && *got.Spec.ExpirationSeconds != *r.ExpirationSeconds {
		return errors.New("another expirationSeconds")
	}
	b, _ := pem.Decode(got.Spec.Request)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return errors.New("spec.request is not a CERTIFICATE REQUEST PEM block")
	}
	req, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return fmt.Errorf("parsing spec.request: %w", err)
	}
	if k, ok := req.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !k.Equal(r.Key.Public()) {
		return errors.New("another public key")
	}
	if err := req.CheckSignature(); err != nil {
		return fmt.Errorf("checking spec.request's signature: %w", err)
	}
	subject, err := subjectDER(r.Template)
	if err != nil {
		return err
	}
	if !slices.Equal(req.RawSubject, subject) {
		return errors.New("another subject")
	}
	t := r.Template
	if !slices.Equal(req.DNSNames, t.DNSNames) || !slices.Equal(req.EmailAddresses, t.EmailAddresses) ||
		!slices.EqualFunc(req.IPAddresses, t.IPAddresses, net.IP.Equal) ||
		!slices.EqualFunc(req.URIs, t.URIs, func(a, b *url.URL) bool { return a.String() == b.String() }) {
		return errors.New("other SANs")
	}
	return nil
}

// Wait waits until csr has a certificate and returns it (status.certificate:
// PEM, leaf first). A Denied or Failed condition is a *DecisionError; a
// deleted or replaced CSR is ErrDeleted; the end of ctx is its error,
// wrapped. A csr that is already issued or decided returns at once. The
// watch is an informer's: broken watches are resumed with backoff.
func Wait(ctx context.Context, c kubernetes.Interface, req *certv1.CertificateSigningRequest) ([]byte, error) {
	if cert, done, err := outcome(req); done {
		return cert, err
	}
	name := req.Name
	// client-go's csr.WaitForCertificate would do, but it never reports a
	// CSR deleted before its informer's first list (it then waits until
	// ctx ends) and says Denied only in text; the same informer-backed
	// UntilWithSync, with a precondition on the first list, does both.
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	csrs := c.CertificatesV1().CertificateSigningRequests()
	// The list is a consistent read, which the CSR Submit just created
	// cannot predate: absence from it means the CSR is gone.
	lw := cache.ToListWatcherWithWatchListSemantics(
		listwatch.Consistent(csrs.List, csrs.Watch, func(o *metav1.ListOptions) { o.FieldSelector = sel }), c)
	deleted := fmt.Errorf("waiting for CertificateSigningRequest %s: %w", name, ErrDeleted)
	var cert []byte
	check := func(obj any) (bool, error) {
		got, ok := obj.(*certv1.CertificateSigningRequest)
		if !ok {
			return false, fmt.Errorf("waiting for CertificateSigningRequest %s: got a %T", name, obj)
		}
		if req.UID != "" && got.UID != req.UID {
			return false, deleted // and another made under its name
		}
		var done bool
		var err error
		cert, done, err = outcome(got)
		return done, err
	}
	klog.FromContext(ctx).V(2).Info("Waiting for the CertificateSigningRequest", "csr", name)
	_, err := watchtools.UntilWithSync(ctx, lw, &certv1.CertificateSigningRequest{},
		func(store cache.Store) (bool, error) {
			obj, exists, err := store.GetByKey(name)
			if err != nil {
				return false, fmt.Errorf("waiting for CertificateSigningRequest %s: %w", name, err)
			}
			if !exists {
				return false, deleted
			}
			return check(obj)
		},
		func(ev watch.Event) (bool, error) {
			switch ev.Type {
			case watch.Deleted:
				return false, deleted
			case watch.Added, watch.Modified:
				return check(ev.Object)
			}
			return false, nil
		})
	var decision *DecisionError
	switch {
	case err == nil:
		return cert, nil
	case errors.As(err, &decision), errors.Is(err, ErrDeleted):
		return nil, err
	case ctx.Err() != nil:
		return nil, fmt.Errorf("waiting for CertificateSigningRequest %s: %w", name, ctx.Err())
	default:
		return nil, fmt.Errorf("waiting for CertificateSigningRequest %s: %w", name, err)
	}
}

// outcome reads c: a refusal as a *DecisionError, or its certificate; done
// is false while it is neither.
func outcome(c *certv1.CertificateSigningRequest) (cert []byte, done bool, err error) {
	for _, cond := range c.Status.Conditions {
		if (cond.Type == certv1.CertificateDenied || cond.Type == certv1.CertificateFailed) && cond.Status == corev1.ConditionTrue {
			return nil, true, &DecisionError{Name: c.Name, Type: cond.Type, Reason: cond.Reason, Message: cond.Message}
		}
	}
	if len(c.Status.Certificate) > 0 {
		return c.Status.Certificate, true, nil
	}
	return nil, false, nil
}
