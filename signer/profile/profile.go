// Package profile turns a pod's identity into a certificate template. A
// profile decides the subject, SANs, key usages and extensions; it refuses
// a request it cannot serve with a *Denial, which becomes a Denied condition.
package profile

import (
	"crypto"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/keyward/keyward/signer/config"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Request is what a profile knows of the pod asking for a certificate.
type Request struct {
	SignerName         string
	Namespace          string
	PodName            string
	PodUID             string
	ServiceAccountName string
	ServiceAccountUID  string
	NodeName           string
	NodeUID            string
	// Annotations are the request's unverifiedUserAnnotations, already
	// checked against the signer's recognised keys.
	Annotations map[string]string
	PublicKey   crypto.PublicKey
}

// Denial is a permanent, explained refusal.
type Denial struct {
	Reason  string // CamelCase condition reason
	Message string
}

func (d *Denial) Error() string { return d.Reason + ": " + d.Message }

// Reasons profiles deny with.
const (
	ReasonInvalidAnnotations = "InvalidUnverifiedUserAnnotations"
	ReasonDNSNameNotAllowed  = "DNSNameNotAllowed"
)

// Profile makes templates for one signer name.
type Profile interface {
	Name() string
	// Template returns the leaf template for r, or a *Denial.
	Template(r Request) (*x509.Certificate, error)
}

// New returns the profile a signer's configuration names.
func New(s config.Signer) (Profile, error) {
	switch s.Profile {
	case config.ProfilePodIdentity:
		return podIdentity{critical: s.PodIdentity != nil && s.PodIdentity.Critical}, nil
	case config.ProfileSPIFFE:
		if s.SPIFFE == nil {
			return nil, fmt.Errorf("signer %s: spiffe profile without spiffe.trustDomain", s.Name)
		}
		return spiffe{trustDomain: s.SPIFFE.TrustDomain}, nil
	case config.ProfileServer:
		if s.Server == nil {
			return nil, fmt.Errorf("signer %s: server profile without server settings", s.Name)
		}
		return server{annotation: s.Server.DNSNamesAnnotation, patterns: s.Server.AllowedDNSNames}, nil
	}
	return nil, fmt.Errorf("signer %s: unknown profile %q", s.Name, s.Profile)
}

// keyUsage follows the subject key and the extended key usages (RFC 5280
// 4.2.1.12): digitalSignature always; keyEncipherment only for an RSA key
// that may serve TLS (serverAuth), where a TLS 1.2 peer restricted to RSA
// key exchange needs it (OpenSSL refuses those suites without the bit). A
// client never decrypts anything with its key, and ECDSA and Ed25519 keys
// cannot encipher (RFC 5480, RFC 8410).
func keyUsage(pub crypto.PublicKey, eku []x509.ExtKeyUsage) x509.KeyUsage {
	if _, ok := pub.(*rsa.PublicKey); ok && slices.Contains(eku, x509.ExtKeyUsageServerAuth) {
		return x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment
	}
	return x509.KeyUsageDigitalSignature
}

// MaxDNSNames is the most DNS names the server profile issues in one
// certificate. Each is allowed by a pattern, but a "*." pattern allows any
// number, and a certificate with thousands of SANs is too big for TLS
// handshakes and for the request's status (kube-apiserver bounds the
// object); more than a hundred names for one pod is no real use.
const MaxDNSNames = 100

// maxCommonName is RFC 5280's ub-common-name.
const maxCommonName = 64

// OIDPodIdentity is the PodIdentity extension of KEP-4317, under the CNCF's
// Kubernetes private enterprise number.
var OIDPodIdentity = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 57683, 1}

// PodIdentity is the DER layout of the PodIdentity extension: a SEQUENCE of
// seven UTF8Strings in this order, as k8s.io/component-helpers/kubernetesx509
// encodes it. KEP-4317 says that Go code, not the KEP's tagged sketch,
// defines the extension; TestPodIdentityWireFormat pins the bytes.
type PodIdentity struct {
	Namespace          string `asn1:"utf8"`
	ServiceAccountName string `asn1:"utf8"`
	ServiceAccountUID  string `asn1:"utf8"`
	PodName            string `asn1:"utf8"`
	PodUID             string `asn1:"utf8"`
	NodeName           string `asn1:"utf8"`
	NodeUID            string `asn1:"utf8"`
}

// ParsePodIdentity finds and decodes the PodIdentity extension of cert.
func ParsePodIdentity(cert *x509.Certificate) (*PodIdentity, error) {
	for _, ext := range cert.Extensions {
		if !ext.Id.Equal(OIDPodIdentity) {
			continue
		}
		var pi PodIdentity
		rest, err := asn1.Unmarshal(ext.Value, &pi)
		if err != nil {
			return nil, fmt.Errorf("decoding PodIdentity extension: %w", err)
		}
		if len(rest) > 0 {
			return nil, fmt.Errorf("PodIdentity extension has %d trailing bytes", len(rest))
		}
		return &pi, nil
	}
	return nil, fmt.Errorf("no PodIdentity extension")
}

// podIdentity is a TLS client certificate carrying the PodIdentity
// extension and no SANs. The extension is non-critical unless configured
// (podIdentity.critical): KEP-4317 asks for critical only on certificates
// for kube-apiserver's own pod authentication, and a critical extension
// that a TLS peer does not know makes it reject the certificate.
type podIdentity struct{ critical bool }

