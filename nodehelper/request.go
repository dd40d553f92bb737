// Package nodehelper is keyward's node side: it generates subject keys,
// builds the stub PKCS#10 requests PodCertificateRequests carry, requests
// certificates and writes credential and trust bundles to disk.
package nodehelper

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"errors"
	"fmt"
)

// Key types a podCertificate projected volume may ask for; the names are the
// ones kubelet and the PodCertificateProjection API use.
const (
	KeyTypeRSA3072   = "RSA3072"
	KeyTypeRSA4096   = "RSA4096"
	KeyTypeECDSAP256 = "ECDSAP256"
	KeyTypeECDSAP384 = "ECDSAP384"
	KeyTypeECDSAP521 = "ECDSAP521"
	KeyTypeED25519   = "ED25519"
)

// ErrUnknownKeyType is returned by GenerateKey for a key type it does not know.
var ErrUnknownKeyType = errors.New("unknown key type")

// GenerateKey makes a new subject key of keyType.
func GenerateKey(keyType string) (crypto.Signer, error) {
	switch keyType {
	case KeyTypeRSA3072:
		return rsa.GenerateKey(rand.Reader, 3072)
	case KeyTypeRSA4096:
		return rsa.GenerateKey(rand.Reader, 4096)
	case KeyTypeECDSAP256:
		return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	case KeyTypeECDSAP384:
		return ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	case KeyTypeECDSAP521:
		return ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	case KeyTypeED25519:
		_, k, err := ed25519.GenerateKey(rand.Reader)
		return k, err
	default:
		return nil, fmt.Errorf("generating a %q key (want one of RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521, ED25519): %w", keyType, ErrUnknownKeyType)
	}
}

// NewStubPKCS10Request returns the DER PKCS#10 request a PodCertificateRequest
// carries in spec.stubPKCS10Request: an empty subject, signed by key to prove
// possession of it. kube-apiserver checks the signature and key type only.
func NewStubPKCS10Request(key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, fmt.Errorf("creating stub PKCS#10 request: %w", err)
	}
	return der, nil
}
