package awskms

import (
	"fmt"
	"slices"

	"github.com/aws/aws-sdk-go-v2/service/kms/types"
	"github.com/keyward/keyward/backends"
)

// mapping is one way keyward signs with an AWS KMS key: the key spec, the
// signing algorithm and the message type of the Sign call.
type mapping struct {
	alg         backends.Algorithm
	keySpec     types.KeySpec
	signing     types.SigningAlgorithmSpec
	messageType types.MessageType
}

// mappings lists every (key spec, signing algorithm) pair keyward signs
// with, from the AWS KMS key spec reference. ECDSA keys sign with their
// curve's hash only; RSA keys with PKCS#1 v1.5 or PSS (salt length = hash
// length) and SHA-256, -384 or -512; Ed25519 keys with pure Ed25519
// (ED25519_SHA_512), whose Sign call must carry the message itself
// (MessageType RAW). Left out: ECC_NIST_P521 and ECC_SECG_P256K1 (keyward
// makes no such CAs), ED25519_PH_SHA_512 (Ed25519ph, which X.509 does not
// use), SM2, ML-DSA, and keys that do not sign (symmetric, HMAC).
func mappings() []mapping {
	m := []mapping{
		{backends.ECDSAP256SHA256, types.KeySpecEccNistP256, types.SigningAlgorithmSpecEcdsaSha256, types.MessageTypeDigest},
		{backends.ECDSAP384SHA384, types.KeySpecEccNistP384, types.SigningAlgorithmSpecEcdsaSha384, types.MessageTypeDigest},
		{backends.Ed25519, types.KeySpecEccNistEdwards25519, types.SigningAlgorithmSpecEd25519Sha512, types.MessageTypeRaw},
	}
	rsaSpecs := []struct {
		bits int
		spec types.KeySpec
	}{{2048, types.KeySpecRsa2048}, {3072, types.KeySpecRsa3072}, {4096, types.KeySpecRsa4096}}
	hashes := []struct {
		name       string
		pkcs1, pss types.SigningAlgorithmSpec
	}{
		{"sha256", types.SigningAlgorithmSpecRsassaPkcs1V15Sha256, types.SigningAlgorithmSpecRsassaPssSha256},
		{"sha384", types.SigningAlgorithmSpecRsassaPkcs1V15Sha384, types.SigningAlgorithmSpecRsassaPssSha384},
		{"sha512", types.SigningAlgorithmSpecRsassaPkcs1V15Sha512, types.SigningAlgorithmSpecRsassaPssSha512},
	}
	for _, r := range rsaSpecs {
		for _, h := range hashes {
			m = append(m,
				mapping{backends.Algorithm(fmt.Sprintf("rsa-%d-pkcs1-%s", r.bits, h.name)), r.spec, h.pkcs1, types.MessageTypeDigest},
				mapping{backends.Algorithm(fmt.Sprintf("rsa-%d-pss-%s", r.bits, h.name)), r.spec, h.pss, types.MessageTypeDigest})
		}
	}
	return m
}

// defaultSigning is the signing algorithm a key of spec signs with when its
// URI names none. It is chosen here, from the key spec alone, and never
// taken from the key's own list of signing algorithms, whose order AWS does
// not promise: the curve's hash for ECDSA, PKCS#1 v1.5 with SHA-256 for RSA
// (the widest compatibility, as backends.DefaultAlgorithm), pure Ed25519.
func defaultSigning(spec types.KeySpec) (types.SigningAlgorithmSpec, bool) {
	switch spec {
	case types.KeySpecEccNistP256:
		return types.SigningAlgorithmSpecEcdsaSha256, true
	case types.KeySpecEccNistP384:
		return types.SigningAlgorithmSpecEcdsaSha384, true
	case types.KeySpecRsa2048, types.KeySpecRsa3072, types.KeySpecRsa4096:
		return types.SigningAlgorithmSpecRsassaPkcs1V15Sha256, true
	case types.KeySpecEccNistEdwards25519:
		return types.SigningAlgorithmSpecEd25519Sha512, true
	}
	return "", false
}

// lookup finds the mapping of a key spec and signing algorithm.
func lookup(spec types.KeySpec, signing types.SigningAlgorithmSpec) (mapping, bool) {
	for _, m := range mappings() {
		if m.keySpec == spec && m.signing == signing {
			return m, true
		}
	}
	return mapping{}, false
}

// forAlgorithm finds the key spec and signing algorithm of alg.
func forAlgorithm(alg backends.Algorithm) (mapping, bool) {
	for _, m := range mappings() {
		if m.alg == alg {
			return m, true
		}
	}
	return mapping{}, false
}

// knownSigning reports whether keyward signs with s on some key spec.
func knownSigning(s types.SigningAlgorithmSpec) bool {
	return slices.ContainsFunc(mappings(), func(m mapping) bool { return m.signing == s })
}

// supportedKeySpec reports whether keyward signs with keys of spec.
func supportedKeySpec(spec types.KeySpec) bool {
	return slices.ContainsFunc(mappings(), func(m mapping) bool { return m.keySpec == spec })
}

// supportedKeySpecs lists, sorted, the key specs keyward signs with, for
// error messages.
func supportedKeySpecs() []types.KeySpec {
	var out []types.KeySpec
	for _, m := range mappings() {
		if !slices.Contains(out, m.keySpec) {
			out = append(out, m.keySpec)
		}
	}
	slices.Sort(out)
	return out
}

// supportedAlgorithms lists, sorted, every algorithm of mappings.
func supportedAlgorithms() []backends.Algorithm {
	var out []backends.Algorithm
	for _, m := range mappings() {
		out = append(out, m.alg)
	}
	slices.Sort(out)
	return out
}
