package backends

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"slices"
)

// Algorithm names a key type together with the signature scheme used with
// it, e.g. "ecdsa-p256-sha256" or "rsa-3072-pss-sha256". A key has exactly one
// Algorithm; the certificate templates it signs use its SignatureAlgorithm.
type Algorithm string

// The algorithms keyward knows. A backend supports a subset (Provider.Algorithms).
const (
	ECDSAP256SHA256 Algorithm = "ecdsa-p256-sha256"
	ECDSAP384SHA384 Algorithm = "ecdsa-p384-sha384"
	Ed25519         Algorithm = "ed25519"

	RSA2048PKCS1SHA256 Algorithm = "rsa-2048-pkcs1-sha256"
	RSA2048PKCS1SHA384 Algorithm = "rsa-2048-pkcs1-sha384"
	RSA2048PKCS1SHA512 Algorithm = "rsa-2048-pkcs1-sha512"
	RSA2048PSSSHA256   Algorithm = "rsa-2048-pss-sha256"
	RSA2048PSSSHA384   Algorithm = "rsa-2048-pss-sha384"
	RSA2048PSSSHA512   Algorithm = "rsa-2048-pss-sha512"
	RSA3072PKCS1SHA256 Algorithm = "rsa-3072-pkcs1-sha256"
	RSA3072PKCS1SHA384 Algorithm = "rsa-3072-pkcs1-sha384"
	RSA3072PKCS1SHA512 Algorithm = "rsa-3072-pkcs1-sha512"
	RSA3072PSSSHA256   Algorithm = "rsa-3072-pss-sha256"
	RSA3072PSSSHA384   Algorithm = "rsa-3072-pss-sha384"
	RSA3072PSSSHA512   Algorithm = "rsa-3072-pss-sha512"
	RSA4096PKCS1SHA256 Algorithm = "rsa-4096-pkcs1-sha256"
	RSA4096PKCS1SHA384 Algorithm = "rsa-4096-pkcs1-sha384"
	RSA4096PKCS1SHA512 Algorithm = "rsa-4096-pkcs1-sha512"
	RSA4096PSSSHA256   Algorithm = "rsa-4096-pss-sha256"
	RSA4096PSSSHA384   Algorithm = "rsa-4096-pss-sha384"
	RSA4096PSSSHA512   Algorithm = "rsa-4096-pss-sha512"
)

// KeyKind is the family of a key.
type KeyKind int

const (
	KindUnknown KeyKind = iota
	KindECDSA
	KindRSA
	KindEd25519
)

type algorithmInfo struct {
	kind    KeyKind
	curve   elliptic.Curve // ECDSA
	bits    int            // RSA
	hash    crypto.Hash    // 0 for Ed25519 (signs the message)
	pss     bool
	x509Alg x509.SignatureAlgorithm
}

func algorithmTable() map[Algorithm]algorithmInfo {
	t := map[Algorithm]algorithmInfo{
		ECDSAP256SHA256: {kind: KindECDSA, curve: elliptic.P256(), hash: crypto.SHA256, x509Alg: x509.ECDSAWithSHA256},
		ECDSAP384SHA384: {kind: KindECDSA, curve: elliptic.P384(), hash: crypto.SHA384, x509Alg: x509.ECDSAWithSHA384},
		Ed25519:         {kind: KindEd25519, x509Alg: x509.PureEd25519},
	}
	hashes := []struct {
		name        string
		h           crypto.Hash
		pkcs1, pssA x509.SignatureAlgorithm
	}{
		{"sha256", crypto.SHA256, x509.SHA256WithRSA, x509.SHA256WithRSAPSS},
		{"sha384", crypto.SHA384, x509.SHA384WithRSA, x509.SHA384WithRSAPSS},
		{"sha512", crypto.SHA512, x509.SHA512WithRSA, x509.SHA512WithRSAPSS},
	}
	for _, bits := range []int{2048, 3072, 4096} {
		for _, h := range hashes {
			t[Algorithm(fmt.Sprintf("rsa-%d-pkcs1-%s", bits, h.name))] = algorithmInfo{kind: KindRSA, bits: bits, hash: h.h, x509Alg: h.pkcs1}
			t[Algorithm(fmt.Sprintf("rsa-%d-pss-%s", bits, h.name))] = algorithmInfo{kind: KindRSA, bits: bits, hash: h.h, pss: true, x509Alg: h.pssA}
		}
	}
	return t
}

var algorithms = algorithmTable()

// AllAlgorithms lists every Algorithm keyward knows, sorted.
func AllAlgorithms() []Algorithm {
	out := make([]Algorithm, 0, len(algorithms))
	for a := range algorithms {
		out = append(out, a)
	}
	slices.Sort(out)
	return out
}

