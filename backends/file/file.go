// Package file is the reference key backend: a PEM private key on disk
// (PKCS#8, SEC 1 "EC PRIVATE KEY" or PKCS#1 "RSA PRIVATE KEY").
//
//	file:/etc/keyward/ca.key
//	file:/etc/keyward/ca.key?algorithm=rsa-3072-pss-sha256
//
// An RSA key signs with PKCS#1 v1.5 and SHA-256 unless the algorithm
// attribute says otherwise; ECDSA keys use their curve's hash.
package file

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
)

// Scheme is the URI scheme of this backend.
const Scheme = "file"

// Provider opens PEM key files.
type Provider struct{}

// New returns the file provider.
func New() *Provider { return &Provider{} }

var _ backends.KeyCreator = (*Provider)(nil)

func (*Provider) Scheme() string { return Scheme }

// Algorithms: every algorithm keyward knows.
func (*Provider) Algorithms() []backends.Algorithm { return backends.AllAlgorithms() }

func (*Provider) Close() error { return nil }

type location struct {
	path string
	alg  backends.Algorithm // empty: the key's default
}

func parse(op, raw string) (location, error) {
	u, err := uri.Parse(raw)
	if err != nil || u.Scheme != Scheme {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, "scheme", "want file:/path/to/key.pem")
	}
	if unknown := u.Unknown("algorithm"); len(unknown) > 0 {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, unknown[0], "unknown attribute (file: URIs take only algorithm=)")
	}
	p := strings.TrimPrefix(u.Opaque, "//")
	if p == "" {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, "path", "empty path")
	}
	loc := location{path: filepath.Clean(p)}
	if a := u.Query["algorithm"]; a != "" {
		loc.alg, err = backends.ParseAlgorithm(a)
		if err != nil {
			return location{}, backends.Wrap(backends.ErrUnsupportedAlgorithm, op, raw, "algorithm", err)
		}
	}
	return loc, nil
}

func (l location) uri() string {
	s := Scheme + ":" + l.path
	if l.alg != "" {
		s += "?algorithm=" + string(l.alg)
	}
	return s
}

// Open reads and parses the key file.
func (p *Provider) Open(ctx context.Context, req backends.OpenRequest) (backends.Signer, error) {
	loc, err := parse("open", req.URI)
	if err != nil {
		return nil, err
	}
	data, err := os.ReadFile(loc.path)
	if err != nil {
		kind := backends.ErrPermanent
		if errors.Is(err, fs.ErrNotExist) {
			kind = backends.ErrNotFound
		}
		return nil, backends.Wrap(kind, "open", loc.uri(), "path", err)
	}
	key, err := parsePrivateKey(data)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, "open", loc.uri(), "path", err)
	}
	return newSigner(key, loc)
}

func newSigner(key crypto.Signer, loc location) (*Signer, error) {
	alg := loc.alg
	if alg == "" {
		var err error
		if alg, err = backends.DefaultAlgorithm(key.Public()); err != nil {
			return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "open", loc.uri(), "path", err)
		}
	}
	info, err := backends.NewKeyInfo(key.Public(), alg, "", loc.uri())
	if err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "open", loc.uri(), "algorithm", err)
	}
	return &Signer{KeyInfo: info, key: key, path: loc.path}, nil
}

// CreateKey generates a key of req.Algorithm and writes it, mode 0600, to the
// URI's path, which must not exist yet.
func (p *Provider) CreateKey(ctx context.Context, req backends.CreateKeyRequest) (backends.Signer, error) {
	loc, err := parse("create-key", req.URI)
	if err != nil {
		return nil, err
	}
	if !req.Algorithm.Known() {
		return nil, backends.Errorf(backends.ErrUnsupportedAlgorithm, "create-key", loc.uri(), "algorithm", "unknown algorithm %q", req.Algorithm)
	}
	key, err := backends.GenerateKey(req.Algorithm)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, "create-key", loc.uri(), "algorithm", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, "create-key", loc.uri(), "", err)
	}
	if def, _ := backends.DefaultAlgorithm(key.Public()); def != req.Algorithm {
		loc.alg = req.Algorithm
	} else {
		loc.alg = ""
	}
	f, err := os.OpenFile(loc.path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, "create-key", loc.uri(), "path", err)
	}
	werr := pem.Encode(f, &pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		os.Remove(loc.path)
		return nil, backends.Wrap(backends.ErrPermanent, "create-key", loc.uri(), "path", err)
	}
	s, err := newSigner(key, loc)
	if err != nil {
		return nil, err
	}
	s.created = true
	return s, nil
}

// Signer is an in-memory key read from a file.
type Signer struct {
	backends.KeyInfo
	key     crypto.Signer
	path    string
	created bool // by CreateKey: only such a key may be destroyed
}

var _ backends.Destroyer = (*Signer)(nil)

// Destroy removes the key's file (backends.Destroyer).
func (s *Signer) Destroy(context.Context) (string, error) {
	if !s.created {
		return "", backends.NotCreated(s.URI())
	}
	if err := os.Remove(s.path); err != nil {
		return "", backends.Wrap(backends.ErrPermanent, "destroy-key", s.URI(), "path", err)
	}
	return "removed " + s.path, nil
}

// Sign implements crypto.Signer.
func (s *Signer) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return s.SignContext(context.Background(), digest, opts)
}

// SignContext signs with the key in memory.
func (s *Signer) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, backends.Wrap(backends.ErrTransient, "sign", s.URI(), "", err)
	}
	if err := s.Algorithm().CheckOpts(opts); err != nil {
		return nil, backends.Wrap(backends.ErrUnsupportedAlgorithm, "sign", s.URI(), "", err)
	}
	if h := s.Algorithm().Hash(); h != 0 && len(digest) != h.Size() {
		return nil, backends.Errorf(backends.ErrPermanent, "sign", s.URI(), "", "digest is %d bytes, %v digests are %d", len(digest), h, h.Size())
	}
	sig, err := s.key.Sign(rand.Reader, digest, opts)
	if err != nil {
		return nil, backends.Wrap(backends.ErrPermanent, "sign", s.URI(), "", err)
	}
	return sig, nil
}

func (s *Signer) Close() error { return nil }

func parsePrivateKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	if _, encrypted := block.Headers["Proc-Type"]; encrypted {
		return nil, errors.New("encrypted PEM keys are not supported")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key", block.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", block.Type, err)
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey, *rsa.PrivateKey:
		return k.(crypto.Signer), nil
	case ed25519.PrivateKey:
		return k, nil
	default:
		return nil, fmt.Errorf("%w: key of type %T", backends.ErrUnsupportedAlgorithm, key)
	}
}
