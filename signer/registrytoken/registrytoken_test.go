package registrytoken

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/registry/auth/token"
	"github.com/go-jose/go-jose/v4"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
)

var (
	t0     = time.Date(2026, 11, 23, 17, 0, 0, 0, time.UTC)
	sample = Token{
		Issuer: "keyward", Audience: "registry.example", Subject: "system:serviceaccount:ns:sa",
		Access:    []Access{{Type: "repository", Name: "team/app", Actions: []string{"pull"}}},
		NotBefore: t0, Expiry: t0.Add(5 * time.Minute), ID: "id-1",
	}
)

func fileKey(t *testing.T, alg backends.Algorithm) backends.Signer {
	t.Helper()
	s, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "k.pem"), Algorithm: alg,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func decodePart(t *testing.T, part string, v any) {
	t.Helper()
	b, err := base64.RawURLEncoding.DecodeString(part)
	if err != nil {
		t.Fatalf("part %q is not base64url without padding: %v", part, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("part %s: %v", b, err)
	}
}

// An independent verifier (go-jose, which Distribution uses) accepts every
// algorithm Mint picks, with the signature checked against the key.
func TestMintedTokensVerifyForEveryAlgorithm(t *testing.T) {
	for _, tc := range []struct {
		alg     backends.Algorithm
		jose    string
		sigSize int // 0: not checked
	}{
		{backends.ECDSAP256SHA256, "ES256", 64},
		{backends.ECDSAP384SHA384, "ES384", 96},
		{backends.Ed25519, "EdDSA", 64},
		{backends.RSA2048PKCS1SHA256, "RS256", 256},
		{backends.RSA2048PSSSHA256, "PS256", 256},
		{backends.RSA3072PKCS1SHA512, "RS512", 384},
		{backends.RSA3072PSSSHA384, "PS384", 384},
	} {
		t.Run(string(tc.alg)+" signs "+tc.jose, func(t *testing.T) {
			key := fileKey(t, tc.alg)
			raw, err := Mint(context.Background(), key, sample)
			if err != nil {
				t.Fatal(err)
			}
			parts := strings.Split(raw, ".")
			if len(parts) != 3 {
				t.Fatalf("%d parts, want 3", len(parts))
			}
			sig, err := base64.RawURLEncoding.DecodeString(parts[2])
			if err != nil {
				t.Fatal(err)
			}
			if len(sig) != tc.sigSize {
				t.Errorf("signature is %d bytes, want %d", len(sig), tc.sigSize)
			}
			jws, err := jose.ParseSigned(raw, []jose.SignatureAlgorithm{jose.SignatureAlgorithm(tc.jose)})
			if err != nil {
				t.Fatalf("go-jose does not parse it as %s: %v", tc.jose, err)
			}
			payload, err := jws.Verify(key.Public())
			if err != nil {
				t.Fatalf("go-jose does not verify it: %v", err)
			}
			var got claims
			if err := json.Unmarshal(payload, &got); err != nil {
				t.Fatal(err)
			}
			want := claims{Iss: "keyward", Sub: "system:serviceaccount:ns:sa", Aud: "registry.example",
				Exp: t0.Add(5 * time.Minute).Unix(), Nbf: t0.Unix(), Iat: t0.Unix(), Jti: "id-1", Access: sample.Access}
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(want)
			if string(gb) != string(wb) {
				t.Errorf("claims %s, want %s", gb, wb)
			}
		})
	}
}

// The classic bug: a crypto.Signer returns ECDSA signatures in ASN.1 DER,
// JWS wants r||s at the curve's size. Checked here without go-jose.
func TestECDSASignaturesAreRawRAndSAtTheCurvesSize(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	raw, err := Mint(context.Background(), key, sample)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.LastIndex(raw, ".")
	sig, err := base64.RawURLEncoding.DecodeString(raw[i+1:])
	if err != nil {
		t.Fatal(err)
	}
	if len(sig) != 64 {
		t.Fatalf("signature is %d bytes, want 64", len(sig))
	}
	digest := sha256.Sum256([]byte(raw[:i]))
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])
	if !ecdsa.Verify(key.Public().(*ecdsa.PublicKey), digest[:], r, s) {
		t.Fatal("r||s does not verify over the signing input")
	}
}