func (podIdentity) Name() string { return config.ProfilePodIdentity }

func (p podIdentity) Template(r Request) (*x509.Certificate, error) {
	der, err := asn1.Marshal(PodIdentity{
		Namespace:          r.Namespace,
		ServiceAccountName: r.ServiceAccountName,
		ServiceAccountUID:  r.ServiceAccountUID,
		PodName:            r.PodName,
		PodUID:             r.PodUID,
		NodeName:           r.NodeName,
		NodeUID:            r.NodeUID,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding PodIdentity extension: %w", err)
	}
	eku := []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return &x509.Certificate{
		Subject:         pkix.Name{CommonName: "system:serviceaccount:" + r.Namespace + ":" + r.ServiceAccountName},
		KeyUsage:        keyUsage(r.PublicKey, eku),
		ExtKeyUsage:     eku,
		ExtraExtensions: []pkix.Extension{{Id: OIDPodIdentity, Critical: p.critical, Value: der}},
	}, nil
}

// spiffe is an X.509 SVID: URI SAN spiffe://<trust domain>/ns/<ns>/sa/<sa>,
// empty subject (so the SAN extension is critical, RFC 5280 4.2.1.6, which
// crypto/x509 does for an empty subject), client and server auth.
type spiffe struct{ trustDomain string }

func (spiffe) Name() string { return config.ProfileSPIFFE }

func (s spiffe) Template(r Request) (*x509.Certificate, error) {
	id := &url.URL{Scheme: "spiffe", Host: s.trustDomain, Path: "/ns/" + r.Namespace + "/sa/" + r.ServiceAccountName}
	eku := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	return &x509.Certificate{
		URIs:        []*url.URL{id},
		KeyUsage:    keyUsage(r.PublicKey, eku),
		ExtKeyUsage: eku,
	}, nil
}

// server is a TLS server certificate for DNS names the pod asks for in an
// annotation, each allowed only if it matches a configured pattern.
type server struct {
	annotation string
	patterns   []string
}

func (server) Name() string { return config.ProfileServer }

func (s server) Template(r Request) (*x509.Certificate, error) {
	raw, ok := r.Annotations[s.annotation]
	if !ok || strings.TrimSpace(raw) == "" {
		return nil, &Denial{Reason: ReasonInvalidAnnotations,
			Message: fmt.Sprintf("the server profile needs DNS names in the %s annotation of the podCertificate volume (userAnnotations)", s.annotation)}
	}
	var names []string
	for _, n := range strings.Split(raw, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			continue
		}
		if errs := validation.IsDNS1123Subdomain(strings.TrimPrefix(n, "*.")); len(errs) > 0 {
			return nil, &Denial{Reason: ReasonInvalidAnnotations, Message: fmt.Sprintf("%s: %s is not a DNS name: %s", s.annotation, Quote(n), strings.Join(errs, "; "))}
		}
		if !s.allowed(n, r) {
			return nil, &Denial{Reason: ReasonDNSNameNotAllowed, Message: fmt.Sprintf("DNS name %s is not allowed for pod %s/%s (allowed: %s)",
				Quote(n), r.Namespace, r.PodName, strings.Join(s.expand(r), ", "))}
		}
		if !slices.Contains(names, n) {
			if len(names) == MaxDNSNames {
				return nil, &Denial{Reason: ReasonInvalidAnnotations, Message: fmt.Sprintf("%s lists more than %d DNS names", s.annotation, MaxDNSNames)}
			}
			names = append(names, n)
		}
	}
	if len(names) == 0 {
		return nil, &Denial{Reason: ReasonInvalidAnnotations, Message: s.annotation + " lists no DNS names"}
	}
	// The subject names the first DNS name that fits a common name (RFC
	// 5280 ub-common-name, 64); with none, the subject is empty and the SAN
	// extension critical. Verifiers match the SANs, not the common name.
	var subject pkix.Name
	if i := slices.IndexFunc(names, func(n string) bool { return len(n) <= maxCommonName }); i >= 0 {
		subject.CommonName = names[i]
	}
	eku := []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	return &x509.Certificate{
		Subject:     subject,
		DNSNames:    names,
		KeyUsage:    keyUsage(r.PublicKey, eku),
		ExtKeyUsage: eku,
	}, nil
}

// expand substitutes the request's identity into the patterns.
func (s server) expand(r Request) []string {
	rep := strings.NewReplacer("{namespace}", r.Namespace, "{serviceAccount}", r.ServiceAccountName, "{podName}", r.PodName)
	out := make([]string, len(s.patterns))
	for i, p := range s.patterns {
		out[i] = rep.Replace(p)
	}
	return out
}

// allowed: name equals an expanded pattern, or the pattern starts with "*."
// and name is one more DNS label in front of the rest. Wildcard names are
// never issued: one pod could then answer for every service it matches.
func (s server) allowed(name string, r Request) bool {
	if strings.HasPrefix(name, "*") {
		return false
	}
	for _, p := range s.expand(r) {
		if name == p {
			return true
		}
		if rest, ok := strings.CutPrefix(p, "*."); ok {
			label, parent, found := strings.Cut(name, ".")
			if found && label != "" && parent == rest {
				return true
			}
		}
	}
	return false
}
