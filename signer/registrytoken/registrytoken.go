// Package registrytoken mints the bearer JWTs of the container registry
// token protocol (CNCF Distribution's token authentication): a JWS in
// compact form whose claims name the issuer, the registry (audience), the
// subject and the repositories and actions granted. The signature is made
// by a crypto.Signer, so the key may live in any keyward backend.
//
// Nothing here knows about Kubernetes or HTTP.
package registrytoken

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"time"

	jose "github.com/go-jose/go-jose/v4"

	"github.com/keyward/keyward/backends"
)

// ErrInvalid is wrapped by Mint for a Token that cannot be minted as given.
var ErrInvalid = errors.New("invalid registry token")

// Access is one grant: the actions allowed on a resource
// (Type "repository", Name "library/alpine", Actions ["pull"]).
type Access struct {
	Type    string   `json:"type"`
	Name    string   `json:"name"`
	Actions []string `json:"actions"`
}

// Token is what a minted JWT says. Issuer, Audience, Subject, a lifetime
// and a signing key are required; Access may be empty (the protocol's
// answer when no requested scope is granted).
type Token struct {
	Issuer   string // iss: the registry's auth.token.issuer
	Audience string // aud: the registry's auth.token.service
	Subject  string // sub
	Access   []Access

	NotBefore time.Time // nbf and iat
	Expiry    time.Time // exp
	// ID is the jti; empty: 16 random bytes, base64url.
	ID string

	// Chain, when set, goes into the x5c header (leaf first); its leaf must
	// hold the signing key. Without it the header names the key by KeyID.
	Chain []*x509.Certificate
	// KeyID is the kid header; empty and no Chain: Thumbprint(key).
	KeyID string
}

// Thumbprint is the RFC 7638 JWK thumbprint (SHA-256, base64url) of pub,
// the kid under which Distribution trusts each key of its rootcertbundle.
//
// It spells ECDSA coordinates as Distribution does (big-endian without
// leading zero bytes) rather than at the curve's fixed size as RFC 7638
// asks: the two differ for about one P-256 key in 128, and only
// Distribution's spelling makes the registry find the key.
func Thumbprint(pub crypto.PublicKey) (string, error) {
	var in string
	b64 := base64.RawURLEncoding.EncodeToString
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		x, y, err := ecdsaCoordinates(k)
		if err != nil {
			return "", err
		}
		in = fmt.Sprintf(`{"crv":%q,"kty":"EC","x":%q,"y":%q}`, k.Curve.Params().Name, b64(x.Bytes()), b64(y.Bytes()))
	case ed25519.PublicKey:
		in = fmt.Sprintf(`{"crv":"Ed25519","kty":"OKP","x":%q}`, b64(k))
	case *rsa.PublicKey:
		in = fmt.Sprintf(`{"e":%q,"kty":"RSA","n":%q}`, b64(big.NewInt(int64(k.E)).Bytes()), b64(k.N.Bytes()))
	default:
		return "", fmt.Errorf("%w: no thumbprint for %s", ErrInvalid, backends.DescribeKey(pub))
	}
	sum := sha256.Sum256([]byte(in))
	return b64(sum[:]), nil
}

// JOSEAlgorithm is the JWS "alg" for a keyward algorithm: ES256, ES384,
// EdDSA, RS256/384/512 or PS256/384/512.
func JOSEAlgorithm(a backends.Algorithm) (string, error) {
	switch a.Kind() {
	case backends.KindECDSA:
		switch a.Curve() {
		case elliptic.P256():
			return "ES256", nil
		case elliptic.P384():
			return "ES384", nil
		}
	case backends.KindEd25519:
		return "EdDSA", nil
	case backends.KindRSA:
		prefix := "RS"
		if a.PSS() {
			prefix = "PS"
		}
		switch a.Hash() {
		case crypto.SHA256:
			return prefix + "256", nil
		case crypto.SHA384:
			return prefix + "384", nil
		case crypto.SHA512:
			return prefix + "512", nil
		}
	}
	return "", fmt.Errorf("%w: no JWS algorithm for %q", ErrInvalid, a)
}

type contextSigner interface {
	SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error)
}

type algorithmSigner interface {
	Algorithm() backends.Algorithm
}

type header struct {
	Alg string   `json:"alg"`
	Typ string   `json:"typ"`
	Kid string   `json:"kid,omitempty"`
	X5c [][]byte `json:"x5c,omitempty"` // standard base64 of DER, as RFC 7515 asks
}

type claims struct {
	Iss    string   `json:"iss"`
	Sub    string   `json:"sub"`
	Aud    string   `json:"aud"`
	Exp    int64    `json:"exp"`
	Nbf    int64    `json:"nbf"`
	Iat    int64    `json:"iat"`
	Jti    string   `json:"jti"`
	Access []Access `json:"access"`
}

