package tokenservice

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// certReloader serves the TLS certificate and key files, read again when
// either file's modification time or size changes. A new pair that does
// not load keeps the previous one in use, and is logged once (per change
// of the files). It is safe for concurrent use.
type certReloader struct {
	certFile, keyFile string
	logger            klog.Logger

	mu         sync.Mutex
	cert       *tls.Certificate
	stamp      fileStamp // of the pair in cert
	failed     fileStamp // of the last pair that did not load
	statFailed bool      // the files could not be read last time
}

// fileStamp identifies a version of the two files.
type fileStamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// newCertReloader loads the pair once; it must load.
func newCertReloader(ctx context.Context, certFile, keyFile string) (*certReloader, error) {
	r := &certReloader{certFile: certFile, keyFile: keyFile, logger: klog.FromContext(ctx)}
	st, err := r.statFiles()
	if err != nil {
		return nil, err
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("loading the TLS certificate %s and key %s: %w", certFile, keyFile, err)
	}
	r.cert, r.stamp = &cert, st
	return r, nil
}

func (r *certReloader) statFiles() (fileStamp, error) {
	c, err := os.Stat(r.certFile)
	if err != nil {
		return fileStamp{}, fmt.Errorf("reading the TLS certificate file: %w", err)
	}
	k, err := os.Stat(r.keyFile)
	if err != nil {
		return fileStamp{}, fmt.Errorf("reading the TLS key file: %w", err)
	}
	return fileStamp{certMod: c.ModTime(), keyMod: k.ModTime(), certSize: c.Size(), keySize: k.Size()}, nil
}

// GetCertificate is tls.Config.GetCertificate.
func (r *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.statFiles()
	if err != nil {
		if !r.statFailed {
			r.statFailed = true
			r.logger.Error(err, "Keeping the TLS certificate in use (logged once until the files are back)", "certFile", r.certFile, "keyFile", r.keyFile)
		}
		return r.cert, nil
	}
	r.statFailed = false
	if st == r.stamp || st == r.failed {
		return r.cert, nil
	}
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		r.failed = st
		r.logger.Error(err, "The changed TLS certificate or key does not load; keeping the one in use (logged once per change)", "certFile", r.certFile, "keyFile", r.keyFile)
		return r.cert, nil
	}
	r.cert, r.stamp, r.failed = &cert, st, fileStamp{}
	r.logger.Info("Loaded the changed TLS certificate", "certFile", r.certFile, "notAfter", leafNotAfter(&cert))
	return r.cert, nil
}

func leafNotAfter(c *tls.Certificate) string {
	if c.Leaf == nil {
		return ""
	}
	return c.Leaf.NotAfter.UTC().Format(time.RFC3339)
}
