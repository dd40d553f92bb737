package ca

import (
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"fmt"
)

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
