// Package backends is keyward's key contract: a CA key addressed by URI,
// opened through the Provider registered for the URI's scheme, used as a
// crypto.Signer. Providers live in sub-packages (file, pkcs11, gcpkms,
// awskms); backendtest is the conformance suite every one of them passes.
//
// Nothing here knows about Kubernetes.
package backends

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"

	"github.com/keyward/keyward/backends/uri"
)

// Signer is an open CA key. Public, Algorithm, SignatureAlgorithm, KeyVersion,
// Fingerprint and URI do no I/O (the public key is loaded once, at open).
// A Signer MUST be safe for concurrent use.
type Signer interface {
	crypto.Signer
	// SignContext signs digest (for Ed25519: the message) with opts, which
	// must match Algorithm().SignerOpts(). It honours ctx's deadline and
	// cancellation; remote backends verify the signature before returning.
	SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error)
	// Algorithm is the key's type and signature scheme.
	Algorithm() Algorithm
	// SignatureAlgorithm is what to put in certificate templates.
	SignatureAlgorithm() x509.SignatureAlgorithm
	// KeyVersion is a stable id of this exact key (a KMS key version name,
	// a PKCS#11 CKA_ID, a file's SPKI fingerprint).
	KeyVersion() string
	// Fingerprint is the lowercase hex SHA-256 of the DER SubjectPublicKeyInfo.
	Fingerprint() string
	// URI is the key's URI without secrets.
	URI() string
	// Close releases what the signer holds; it does not delete the key.
	Close() error
}

// OpenRequest asks a Provider to open an existing key.
type OpenRequest struct {
	URI string
}

// CreateKeyRequest asks a KeyCreator for a new key. URI says where (which
// token and label, which KMS key, which region); the created key's own URI
// is the returned Signer's URI().
type CreateKeyRequest struct {
	URI       string
	Algorithm Algorithm
}

// Provider opens keys for one URI scheme. It MUST be safe for concurrent use.
type Provider interface {
	// Scheme is the URI scheme it serves, without the colon ("pkcs11").
	Scheme() string
	// Algorithms lists what it can sign with; others are refused with
	// ErrUnsupportedAlgorithm.
	Algorithms() []Algorithm
	Open(ctx context.Context, req OpenRequest) (Signer, error)
	// Close releases shared resources (sessions, clients).
	Close() error
}

// KeyCreator is the optional capability of making new keys, used by CA
// rotation. HSM and KMS backends generate keys that cannot leave them; the
// file backend writes the key to a PEM file.
type KeyCreator interface {
	CreateKey(ctx context.Context, req CreateKeyRequest) (Signer, error)
}

// Destroyer is the optional capability of a Signer that CreateKey returned
// to remove its key again, for a key nothing references yet: keyward ca
// init destroys the key it made when the cluster then refuses the
// generation, so a failed try leaves nothing behind. Each backend takes its
// strongest step that needs no second party: PKCS#11 destroys the key
// pair's objects, the file backend removes the file, AWS KMS schedules the
// key's deletion after its shortest waiting period (7 days, cancellable),
// Cloud KMS schedules the version's destruction (the key ring's
// destroy-scheduled duration, restorable meanwhile). The string says what
// was done, for the operator.
type Destroyer interface {
	Destroy(ctx context.Context) (string, error)
}

// NotCreated is Destroy's refusal for a Signer that was opened, not made
// by CreateKey: a key someone else made (a CA key in use) is never
// destroyed through keyward, whatever calls Destroy.
func NotCreated(uri string) error {
	return Errorf(ErrPermanent, "destroy-key", uri, "", "this key was opened, not created by this process: keyward destroys only a key it has just created")
}

// KeyInfo holds what every Signer reports without I/O. Backends embed it.
type KeyInfo struct {
	pub         crypto.PublicKey
	alg         Algorithm
	version     string
	fingerprint string
	uri         string
}

// NewKeyInfo checks pub against alg and computes the fingerprint. The URI
// it reports is keyURI passed through uri.Redact, so that a Signer's URI,
// which logs and errors quote, never carries a secret.
func NewKeyInfo(pub crypto.PublicKey, alg Algorithm, version, keyURI string) (KeyInfo, error) {
	if err := alg.CheckPublicKey(pub); err != nil {
		return KeyInfo{}, err
	}
	fp, err := Fingerprint(pub)
	if err != nil {
		return KeyInfo{}, err
	}
	if version == "" {
		version = fp
	}
	return KeyInfo{pub: pub, alg: alg, version: version, fingerprint: fp, uri: uri.RedactURI(keyURI)}, nil
}

func (k KeyInfo) Public() crypto.PublicKey                    { return k.pub }
func (k KeyInfo) Algorithm() Algorithm                        { return k.alg }
func (k KeyInfo) SignatureAlgorithm() x509.SignatureAlgorithm { return k.alg.SignatureAlgorithm() }
func (k KeyInfo) KeyVersion() string                          { return k.version }
func (k KeyInfo) Fingerprint() string                         { return k.fingerprint }
func (k KeyInfo) URI() string                                 { return k.uri }

// Fingerprint is the lowercase hex SHA-256 of pub's DER SubjectPublicKeyInfo.
func Fingerprint(pub crypto.PublicKey) (string, error) {
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		return "", fmt.Errorf("encoding public key: %w", err)
	}
	sum := sha256.Sum256(der)
	return hex.EncodeToString(sum[:]), nil
}
