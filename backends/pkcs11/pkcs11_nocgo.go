//go:build !cgo

package pkcs11

import (
	"context"
	"errors"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
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

var _ backends.KeyCreator = (*Provider)(nil)

// New returns a Provider that explains it cannot work.
func New(Options) (*Provider, error) { return &Provider{}, nil }

func (*Provider) Scheme() string                   { return Scheme }
func (*Provider) Algorithms() []backends.Algorithm { return nil }
func (*Provider) Close() error                     { return nil }

// Reopens is always 0: no token is ever opened.
func (*Provider) Reopens() uint64 { return 0 }

// Open always fails: built without PKCS#11 support.
func (*Provider) Open(_ context.Context, req backends.OpenRequest) (backends.Signer, error) {
	return nil, noCgo("open", req.URI)
}

// CreateKey always fails: built without PKCS#11 support. It is here so that
// `keyward key create` says so, rather than that pkcs11 cannot create keys.
func (*Provider) CreateKey(_ context.Context, req backends.CreateKeyRequest) (backends.Signer, error) {
	return nil, noCgo("create-key", req.URI)
}

func noCgo(op, raw string) error {
	return &backends.Error{Kind: backends.ErrUnsupportedAlgorithm, Op: op, URI: uri.RedactURI(raw), Part: "scheme", Err: ErrNoCgo}
}
