// Package credbundle lets a workload use a credential bundle that another
// process rotates on disk (keyward's node helper, kubelet's podCertificate
// volumes): it loads the key and chain, checks that they agree, reloads them
// when the files change, and hands the current pair to crypto/tls through
// GetCertificate and GetClientCertificate. TrustPool does the same for a
// trust bundle file.
package credbundle

import (
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/nodehelper/atomicdir"
)

var (
	// ErrKeyMismatch: the private key is not the key of the leaf
	// certificate, still so after every re-read.
	ErrKeyMismatch = errors.New("private key does not match the leaf certificate")
	// ErrNoKey: the bundle or key file holds no private key, or the bundle
	// does not start with it.
	ErrNoKey = errors.New("no private key")
	// ErrNoCertificate: no certificate follows the key, or the chain file
	// holds none.
	ErrNoCertificate = errors.New("no certificate")
)

const (
	defaultPollInterval = time.Second
	defaultReadAttempts = 10
	defaultRetryDelay   = 50 * time.Millisecond
)

// Options say where the bundle is and how often to look at it.
type Options struct {
	// BundleFile is a KEP-4317 credential bundle: one PRIVATE KEY PEM block
	// first, then the certificate chain, leaf first. Set it, or KeyFile and
	// ChainFile.
	BundleFile string
	// KeyFile and ChainFile hold the key and the chain (leaf first) apart.
	KeyFile, ChainFile string
	// PollInterval is how often Run checks the files for a change; default 1s.
	PollInterval time.Duration
	// ReadAttempts bounds how often one load re-reads the files while they
	// disagree (a rotation in progress); default 10, RetryDelay (default
	// 50ms) apart.
	ReadAttempts int
	RetryDelay   time.Duration
}

// Credential holds the current certificate of a rotating bundle. It is safe
// for concurrent use.
type Credential struct {
	opts    Options
	current atomic.Pointer[tls.Certificate]

	mu      sync.Mutex // serialises loads
	loadedF fingerprint

	// afterAttempt, when set by a test, runs after each failed read attempt.
	afterAttempt func(attempt int)
}

// New checks opts and fills in defaults; it does no I/O. Call Reload (or let
// the first handshake do it) and Run to follow rotations.
func New(opts Options) (*Credential, error) {
	switch {
	case opts.BundleFile != "" && (opts.KeyFile != "" || opts.ChainFile != ""):
		return nil, errors.New("credbundle: set BundleFile or KeyFile and ChainFile, not both")
	case opts.BundleFile == "" && (opts.KeyFile == "" || opts.ChainFile == ""):
		return nil, errors.New("credbundle: set BundleFile, or both KeyFile and ChainFile")
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = defaultPollInterval
	}
	if opts.ReadAttempts <= 0 {
		opts.ReadAttempts = defaultReadAttempts
	}
	if opts.RetryDelay <= 0 {
		opts.RetryDelay = defaultRetryDelay
	}
	return &Credential{opts: opts}, nil
}

func (c *Credential) paths() []string {
	if c.opts.BundleFile != "" {
		return []string{c.opts.BundleFile}
	}
	return []string{c.opts.KeyFile, c.opts.ChainFile}
}

// Current returns the certificate last loaded, or nil before the first load.
func (c *Credential) Current() *tls.Certificate { return c.current.Load() }

// Reload reads the bundle now and, when key and leaf agree, makes it current.
// While they disagree it re-reads up to ReadAttempts times; on an error the
// current certificate stays.
func (c *Credential) Reload() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reloadLocked()
}

func (c *Credential) reloadLocked() error {
	var lastErr error
	for attempt := 1; attempt <= c.opts.ReadAttempts; attempt++ {
		f, ferr := stat(c.paths())
		cert, err := c.read()
		if err == nil {
			c.current.Store(cert)
			if ferr == nil {
				c.loadedF = f
			}
			return nil
		}
		lastErr = err
		// Only a mismatch or a missing part can be a rotation in progress;
		// anything else will not mend by itself within a load.
		if !errors.Is(err, ErrKeyMismatch) && !errors.Is(err, ErrNoKey) && !errors.Is(err, ErrNoCertificate) && !errors.Is(err, os.ErrNotExist) {
			break
		}
		if c.afterAttempt != nil {
			c.afterAttempt(attempt)
		}
		if attempt < c.opts.ReadAttempts {
			time.Sleep(c.opts.RetryDelay)
		}
	}
	return fmt.Errorf("loading credential bundle %v: %w", c.paths(), lastErr)
}

