//go:build !cgo

package pkcs11_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/pkcs11"
)

// Without cgo, opening and creating keys both say the build lacks PKCS#11
// support, naming the URI (without its PIN).
func TestWithoutCgoEveryKeySaysSo(t *testing.T) {
	p, err := pkcs11.New(pkcs11.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := backends.NewRegistry(p)
	if err != nil {
		t.Fatal(err)
	}
	const raw = "pkcs11:token=keyward;object=ca;pin-value=4711?module-path=/usr/lib/softhsm/libsofthsm2.so"
	const want = "pkcs11:token=keyward;object=ca;pin-value=REDACTED?module-path=/usr/lib/softhsm/libsofthsm2.so"
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"open", func() error {
			_, err := reg.Open(context.Background(), backends.OpenRequest{URI: raw})
			return err
		}},
		{"create-key", func() error {
			_, err := reg.CreateKey(context.Background(), backends.CreateKeyRequest{URI: raw, Algorithm: backends.ECDSAP256SHA256})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			var be *backends.Error
			if !errors.Is(err, pkcs11.ErrNoCgo) || !errors.As(err, &be) {
				t.Fatalf("got %v, want ErrNoCgo in a *backends.Error", err)
			}
			if be.Op != tc.name || be.URI != want || !errors.Is(err, backends.ErrPermanent) {
				t.Errorf("got op %q, URI %q, permanent %t; want %q, %q, true", be.Op, be.URI, errors.Is(err, backends.ErrPermanent), tc.name, want)
			}
			if strings.Contains(err.Error(), "4711") {
				t.Errorf("error %q shows the PIN", err)
			}
		})
	}
}
