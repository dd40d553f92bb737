package file_test

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/file"
)

// BenchmarkSign compares signing through the file backend with Go's crypto
// on the same key (parsed from the file the backend wrote), at 1, 2, 4 and 16 goroutines.
func BenchmarkSign(b *testing.B) {
	for _, alg := range []backends.Algorithm{backends.ECDSAP256SHA256, backends.RSA2048PKCS1SHA256} {
		path := filepath.Join(b.TempDir(), "ca.pem")
		s, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{URI: "file:" + path, Algorithm: alg})
		if err != nil {
			b.Fatal(err)
		}
		raw := parseKeyFile(b, path) // the same key, signed with directly

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

// parseKeyFile reads the PKCS#8 key the backend wrote, with Go's crypto only.
func parseKeyFile(b *testing.B, path string) crypto.Signer {
	b.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		b.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		b.Fatalf("%s holds no PEM block", path)
	}
	key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		b.Fatal(err)
	}
	return key.(crypto.Signer)
}
