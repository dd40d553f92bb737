package authority

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
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
// key usage certSign|crlSign|digitalSignature, a subject key id.
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
	skid, err := subjectKeyID(signer)
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, signer.Public(), contextSigner{ctx: ctx, s: signer})
	if err != nil {
		return nil, fmt.Errorf("self-signing root %q with %s: %w", o.CommonName, signer.URI(), err)
	}
	return x509.ParseCertificate(der)
}

// subjectKeyID is the first 20 bytes of the SPKI fingerprint (RFC 7093
// method 1 style), stable for a key.
func subjectKeyID(s backends.Signer) ([]byte, error) {
	fp, err := hex.DecodeString(s.Fingerprint())
	if err != nil || len(fp) < 20 {
		return nil, fmt.Errorf("signer %s has no SHA-256 fingerprint", s.URI())
	}
	return fp[:20], nil
}
