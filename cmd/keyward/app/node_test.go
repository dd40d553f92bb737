package app

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/keyward/keyward/nodehelper"
)

// readOnePEM reads path, which must hold exactly one PEM block of typ.
func readOnePEM(t *testing.T, path, typ string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, rest := pem.Decode(b)
	if block == nil || block.Type != typ || len(bytes.TrimSpace(rest)) != 0 {
		t.Fatalf("%s: want exactly one %s PEM block, got %q", path, typ, b)
	}
	return block.Bytes
}

func TestNodeKeygenKeyTypes(t *testing.T) {
	cases := []struct {
		name, keyType string
		check         func(crypto.PrivateKey) bool
	}{
		{name: "the default is an ECDSA P-256 key", check: func(k crypto.PrivateKey) bool {
			e, ok := k.(*ecdsa.PrivateKey)
			return ok && e.Curve == elliptic.P256()
		}},
		{name: "RSA3072 gives a 3072-bit RSA key", keyType: "RSA3072", check: func(k crypto.PrivateKey) bool {
			r, ok := k.(*rsa.PrivateKey)
			return ok && r.N.BitLen() == 3072
		}},
		{name: "RSA4096 gives a 4096-bit RSA key", keyType: "RSA4096", check: func(k crypto.PrivateKey) bool {
			r, ok := k.(*rsa.PrivateKey)
			return ok && r.N.BitLen() == 4096
		}},
		{name: "ECDSAP384 gives a P-384 key", keyType: "ECDSAP384", check: func(k crypto.PrivateKey) bool {
			e, ok := k.(*ecdsa.PrivateKey)
			return ok && e.Curve == elliptic.P384()
		}},
		{name: "ECDSAP521 gives a P-521 key", keyType: "ECDSAP521", check: func(k crypto.PrivateKey) bool {
			e, ok := k.(*ecdsa.PrivateKey)
			return ok && e.Curve == elliptic.P521()
		}},
		{name: "ED25519 gives an Ed25519 key", keyType: "ED25519", check: func(k crypto.PrivateKey) bool {
			_, ok := k.(ed25519.PrivateKey)
			return ok
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			keyPath, reqPath := filepath.Join(dir, "key.pem"), filepath.Join(dir, "req.pem")
			args := []string{"node", "keygen", "--out", keyPath, "--stub-request", reqPath}
			if tc.keyType != "" {
				args = append(args, "--key-type", tc.keyType)
			}
			if out, err := runKeyward(t, args...); err != nil {
				t.Fatalf("keygen: %v\n%s", err, out)
			}
			st, err := os.Stat(keyPath)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("key file mode %v, want 0600", st.Mode().Perm())
			}
			key, err := x509.ParsePKCS8PrivateKey(readOnePEM(t, keyPath, "PRIVATE KEY"))
			if err != nil {
				t.Fatalf("parsing PKCS#8 key: %v", err)
			}
			if !tc.check(key) {
				t.Fatalf("key is %T, not the type asked for", key)
			}
			// The checks kube-apiserver makes of a stub request: it parses,
			// its signature verifies with its own public key, and that key is
			// the subject key.
			req, err := x509.ParseCertificateRequest(readOnePEM(t, reqPath, "CERTIFICATE REQUEST"))
			if err != nil {
				t.Fatalf("parsing stub request: %v", err)
			}
			if err := req.CheckSignature(); err != nil {
				t.Errorf("stub request signature: %v", err)
			}
			pub := key.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool })
			if !pub.Equal(req.PublicKey) {
				t.Errorf("stub request holds another public key")
			}
			if len(req.Subject.Names) != 0 || len(req.Extensions) != 0 {
				t.Errorf("stub request subject %v, extensions %v: want both empty", req.Subject, req.Extensions)
			}
		})
	}
}

func TestNodeKeygenRefusals(t *testing.T) {
	t.Run("an unknown key type writes nothing", func(t *testing.T) {
		keyPath := filepath.Join(t.TempDir(), "key.pem")
		_, err := runKeyward(t, "node", "keygen", "--out", keyPath, "--key-type", "DSA1024")
		if !errors.Is(err, nodehelper.ErrUnknownKeyType) {
			t.Fatalf("keygen = %v, want ErrUnknownKeyType", err)
		}
		if _, err := os.Stat(keyPath); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("key file exists after a failed keygen: %v", err)
		}
	})
	t.Run("an existing stub request refuses the whole run, so no new key is left behind", func(t *testing.T) {
		dir := t.TempDir()
		keyPath, reqPath := filepath.Join(dir, "key.pem"), filepath.Join(dir, "req.pem")
		if err := os.WriteFile(reqPath, []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := runKeyward(t, "node", "keygen", "--out", keyPath, "--stub-request", reqPath)
		if !errors.Is(err, os.ErrExist) {
			t.Fatalf("keygen = %v, want ErrExist", err)
		}
		if _, err := os.Stat(keyPath); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a key was written although the run was refused: %v", err)
		}
	})
	t.Run("an existing key is kept unless --force", func(t *testing.T) {
		dir := t.TempDir()
		keyPath := filepath.Join(dir, "key.pem")
		if err := os.WriteFile(keyPath, []byte("old"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := runKeyward(t, "node", "keygen", "--out", keyPath)
		if !errors.Is(err, os.ErrExist) {
			t.Fatalf("keygen over an existing key = %v, want ErrExist", err)
		}
		if b, _ := os.ReadFile(keyPath); string(b) != "old" {
			t.Errorf("existing key changed to %q", b)
		}
		if out, err := runKeyward(t, "node", "keygen", "--out", keyPath, "--force"); err != nil {
			t.Fatalf("keygen --force: %v\n%s", err, out)
		}
		if _, err := x509.ParsePKCS8PrivateKey(readOnePEM(t, keyPath, "PRIVATE KEY")); err != nil {
			t.Errorf("after --force: %v", err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) != 1 {
			t.Errorf("directory holds %d entries, want only key.pem (no temporary files left)", len(entries))
		}
	})
}
