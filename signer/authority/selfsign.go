package authority

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
	"time"

	"github.com/keyward/keyward/backends"
)

// RootOptions describe a self-signed root CA certificate.
type RootOptions struct {
	CommonName string
	Lifetime   time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// SelfSignRoot makes a root CA certificate for signer's key, signed by it:
// basic constraints CA:TRUE with path length 0 (it signs leaves only),
// key usage certSign|crlSign|digitalSignature, a subject key id (RFC 7093
// method 1) that leaves copy into their authority key id.
func SelfSignRoot(ctx context.Context, signer backends.Signer, o RootOptions) (*x509.Certificate, error) {
	if o.CommonName == "" || o.Lifetime <= 0 {
		return nil, fmt.Errorf("a root CA needs a common name and a positive lifetime")
	}
	now := time.Now
	if o.Now != nil {
		now = o.Now
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	notBefore := now().Add(-time.Hour).Truncate(time.Second)
	skid, err := SubjectKeyID(signer.Public())
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: o.CommonName},
		NotBefore:             notBefore,
		NotAfter:              notBefore.Add(o.Lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          skid,
		SignatureAlgorithm:    signer.SignatureAlgorithm(),
	}
	cs := &contextSigner{ctx: ctx, s: signer}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, signer.Public(), cs)
	if err != nil {
		if bad := cs.badSignature(); bad != nil {
			return nil, bad
		}
		return nil, fmt.Errorf("self-signing root %q with %s: %w", o.CommonName, signer.URI(), err)
	}
	return x509.ParseCertificate(der)
}

// SubjectKeyID is RFC 7093 method 1: the leftmost 160 bits of the SHA-256
// of the subjectPublicKey BIT STRING's value (no tag, length or unused-bits
// byte). RFC 5280's own method 1 is the same with SHA-1; a key id is only
// matched, never recomputed, by verifiers, so either serves.
func SubjectKeyID(pub crypto.PublicKey) ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return nil, fmt.Errorf("computing subject key id: %w", err)
	}
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(der, &spki); err != nil {
		return nil, fmt.Errorf("computing subject key id: %w", err)
	}
	sum := sha256.Sum256(spki.PublicKey.Bytes)
	return sum[:20], nil
}
