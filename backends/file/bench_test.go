package file_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/file"
)

// BenchmarkSign compares signing through the file backend with Go's crypto
// on the same key, at 1, 2, 4 and 16 goroutines.
func BenchmarkSign(b *testing.B) {
	for _, alg := range []backends.Algorithm{backends.ECDSAP256SHA256, backends.RSA2048PKCS1SHA256} {
		uri := "file:" + filepath.Join(b.TempDir(), "ca.pem")
		s, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{URI: uri, Algorithm: alg})
		if err != nil {
			b.Fatal(err)
		}
		raw, err := backends.GenerateKey(alg) // same algorithm, signed directly
		if err != nil {
			b.Fatal(err)
		}
		digest := sha256.Sum256([]byte("keyward"))
		opts := alg.SignerOpts()
		for _, workers := range []int{1, 2, 4, 16} {
			b.Run(fmt.Sprintf("%s/raw/workers=%d", alg, workers), func(b *testing.B) {
				backendtest.Concurrent(b, workers, func() error {
					_, err := raw.Sign(rand.Reader, digest[:], opts)
					return err
				})
			})
			b.Run(fmt.Sprintf("%s/keyward/workers=%d", alg, workers), func(b *testing.B) {
				backendtest.Concurrent(b, workers, func() error {
					_, err := s.SignContext(context.Background(), digest[:], opts)
					return err
				})
			})
		}
	}
}

var _ crypto.Signer = (*file.Signer)(nil)
