package gcpkms

import (
	"fmt"
	"slices"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends"
)

// kmsAlgorithm is a Cloud KMS key version algorithm.
type kmsAlgorithm = kmspb.CryptoKeyVersion_CryptoKeyVersionAlgorithm

// signingAlgorithms maps the Cloud KMS signing algorithms keyward can use to
// keyward's names. Cloud KMS PSS uses a salt as long as the digest, as
// backends.Algorithm does. Everything else (secp256k1, raw PKCS#1, ML-DSA,
// decryption, MAC, symmetric keys) is refused.
func signingAlgorithms() map[kmsAlgorithm]backends.Algorithm {
	return map[kmsAlgorithm]backends.Algorithm{
		kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256:        backends.ECDSAP256SHA256,
		kmspb.CryptoKeyVersion_EC_SIGN_P384_SHA384:        backends.ECDSAP384SHA384,
		kmspb.CryptoKeyVersion_EC_SIGN_ED25519:            backends.Ed25519,
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_2048_SHA256: backends.RSA2048PKCS1SHA256,
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_3072_SHA256: backends.RSA3072PKCS1SHA256,
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_4096_SHA256: backends.RSA4096PKCS1SHA256,
		kmspb.CryptoKeyVersion_RSA_SIGN_PKCS1_4096_SHA512: backends.RSA4096PKCS1SHA512,
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_2048_SHA256:   backends.RSA2048PSSSHA256,
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_3072_SHA256:   backends.RSA3072PSSSHA256,
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_4096_SHA256:   backends.RSA4096PSSSHA256,
		kmspb.CryptoKeyVersion_RSA_SIGN_PSS_4096_SHA512:   backends.RSA4096PSSSHA512,
	}
}

// fromKMS returns keyward's name for a Cloud KMS algorithm, or an error
// wrapping backends.ErrUnsupportedAlgorithm.
func fromKMS(a kmsAlgorithm) (backends.Algorithm, error) {
	if alg, ok := signingAlgorithms()[a]; ok {
		return alg, nil
	}
	return "", fmt.Errorf("%w: Cloud KMS algorithm %s (keyward signs with %v)", backends.ErrUnsupportedAlgorithm, a, supportedAlgorithms())
}

// toKMS returns the Cloud KMS algorithm for alg, or an error wrapping
// backends.ErrUnsupportedAlgorithm.
func toKMS(alg backends.Algorithm) (kmsAlgorithm, error) {
	for k, a := range signingAlgorithms() {
		if a == alg {
			return k, nil
		}
	}
	return 0, fmt.Errorf("%w: Cloud KMS has no %q keys (it offers %v)", backends.ErrUnsupportedAlgorithm, alg, supportedAlgorithms())
}

// supportedAlgorithms lists the keyward algorithms Cloud KMS offers, sorted.
func supportedAlgorithms() []backends.Algorithm {
	var out []backends.Algorithm
	for _, a := range signingAlgorithms() {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}