// ParseAlgorithm checks that s names a known Algorithm.
func ParseAlgorithm(s string) (Algorithm, error) {
	a := Algorithm(s)
	if _, ok := algorithms[a]; !ok {
		return "", fmt.Errorf("%w: %q (known: %v)", ErrUnsupportedAlgorithm, s, AllAlgorithms())
	}
	return a, nil
}

// Known reports whether a is an Algorithm keyward knows.
func (a Algorithm) Known() bool { _, ok := algorithms[a]; return ok }

// Kind is the key family.
func (a Algorithm) Kind() KeyKind { return algorithms[a].kind }

// Hash is the digest the signer expects; 0 for Ed25519, which signs the
// message itself.
func (a Algorithm) Hash() crypto.Hash { return algorithms[a].hash }

// PSS reports whether a is an RSA-PSS algorithm.
func (a Algorithm) PSS() bool { return algorithms[a].pss }

// RSABits is the modulus size of an RSA algorithm.
func (a Algorithm) RSABits() int { return algorithms[a].bits }

// Curve is the curve of an ECDSA algorithm.
func (a Algorithm) Curve() elliptic.Curve { return algorithms[a].curve }

// SignatureAlgorithm is the x509.SignatureAlgorithm for templates this key signs.
func (a Algorithm) SignatureAlgorithm() x509.SignatureAlgorithm { return algorithms[a].x509Alg }

// SignerOpts are the crypto.SignerOpts that select this algorithm's scheme:
// the hash, wrapped in PSS options (salt length = hash length) for PSS.
func (a Algorithm) SignerOpts() crypto.SignerOpts {
	info := algorithms[a]
	if info.pss {
		return &rsa.PSSOptions{SaltLength: rsa.PSSSaltLengthEqualsHash, Hash: info.hash}
	}
	return info.hash
}

// CheckOpts reports whether opts, as passed to Sign, ask for a's scheme
// (for PSS: a salt as long as the hash).
func (a Algorithm) CheckOpts(opts crypto.SignerOpts) error {
	info := algorithms[a]
	var h crypto.Hash
	if opts != nil {
		h = opts.HashFunc()
	}
	if h != info.hash {
		return fmt.Errorf("%w: key %s signs %v digests, asked for %v", ErrUnsupportedAlgorithm, a, info.hash, h)
	}
	pss, isPSS := opts.(*rsa.PSSOptions)
	if info.kind == KindRSA && isPSS != info.pss {
		return fmt.Errorf("%w: key %s does not sign with %s", ErrUnsupportedAlgorithm, a, map[bool]string{true: "PSS", false: "PKCS#1 v1.5"}[isPSS])
	}
	if info.pss && isPSS && pss.SaltLength != rsa.PSSSaltLengthEqualsHash && pss.SaltLength != info.hash.Size() {
		return fmt.Errorf("%w: key %s signs PSS with a salt as long as the hash, asked for salt length %d", ErrUnsupportedAlgorithm, a, pss.SaltLength)
	}
	return nil
}

// CheckPublicKey reports whether pub is a key of a's type and size.
func (a Algorithm) CheckPublicKey(pub crypto.PublicKey) error {
	info := algorithms[a]
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if info.kind == KindECDSA && k.Curve == info.curve {
			return nil
		}
	case *rsa.PublicKey:
		if info.kind == KindRSA && k.N.BitLen() == info.bits {
			return nil
		}
	case ed25519.PublicKey:
		if info.kind == KindEd25519 {
			return nil
		}
	}
	return fmt.Errorf("%w: public key %s does not fit algorithm %s", ErrUnsupportedAlgorithm, DescribeKey(pub), a)
}

// DefaultAlgorithm is the algorithm a local key gets when nothing says
// otherwise: the curve's own hash for ECDSA, PKCS#1 v1.5 with SHA-256 for RSA
// (the widest compatibility), Ed25519 for Ed25519.
func DefaultAlgorithm(pub crypto.PublicKey) (Algorithm, error) {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		switch k.Curve {
		case elliptic.P256():
			return ECDSAP256SHA256, nil
		case elliptic.P384():
			return ECDSAP384SHA384, nil
		}
	case *rsa.PublicKey:
		a := Algorithm(fmt.Sprintf("rsa-%d-pkcs1-sha256", k.N.BitLen()))
		if a.Known() {
			return a, nil
		}
	case ed25519.PublicKey:
		return Ed25519, nil
	}
	return "", fmt.Errorf("%w: %s (supported: ECDSA P-256/P-384, RSA 2048/3072/4096, Ed25519)", ErrUnsupportedAlgorithm, DescribeKey(pub))
}

// DescribeKey names a public key for people: "ECDSA P-256", "RSA 3072", "Ed25519".
func DescribeKey(pub crypto.PublicKey) string {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		return "ECDSA " + k.Curve.Params().Name
	case *rsa.PublicKey:
		return fmt.Sprintf("RSA %d", k.N.BitLen())
	case ed25519.PublicKey:
		return "Ed25519"
	default:
		return fmt.Sprintf("%T", pub)
	}
}
