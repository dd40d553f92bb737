// Package testca makes a throwaway CA for the signers' unit tests: a
// file-backed ECDSA P-256 key, a root it self-signs for a day, and an
// Authority on that key that counts its signatures.
package testca

import (
	"context"
	"crypto"
	"crypto/x509/pkix"
	"io"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/signer/authority"
)

// CountingSigner counts signatures made with the CA key.
type CountingSigner struct {
	backends.Signer
	n atomic.Int32
}

// SignContext signs with the CA key and counts it.
func (c *CountingSigner) SignContext(ctx context.Context, d []byte, o crypto.SignerOpts) ([]byte, error) {
	c.n.Add(1)
	return c.Signer.SignContext(ctx, d, o)
}

// Sign is SignContext without a context.
func (c *CountingSigner) Sign(_ io.Reader, d []byte, o crypto.SignerOpts) ([]byte, error) {
	return c.SignContext(context.Background(), d, o)
}

// Signatures is how many signatures the CA key has made since New (the
// root's own excepted).
func (c *CountingSigner) Signatures() int32 { return c.n.Load() }

// New makes the CA: its Authority, and the signer behind it that counts.
func New(t testing.TB) (*authority.Authority, *CountingSigner) {
	t.Helper()
	key, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	root, err := ca.SelfSign(context.Background(), key, ca.Options{Subject: pkix.Name{CommonName: "ca"}, Lifetime: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	counting := &CountingSigner{Signer: key}
	auth, err := authority.New(root, nil, counting)
	if err != nil {
		t.Fatal(err)
	}
	return auth, counting
}