func TestShortECDSAValuesArePaddedAndBadOnesRefused(t *testing.T) {
	der := func(r, s *big.Int) []byte {
		b, err := asn1.Marshal(struct{ R, S *big.Int }{r, s})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	big32 := new(big.Int).Lsh(big.NewInt(1), 256)
	for _, tc := range []struct {
		name string
		der  []byte
		want []byte
	}{
		{name: "small r and s are left-padded with zeros", der: der(big.NewInt(1), big.NewInt(0x0203)),
			want: append(append(make([]byte, 31), 1), append(make([]byte, 30), 2, 3)...)},
		{name: "a value longer than the curve is refused", der: der(big32, big.NewInt(1))},
		{name: "a zero value is refused", der: der(big.NewInt(0), big.NewInt(1))},
		{name: "trailing bytes are refused", der: append(der(big.NewInt(1), big.NewInt(1)), 0)},
		{name: "something that is not ASN.1 is refused", der: make([]byte, 64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ecdsaToJOSE(tc.der, 32)
			if tc.want == nil {
				if err == nil {
					t.Fatalf("got %x, want an error", got)
				}
				return
			}
			if err != nil || string(got) != string(tc.want) {
				t.Fatalf("got %x, %v; want %x", got, err, tc.want)
			}
		})
	}
}

func TestTheHeaderNamesTheKeyByKidOrX5c(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "tokens"},
		NotBefore: t0, NotAfter: t0.Add(time.Hour), SignatureAlgorithm: key.SignatureAlgorithm()}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	thumb, err := Thumbprint(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Token)
		want header
	}{
		{name: "no chain and no kid: the kid is the key's thumbprint", want: header{Alg: "ES256", Typ: "JWT", Kid: thumb}},
		{name: "a kid given is used", edit: func(tok *Token) { tok.KeyID = "gen-3" }, want: header{Alg: "ES256", Typ: "JWT", Kid: "gen-3"}},
		{name: "a chain goes into x5c without a kid", edit: func(tok *Token) { tok.Chain = []*x509.Certificate{cert} },
			want: header{Alg: "ES256", Typ: "JWT", X5c: [][]byte{cert.Raw}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := sample
			if tc.edit != nil {
				tc.edit(&tok)
			}
			raw, err := Mint(context.Background(), key, tok)
			if err != nil {
				t.Fatal(err)
			}
			var got header
			decodePart(t, strings.Split(raw, ".")[0], &got)
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(tc.want)
			if string(gb) != string(wb) {
				t.Errorf("header %s, want %s", gb, wb)
			}
		})
	}
}

func TestMintRefusesWhatItCannotMint(t *testing.T) {
	key := fileKey(t, backends.ECDSAP256SHA256)
	otherKey := fileKey(t, backends.ECDSAP256SHA256)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: t0, NotAfter: t0.Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, otherKey.Public(), otherKey)
	if err != nil {
		t.Fatal(err)
	}
	otherCert, _ := x509.ParseCertificate(der)
	for _, tc := range []struct {
		name string
		edit func(*Token)
	}{
		{"a token without an issuer", func(tok *Token) { tok.Issuer = "" }},
		{"a token without an audience", func(tok *Token) { tok.Audience = "" }},
		{"a token without a subject", func(tok *Token) { tok.Subject = "" }},
		{"a token without an expiry", func(tok *Token) { tok.Expiry = time.Time{} }},
		{"a token that expires before it starts", func(tok *Token) { tok.Expiry = tok.NotBefore.Add(-time.Second) }},
		{"an access without actions", func(tok *Token) { tok.Access = []Access{{Type: "repository", Name: "a"}} }},
		{"a chain whose leaf holds another key", func(tok *Token) { tok.Chain = []*x509.Certificate{otherCert} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := sample
			tc.edit(&tok)
			if _, err := Mint(context.Background(), key, tok); !errors.Is(err, ErrInvalid) {
				t.Fatalf("got %v, want ErrInvalid", err)
			}
		})
	}
}

type countingSigner struct {
	backends.Signer
	plain, withContext int
}

func (c *countingSigner) Sign(r io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	c.plain++
	return c.Signer.Sign(r, d, o)
}

func (c *countingSigner) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	c.withContext++
	return c.Signer.SignContext(ctx, d, o)
}

func TestMintSignsThroughSignContext(t *testing.T) {
	c := &countingSigner{Signer: fileKey(t, backends.ECDSAP256SHA256)}
	if _, err := Mint(context.Background(), c, sample); err != nil {
		t.Fatal(err)
	}
	if c.withContext != 1 || c.plain != 0 {
		t.Fatalf("SignContext %d times, Sign %d times; want 1 and 0", c.withContext, c.plain)
	}
}

// Distribution trusts a rootcertbundle key under its own spelling of the
// key's thumbprint, which drops leading zero bytes of ECDSA coordinates;
// Thumbprint must match it for such keys too (where it differs from RFC
// 7638's fixed-size spelling, which go-jose computes).
func TestThumbprintIsTheKidDistributionLooksUp(t *testing.T) {
	var short *ecdsa.PrivateKey
	for range 100000 {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := k.PublicKey.Bytes(); b[1] == 0 {
			short = k
			break
		}
	}
	if short == nil {
		t.Fatal("found no P-256 key whose X starts with a zero byte")
	}
	for _, tc := range []struct {
		name string
		pub  crypto.PublicKey
		rfc  string // "same", "differs"; "": not checked (a random ECDSA key may start with a zero byte)
	}{
		{"an ECDSA key whose X starts with a zero byte", &short.PublicKey, "differs"},
		{"an ECDSA P-384 key", fileKey(t, backends.ECDSAP384SHA384).Public(), ""},
		{"an RSA key", fileKey(t, backends.RSA2048PKCS1SHA256).Public(), "same"},
		{"an Ed25519 key", fileKey(t, backends.Ed25519).Public(), "same"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Thumbprint(tc.pub)
			if err != nil {
				t.Fatal(err)
			}
			if want := token.GetJWKThumbprint(tc.pub); got != want {
				t.Errorf("Thumbprint %s, Distribution looks up %s", got, want)
			}
			rfc, err := (&jose.JSONWebKey{Key: tc.pub}).Thumbprint(crypto.SHA256)
			if err != nil {
				t.Fatal(err)
			}
			same := map[bool]string{true: "same", false: "differs"}[got == base64.RawURLEncoding.EncodeToString(rfc)]
			if tc.rfc != "" && same != tc.rfc {
				t.Errorf("against the RFC 7638 thumbprint: %s, want %s", same, tc.rfc)
			}
		})
	}
}
