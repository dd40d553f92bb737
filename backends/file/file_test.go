package file_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/file"
)

func TestConformance(t *testing.T) {
	dir := t.TempDir()
	p521, err := ecdsa.GenerateKey(elliptic.P521(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	unsupported := writeKey(t, dir, "p521.pem", p521)
	keys := newKeyFiles(dir)
	backendtest.Run(t, backendtest.Harness{
		Provider:          file.New(),
		KeyURI:            keys.uri,
		MissingKeyURI:     "file:" + filepath.Join(dir, "missing.pem"),
		UnsupportedKeyURI: "file:" + unsupported,
		CreateURI: func(t *testing.T, alg backends.Algorithm) string {
			return "file:" + filepath.Join(t.TempDir(), "new.pem")
		},
		Algorithms: testAlgorithms(),
	})
}

// testAlgorithms is every algorithm, but in -short runs only one RSA size
// for each scheme (RSA-4096 key generation takes seconds).
func testAlgorithms() []backends.Algorithm {
	if !testing.Short() {
		return nil
	}
	return []backends.Algorithm{backends.ECDSAP256SHA256, backends.ECDSAP384SHA384, backends.Ed25519,
		backends.RSA2048PKCS1SHA256, backends.RSA2048PSSSHA512}
}

// keyFiles writes one key file per key shape and addresses it with the
// algorithm attribute, so RSA keys are generated once per size.
type keyFiles struct {
	dir   string
	mu    sync.Mutex
	paths map[string]string
}

func newKeyFiles(dir string) *keyFiles { return &keyFiles{dir: dir, paths: map[string]string{}} }

func (k *keyFiles) uri(t *testing.T, alg backends.Algorithm) string {
	shape := fmt.Sprintf("%d-%d-%v", alg.Kind(), alg.RSABits(), alg.Curve())
	k.mu.Lock()
	defer k.mu.Unlock()
	path, ok := k.paths[shape]
	if !ok {
		key, err := backends.GenerateKey(alg)
		if err != nil {
			t.Fatal(err)
		}
		path = writeKey(t, k.dir, fmt.Sprintf("key-%d.pem", len(k.paths)), key)
		k.paths[shape] = path
	}
	return "file:" + path + "?algorithm=" + string(alg)
}

func writeKey(t *testing.T, dir, name string, key any) string {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
