//go:build !cgo

package pkcs11

import (
	"context"
	"errors"
	"time"

	"github.com/keyward/keyward/backends"
)

// ErrNoCgo is what every operation returns in a build without cgo.
var ErrNoCgo = errors.New("keyward was built without PKCS#11 support (cgo disabled)")

// Options configure a Provider (unused without cgo).
type Options struct {
	AllowedModules  []string
	MaxSessions     int
	PoolWaitTimeout time.Duration
	ReopenInterval  time.Duration
}

// Provider refuses every key in a build without cgo.
type Provider struct{}

// New returns a Provider that explains it cannot work.
func New(Options) (*Provider, error) { return &Provider{}, nil }

func (*Provider) Scheme() string                   { return Scheme }
func (*Provider) Algorithms() []backends.Algorithm { return nil }
func (*Provider) Close() error                     { return nil }

// Open always fails: built without PKCS#11 support.
func (*Provider) Open(context.Context, backends.OpenRequest) (backends.Signer, error) {
	return nil, &backends.Error{Kind: backends.ErrUnsupportedAlgorithm, Op: "open", Part: "scheme", Err: ErrNoCgo}
}
