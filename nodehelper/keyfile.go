package nodehelper

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"

	"github.com/keyward/keyward/nodehelper/atomicdir"
)

// MarshalPrivateKeyPEM encodes key as one PKCS#8 "PRIVATE KEY" PEM block,
// the form KEP-4317 credential bundles and kubelet use for every key type.
func MarshalPrivateKeyPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encoding private key as PKCS#8: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// MarshalStubRequestPEM encodes a stub PKCS#10 request (NewStubPKCS10Request)
// as a "CERTIFICATE REQUEST" PEM block.
func MarshalStubRequestPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

// WriteFileAtomic writes data to path with mode so that path holds either
// its old content or all of data, never a part: a temporary file in the same
// directory, fsynced, then renamed (or, unless overwrite, hard-linked so an
// existing path is never replaced), and the directory fsynced. Without
// overwrite an existing path gives an error wrapping os.ErrExist.
func WriteFileAtomic(path string, data []byte, mode os.FileMode, overwrite bool) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return fmt.Errorf("creating a temporary file for %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename or link, a no-op or the extra name
	err = func() error {
		if err := f.Chmod(mode.Perm()); err != nil {
			return fmt.Errorf("setting mode of %s: %w", tmp, err)
		}
		if _, err := f.Write(data); err != nil {
			return fmt.Errorf("writing %s: %w", tmp, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("syncing %s: %w", tmp, err)
		}
		return nil
	}()
	if cerr := f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing %s: %w", tmp, cerr)
	}
	if err != nil {
		return err
	}
	if overwrite {
		err = os.Rename(tmp, path)
	} else {
		err = os.Link(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("placing %s: %w", path, err)
	}
	return atomicdir.SyncDir(dir)
}
