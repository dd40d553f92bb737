//go:build cgo

package pkcs11_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/ThalesGroup/crypto11"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/pkcs11"
)

// BenchmarkSign compares signing through the pkcs11 backend with crypto11
// used directly on the same SoftHSM2 key and the same session-pool size, at
// 1, 2, 4 and 16 goroutines.
func BenchmarkSign(b *testing.B) {
	const sessions = 16
	p, err := pkcs11.New(pkcs11.Options{MaxSessions: sessions})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	raw, err := crypto11.Configure(&crypto11.Config{Path: token.ModulePath, TokenLabel: token.Label, Pin: token.PIN(),
		MaxSessions: sessions, PoolWaitTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer raw.Close()
	digest := sha256.Sum256([]byte("keyward"))
	for i, alg := range []backends.Algorithm{backends.ECDSAP256SHA256, backends.RSA2048PKCS1SHA256} {
		label := fmt.Sprintf("bench-%d-%d", i, time.Now().UnixNano())
		s, err := p.CreateKey(context.Background(), backends.CreateKeyRequest{URI: tokenURI(token, "object="+label), Algorithm: alg})
		if err != nil {
			b.Fatal(err)
		}
		key, err := raw.FindKeyPair(nil, []byte(label))
		if err != nil {
			b.Fatal(err)
		}
		opts := alg.SignerOpts()
		for _, workers := range []int{1, 2, 4, 16} {
			b.Run(fmt.Sprintf("%s/crypto11/workers=%d", alg, workers), func(b *testing.B) {
				backendtest.Concurrent(b, workers, func() error {
					_, err := key.Sign(rand.Reader, digest[:], opts)
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