func (c *Credential) read() (*tls.Certificate, error) {
	if c.opts.BundleFile != "" {
		b, err := os.ReadFile(c.opts.BundleFile)
		if err != nil {
			return nil, fmt.Errorf("reading bundle: %w", err)
		}
		block, rest := pem.Decode(b)
		if block == nil || block.Type != "PRIVATE KEY" {
			return nil, fmt.Errorf("reading bundle %s: the first PEM block is not a PRIVATE KEY: %w", c.opts.BundleFile, ErrNoKey)
		}
		return pair(block, rest)
	}
	kb, cb, err := c.readPair()
	if err != nil {
		return nil, err
	}
	var keyBlock *pem.Block
	for rest := kb; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type == "PRIVATE KEY" || block.Type == "EC PRIVATE KEY" || block.Type == "RSA PRIVATE KEY" {
			keyBlock = block
			break
		}
	}
	if keyBlock == nil {
		return nil, fmt.Errorf("reading key %s: %w", c.opts.KeyFile, ErrNoKey)
	}
	return pair(keyBlock, cb)
}

// readPair reads the key and chain files. When both are names in one
// atomicdir directory it reads them through one ..data snapshot; otherwise
// one after the other, and the key check in pair catches a torn read.
func (c *Credential) readPair() (key, chain []byte, err error) {
	dir := filepath.Dir(c.opts.KeyFile)
	if filepath.Dir(c.opts.ChainFile) == dir {
		if _, lerr := os.Lstat(filepath.Join(dir, atomicdir.DataLink)); lerr == nil {
			kn, cn := filepath.Base(c.opts.KeyFile), filepath.Base(c.opts.ChainFile)
			files, err := atomicdir.Read(dir, kn, cn)
			if err != nil {
				return nil, nil, fmt.Errorf("reading key and chain: %w", err)
			}
			return files[kn], files[cn], nil
		}
	}
	if key, err = os.ReadFile(c.opts.KeyFile); err != nil {
		return nil, nil, fmt.Errorf("reading key: %w", err)
	}
	if chain, err = os.ReadFile(c.opts.ChainFile); err != nil {
		return nil, nil, fmt.Errorf("reading chain: %w", err)
	}
	return key, chain, nil
}

// pair parses the key block and the certificates in chainPEM and checks
// that the key is the leaf's.
func pair(keyBlock *pem.Block, chainPEM []byte) (*tls.Certificate, error) {
	key, err := parseKey(keyBlock)
	if err != nil {
		return nil, err
	}
	var ders [][]byte
	for rest := chainPEM; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type == "CERTIFICATE" {
			ders = append(ders, block.Bytes)
		}
	}
	if len(ders) == 0 {
		return nil, fmt.Errorf("reading chain: %w", ErrNoCertificate)
	}
	leaf, err := x509.ParseCertificate(ders[0])
	if err != nil {
		return nil, fmt.Errorf("parsing leaf certificate: %w", err)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(leaf.PublicKey) {
		return nil, fmt.Errorf("checking leaf %q: %w", leaf.Subject, ErrKeyMismatch)
	}
	return &tls.Certificate{Certificate: ders, PrivateKey: key, Leaf: leaf}, nil
}

func parseKey(block *pem.Block) (crypto.Signer, error) {
	var (
		k   any
		err error
	)
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", block.Type, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("parsing %s: a %T is not a signing key: %w", block.Type, k, ErrNoKey)
	}
	return s, nil
}

// GetCertificate is a tls.Config.GetCertificate hook serving the current
// certificate; the first call loads it if nothing has yet.
func (c *Credential) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.get()
}

// GetClientCertificate is a tls.Config.GetClientCertificate hook presenting
// the current certificate; the first call loads it if nothing has yet.
func (c *Credential) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.get()
}

func (c *Credential) get() (*tls.Certificate, error) {
	return loadedOr(&c.current, &c.mu, c.reloadLocked)
}

// Run checks the files every PollInterval until ctx ends and reloads them
// when they changed. A failed reload keeps the current certificate; it is
// logged once and tried again when the files change (or after a minute).
func (c *Credential) Run(ctx context.Context) {
	pollChanges(ctx, c.opts.PollInterval, c.paths(), &c.mu, &c.loadedF, c.reloadLocked, "credential bundle")
}

// fingerprint identifies the files a load read: a rename or an atomicdir
// swap gives a new inode, an in-place write a new size or mtime.
type fingerprint [2]fileID

type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64
}

func stat(paths []string) (fingerprint, error) {
	var f fingerprint
	for i, p := range paths {
		st, err := os.Stat(p) // follows the <name> -> ..data/<name> links
		if err != nil {
			return f, fmt.Errorf("checking %s: %w", p, err)
		}
		f[i] = fileIDOf(st)
	}
	return f, nil
}
