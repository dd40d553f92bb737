// Package all builds a backends.Registry with every backend keyward ships.
package all

import (
	"fmt"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/awskms"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/backends/gcpkms"
	"github.com/keyward/keyward/backends/pkcs11"
)

// Options configure each backend; the zero value gives every default.
type Options struct {
	PKCS11 pkcs11.Options
	GCPKMS gcpkms.Options
	AWSKMS awskms.Options
}

// NewRegistry returns a registry with every backend. It does no I/O:
// backends connect on first use.
func NewRegistry(opts Options) (*backends.Registry, error) {
	p11, err := pkcs11.New(opts.PKCS11)
	if err != nil {
		return nil, fmt.Errorf("configuring pkcs11 backend: %w", err)
	}
	gcp, err := gcpkms.New(opts.GCPKMS)
	if err != nil {
		return nil, fmt.Errorf("configuring gcpkms backend: %w", err)
	}
	aws, err := awskms.New(opts.AWSKMS)
	if err != nil {
		return nil, fmt.Errorf("configuring awskms backend: %w", err)
	}
	return backends.NewRegistry(file.New(), p11, gcp, aws)
}
