package credbundle

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/connrotation"
)

// RESTConfig returns a rest.Config for host that authenticates with cred's
// current certificate on each new TLS connection and verifies the server
// against caPEM. When cred's certificate changes (after cred.Run or Reload
// loaded a rotated bundle), the next request starts a new connection pool,
// so it and every later request handshake again with the new certificate,
// and closes the connections made with the old one (in-flight requests on
// them, such as watches, end). It starts nothing: run cred.Run to follow the files.
//
// This is the analog of KEP-4317's rest.InClusterPodCertificateConfig for a
// bundle the node helper (or a podCertificate volume) rotates on disk.
func RESTConfig(host string, caPEM []byte, cred *Credential) (*rest.Config, error) {
	if host == "" {
		return nil, errors.New("building a client config: host is empty")
	}
	if cred == nil {
		return nil, errors.New("building a client config for " + host + ": no credential")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("building a client config for %s: the CA bundle holds no PEM certificate: %w", host, ErrNoCertificate)
	}
	rt := &rotatingTransport{cred: cred, roots: roots}
	rt.cur.Store(rt.newGeneration())
	// rest.Config refuses TLS options beside a custom Transport: the
	// transport carries them all.
	return &rest.Config{Host: host, Transport: rt}, nil
}

// rotatingTransport is an http.RoundTripper that presents cred's current
// certificate, and starts a new connection pool once it changes.
type rotatingTransport struct {
	cred  *Credential
	roots *x509.CertPool
	mu    sync.Mutex // serialises replacing cur
	cur   atomic.Pointer[generation]
}

// generation is one connection pool and the certificate its newest
// handshake presented.
type generation struct {
	base      *http.Transport
	dialer    *connrotation.Dialer
	presented atomic.Pointer[tls.Certificate]
}

func (t *rotatingTransport) newGeneration() *generation {
	g := &generation{}
	// connrotation tracks every connection it dials so that all of them,
	// busy ones too (an HTTP/2 connection carrying a watch is never idle),
	// can be closed at once, as kubelet's client-certificate transport does.
	g.dialer = connrotation.NewDialer((&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext)
	g.base = utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         g.dialer.DialContext,
		TLSHandshakeTimeout: 10 * time.Second,
		MaxIdleConnsPerHost: 25,
		// No ClientSessionCache: a resumed session would keep the identity
		// of the certificate its first handshake presented.
		TLSClientConfig: &tls.Config{
			MinVersion: tls.VersionTLS12,
			RootCAs:    t.roots,
			GetClientCertificate: func(info *tls.CertificateRequestInfo) (*tls.Certificate, error) {
				cert, err := t.cred.GetClientCertificate(info)
				if err != nil {
					return nil, err
				}
				g.presented.Store(cert)
				return cert, nil
			},
		},
	})
	return g
}

// RoundTrip sends req through the current pool. When cred no longer holds
// the certificate that pool's connections presented, new requests go to a
// fresh pool (closing connections under a live HTTP/2 pool would race with
// requests it hands them to) and the old pool's connections are closed:
// requests still in flight on them, such as watches, end and are retried
// by their callers with the new certificate.
func (t *rotatingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	g := t.cur.Load()
	if cur, p := t.cred.Current(), g.presented.Load(); cur != nil && p != nil && cur != p && !sameLeaf(cur, p) {
		t.mu.Lock()
		if t.cur.Load() == g {
			t.cur.Store(t.newGeneration())
			g.base.CloseIdleConnections()
			g.dialer.CloseAll()
		}
		g = t.cur.Load()
		t.mu.Unlock()
	}
	return g.base.RoundTrip(req)
}

// CloseIdleConnections lets http.Client.CloseIdleConnections reach the
// current pool.
func (t *rotatingTransport) CloseIdleConnections() { t.cur.Load().base.CloseIdleConnections() }

func sameLeaf(a, b *tls.Certificate) bool {
	return len(a.Certificate) > 0 && len(b.Certificate) > 0 && bytes.Equal(a.Certificate[0], b.Certificate[0])
}
