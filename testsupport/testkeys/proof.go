package testkeys

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"fmt"
)

// ProofOfPossession signs podUID as kubelets before 1.37 do for a v1beta1
// PodCertificateRequest's pkixPublicKey (and kube-apiserver verifies):
// Ed25519 over the UID's bytes; ECDSA (ASN.1) and RSA-PSS over their
// SHA-256 digest.
func ProofOfPossession(key crypto.Signer, podUID string) ([]byte, error) {
	digest := sha256.Sum256([]byte(podUID))
	switch k := key.(type) {
	case ed25519.PrivateKey:
		return ed25519.Sign(k, []byte(podUID)), nil
	case *ecdsa.PrivateKey:
		return ecdsa.SignASN1(rand.Reader, k, digest[:])
	case *rsa.PrivateKey:
		return rsa.SignPSS(rand.Reader, k, crypto.SHA256, digest[:], nil)
	}
	return nil, fmt.Errorf("no proof-of-possession scheme for %T", key)
}
