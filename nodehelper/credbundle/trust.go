package credbundle

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrNoServerName: a client config from ClientConfig dialled without a
// server name to check the certificate against.
var ErrNoServerName = errors.New("no server name to verify")

// TrustOptions say where the trust bundle (PEM CERTIFICATE blocks) is.
type TrustOptions struct {
	File string
	// PollInterval is how often Run checks the file; default 1s.
	PollInterval time.Duration
}

// TrustPool holds the certificates of a trust bundle file that another
// process rotates. It is safe for concurrent use.
type TrustPool struct {
	opts    TrustOptions
	current atomic.Pointer[x509.CertPool]

	mu      sync.Mutex
	loadedF fingerprint
}

// NewTrustPool checks opts and fills in defaults; it does no I/O.
func NewTrustPool(opts TrustOptions) (*TrustPool, error) {
	if opts.File == "" {
		return nil, errors.New("credbundle: TrustOptions.File is required")
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = defaultPollInterval
	}
	return &TrustPool{opts: opts}, nil
}

// Pool returns the pool last loaded, or nil before the first load.
func (p *TrustPool) Pool() *x509.CertPool { return p.current.Load() }

// Reload reads the trust file now. A file without certificates (empty, or a
// writer that truncated it) is refused and the current pool stays.
func (p *TrustPool) Reload() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.reloadLocked()
}

func (p *TrustPool) reloadLocked() error {
	f, ferr := stat([]string{p.opts.File})
	b, err := os.ReadFile(p.opts.File)
	if err != nil {
		return fmt.Errorf("reading trust bundle: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return fmt.Errorf("parsing trust bundle %s: %w", p.opts.File, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return fmt.Errorf("reading trust bundle %s: %w", p.opts.File, ErrNoCertificate)
	}
	p.current.Store(pool)
	if ferr == nil {
		p.loadedF = f
	}
	return nil
}

func (p *TrustPool) pool() (*x509.CertPool, error) {
	return loadedOr(&p.current, &p.mu, p.reloadLocked)
}

// Run checks the file every PollInterval until ctx ends and reloads it when
// it changed. A failed reload keeps the current pool; it is logged once and
// tried again when the file changes (or after a minute).
func (p *TrustPool) Run(ctx context.Context) {
	pollChanges(ctx, p.opts.PollInterval, []string{p.opts.File}, &p.mu, &p.loadedF, p.reloadLocked, "trust bundle")
}

// ClientConfig returns a copy of base for a TLS client that verifies the
// server against the current pool at each handshake (tls.Config.RootCAs is
// fixed once set, so the copy turns Go's own verification off and does the
// same checks in VerifyConnection: chain to the pool, server auth, and
// base.ServerName or the dialled name). Do not change InsecureSkipVerify or
// VerifyConnection on the result.
func (p *TrustPool) ClientConfig(base *tls.Config) *tls.Config {
	cfg := &tls.Config{}
	if base != nil {
		cfg = base.Clone()
	}
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = p.verifyServer
	return cfg
}

func (p *TrustPool) verifyServer(cs tls.ConnectionState) error {
	pool, err := p.pool()
	if err != nil {
		return err
	}
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("verifying the server: %w", ErrNoCertificate)
	}
	if cs.ServerName == "" {
		// Go's own verification refuses this too: without a name, any
		// certificate the pool trusts would do.
		return fmt.Errorf("verifying the server: %w", ErrNoServerName)
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err = cs.PeerCertificates[0].Verify(x509.VerifyOptions{
		Roots: pool, Intermediates: inter, DNSName: cs.ServerName,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	})
	if err != nil {
		return fmt.Errorf("verifying the server: %w", err)
	}
	return nil
}

// ServerConfig returns a copy of base for a TLS server whose ClientCAs is
// the current pool at each handshake (through GetConfigForClient). Set
// base.ClientAuth to say whether a client certificate is required.
func (p *TrustPool) ServerConfig(base *tls.Config) *tls.Config {
	cfg := &tls.Config{}
	if base != nil {
		cfg = base.Clone()
	}
	tmpl := cfg.Clone()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool, err := p.pool()
		if err != nil {
			return nil, err
		}
		c := tmpl.Clone()
		c.ClientCAs = pool
		return c, nil
	}
	return cfg
}
