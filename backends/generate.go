package backends

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"fmt"
)

// GenerateKey makes an in-memory key for alg. The file backend stores such
// keys; the KMS fakes sign with them.
func GenerateKey(alg Algorithm) (crypto.Signer, error) {
	switch alg.Kind() {
	case KindECDSA:
		return ecdsa.GenerateKey(alg.Curve(), rand.Reader)
	case KindRSA:
		return rsa.GenerateKey(rand.Reader, alg.RSABits())
	case KindEd25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	}
	return nil, fmt.Errorf("%w: %q", ErrUnsupportedAlgorithm, alg)
}
