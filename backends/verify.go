package backends

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rsa"
	"errors"
	"fmt"
)

// ErrBadSignature is wrapped by VerifySignature failures.
var ErrBadSignature = errors.New("signature does not verify")

// VerifySignature checks sig over digest (for Ed25519: the message) with
// pub under alg. Remote backends call it before returning a signature, so a
// corrupted or misdirected response never reaches a certificate.
func VerifySignature(pub crypto.PublicKey, alg Algorithm, digest, sig []byte) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if !ecdsa.VerifyASN1(k, digest, sig) {
			return fmt.Errorf("%w (ECDSA)", ErrBadSignature)
		}
	case *rsa.PublicKey:
		var err error
		if alg.PSS() {
			err = rsa.VerifyPSS(k, alg.Hash(), digest, sig, &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: alg.Hash()})
		} else {
			err = rsa.VerifyPKCS1v15(k, alg.Hash(), digest, sig)
		}
		if err != nil {
			return fmt.Errorf("%w (RSA): %v", ErrBadSignature, err)
		}
	case ed25519.PublicKey:
		if !ed25519.Verify(k, digest, sig) {
			return fmt.Errorf("%w (Ed25519)", ErrBadSignature)
		}
	default:
		return fmt.Errorf("%w: cannot verify with %T", ErrUnsupportedAlgorithm, pub)
	}
	return nil
}