// Mint signs tok with key and returns the compact JWS. The algorithm is
// key's Algorithm() when key is a backends.Signer, else the key's default
// (backends.DefaultAlgorithm); the signature is made through SignContext
// when key has it, so ctx bounds a remote backend's round trip.
func Mint(ctx context.Context, key crypto.Signer, tok Token) (string, error) {
	if err := tok.validate(); err != nil {
		return "", err
	}
	pub := key.Public()
	var alg backends.Algorithm
	if as, ok := key.(algorithmSigner); ok {
		alg = as.Algorithm()
	} else {
		var err error
		if alg, err = backends.DefaultAlgorithm(pub); err != nil {
			return "", fmt.Errorf("minting registry token: %w", err)
		}
	}
	jalg, err := JOSEAlgorithm(alg)
	if err != nil {
		return "", err
	}
	h := header{Alg: jalg, Typ: "JWT", Kid: tok.KeyID}
	if len(tok.Chain) > 0 {
		if !publicKeysEqual(tok.Chain[0].PublicKey, pub) {
			return "", fmt.Errorf("%w: the x5c leaf does not hold the signing key", ErrInvalid)
		}
		for _, c := range tok.Chain {
			h.X5c = append(h.X5c, c.Raw)
		}
	} else if h.Kid == "" {
		if h.Kid, err = Thumbprint(pub); err != nil {
			return "", err
		}
	}
	jti := tok.ID
	if jti == "" {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return "", fmt.Errorf("making a token id: %w", err)
		}
		jti = base64.RawURLEncoding.EncodeToString(b)
	}
	access := tok.Access
	if access == nil {
		access = []Access{}
	}
	c := claims{
		Iss: tok.Issuer, Sub: tok.Subject, Aud: tok.Audience,
		Exp: tok.Expiry.Unix(), Nbf: tok.NotBefore.Unix(), Iat: tok.NotBefore.Unix(),
		Jti: jti, Access: access,
	}
	hj, err := json.Marshal(h)
	if err != nil {
		return "", fmt.Errorf("encoding token header: %w", err)
	}
	cj, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encoding token claims: %w", err)
	}
	b64 := base64.RawURLEncoding.EncodeToString
	signingInput := b64(hj) + "." + b64(cj)
	sig, err := sign(ctx, key, alg, []byte(signingInput))
	if err != nil {
		return "", err
	}
	return signingInput + "." + b64(sig), nil
}

func (tok Token) validate() error {
	switch {
	case tok.Issuer == "":
		return fmt.Errorf("%w: no issuer", ErrInvalid)
	case tok.Audience == "":
		return fmt.Errorf("%w: no audience", ErrInvalid)
	case tok.Subject == "":
		return fmt.Errorf("%w: no subject", ErrInvalid)
	case tok.NotBefore.IsZero() || tok.Expiry.IsZero():
		return fmt.Errorf("%w: no lifetime (not before and expiry are required)", ErrInvalid)
	case !tok.Expiry.After(tok.NotBefore):
		return fmt.Errorf("%w: expiry %s is not after not-before %s", ErrInvalid, tok.Expiry, tok.NotBefore)
	}
	for i, a := range tok.Access {
		if a.Type == "" || a.Name == "" || len(a.Actions) == 0 {
			return fmt.Errorf("%w: access[%d] needs a type, a name and actions", ErrInvalid, i)
		}
	}
	return nil
}

// sign signs msg and returns the JWS signature bytes: for ECDSA the raw
// r||s of RFC 7518 §3.4, each padded to the curve's size, not the ASN.1
// DER a crypto.Signer returns.
func sign(ctx context.Context, key crypto.Signer, alg backends.Algorithm, msg []byte) ([]byte, error) {
	opts := alg.SignerOpts()
	digest := msg // Ed25519 signs the message itself
	if h := alg.Hash(); h != 0 {
		hh := h.New()
		hh.Write(msg)
		digest = hh.Sum(nil)
	}
	var sig []byte
	var err error
	if cs, ok := key.(contextSigner); ok {
		sig, err = cs.SignContext(ctx, digest, opts)
	} else {
		sig, err = key.Sign(rand.Reader, digest, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("signing registry token: %w", err)
	}
	if alg.Kind() != backends.KindECDSA {
		return sig, nil
	}
	return ecdsaToJOSE(sig, (alg.Curve().Params().BitSize+7)/8)
}

// ecdsaToJOSE turns an ASN.1 ECDSA-Sig-Value into r||s, each size bytes.
func ecdsaToJOSE(der []byte, size int) ([]byte, error) {
	var v struct{ R, S *big.Int }
	rest, err := asn1.Unmarshal(der, &v)
	if err != nil || len(rest) > 0 || v.R == nil || v.S == nil || v.R.Sign() <= 0 || v.S.Sign() <= 0 {
		return nil, fmt.Errorf("signing registry token: the signer returned no ASN.1 ECDSA signature")
	}
	if len(v.R.Bytes()) > size || len(v.S.Bytes()) > size {
		return nil, fmt.Errorf("signing registry token: ECDSA signature values longer than the curve")
	}
	out := make([]byte, 2*size)
	v.R.FillBytes(out[:size])
	v.S.FillBytes(out[size:])
	return out, nil
}

func ecdsaCoordinates(k *ecdsa.PublicKey) (x, y *big.Int, err error) {
	b, err := k.Bytes() // uncompressed point 0x04||X||Y
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	n := (len(b) - 1) / 2
	return new(big.Int).SetBytes(b[1 : 1+n]), new(big.Int).SetBytes(b[1+n:]), nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ae, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ae.Equal(b)
}

// JWKS is the JSON Web Key Set of the certificates' public keys, for a
// registry's auth.token.jwks file: each key's kid is its Thumbprint, the
// kid the token service writes when keyIdentifier is kid, so a token's key
// is found by name. Keys are written as go-jose (Distribution's parser)
// writes them; a key listed twice is written once.
func JWKS(certs []*x509.Certificate) ([]byte, error) {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	seen := map[string]bool{}
	for _, c := range certs {
		kid, err := Thumbprint(c.PublicKey)
		if err != nil {
			return nil, fmt.Errorf("certificate %q: %w", c.Subject, err)
		}
		if seen[kid] {
			continue
		}
		seen[kid] = true
		set.Keys = append(set.Keys, jose.JSONWebKey{Key: c.PublicKey, KeyID: kid, Use: "sig"})
	}
	return json.MarshalIndent(set, "", "  ")
}
