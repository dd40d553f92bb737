package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"slices"
	"time"
)

// tlsMaterial loads the files for one handshake: the key must be the leaf's.
func tlsMaterial(f files) (*material, tls.Certificate, error) {
	m, _, err := load(f)
	if err != nil {
		return nil, tls.Certificate{}, err
	}
	if err := m.keyMatches(); err != nil {
		return nil, tls.Certificate{}, err
	}
	cert := tls.Certificate{PrivateKey: m.key, Leaf: m.chain[0]}
	for _, c := range m.chain {
		cert.Certificate = append(cert.Certificate, c.Raw)
	}
	return m, cert, nil
}

// verifyPeer checks the peer's chain against roots (any EKU, as verify
// does) and, if name is set, that the leaf is for name: a DNS name or IP
// address (crypto/x509's VerifyHostname) or, for a name with "://", one of
// its URI SANs (a SPIFFE ID).
func verifyPeer(roots []*x509.Certificate, name string) func(tls.ConnectionState) error {
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		if _, err := verifyChain(cs.PeerCertificates, roots, time.Now()); err != nil {
			return fmt.Errorf("verifying the peer's certificate (serial %s, issuer %q) against the trust bundle: %w",
				serial(cs.PeerCertificates[0]), cs.PeerCertificates[0].Issuer.String(), err)
		}
		if name == "" {
			return nil
		}
		leaf := cs.PeerCertificates[0]
		if slices.ContainsFunc(leaf.URIs, func(u *url.URL) bool { return u.String() == name }) {
			return nil
		}
		return leaf.VerifyHostname(name)
	}
}

type serverLine struct {
	ServerSerial string `json:"serverSerial"`
}

type acceptedEvent struct {
	Event       string `json:"event"`
	PeerSerial  string `json:"peerSerial"`
	PeerIssuer  string `json:"peerIssuer"`
	PeerSubject string `json:"peerSubject"`
	OwnSerial   string `json:"ownSerial"`
}

type failedEvent struct {
	Event string `json:"event"`
	Error string `json:"error"`
}

// serveCommand runs mtls-serve until ctx ends.
func serveCommand(ctx context.Context, args []string, out *printer, stderr io.Writer) error {
	fs := flag.NewFlagSet("mtls-serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f files
	f.register(fs)
	listen := fs.String("listen", ":8443", "address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	return serve(ctx, ln, f, out)
}

// serve accepts connections on ln until ctx ends, then closes ln. Each
// handshake reads the files afresh (GetConfigForClient), so a rotated
// credential or trust bundle counts from the next connection on.
func serve(ctx context.Context, ln net.Listener, f files, out *printer) error {
	out.print(map[string]string{"event": "listening", "addr": ln.Addr().String()})
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("accepting: %w", err)
		}
		go serveConn(ctx, conn, f, out)
	}
}

func serveConn(ctx context.Context, conn net.Conn, f files, out *printer) {
	defer conn.Close()
	var own *x509.Certificate // the leaf this handshake presents
	tc := tls.Server(conn, &tls.Config{
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m, cert, err := tlsMaterial(f)
			if err != nil {
				return nil, err
			}
			own = m.chain[0]
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{cert},
				// The chain is checked by VerifyConnection, for any EKU.
				ClientAuth:       tls.RequireAnyClientCert,
				VerifyConnection: verifyPeer(m.roots, ""),
			}, nil
		},
	})
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		out.print(failedEvent{Event: "handshake-failed", Error: err.Error()})
		return
	}
	peer := tc.ConnectionState().PeerCertificates[0]
	out.print(acceptedEvent{Event: "accepted", PeerSerial: serial(peer), PeerIssuer: peer.Issuer.String(),
		PeerSubject: peer.Subject.String(), OwnSerial: serial(own)})
	b, _ := json.Marshal(serverLine{ServerSerial: serial(own)})
	tc.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := tc.Write(append(b, '\n')); err == nil {
		tc.Close() // sends close_notify
	}
}

type dialedEvent struct {
	Event        string `json:"event"`
	OK           bool   `json:"ok"`
	ServerSerial string `json:"serverSerial"`
	ServerIssuer string `json:"serverIssuer"`
	OwnSerial    string `json:"ownSerial"`
	OwnIssuer    string `json:"ownIssuer"`
}

// dialCommand runs mtls-dial until ctx ends.
func dialCommand(ctx context.Context, args []string, out *printer, stderr io.Writer) error {
	fs := flag.NewFlagSet("mtls-dial", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var f files
	f.register(fs)
	addr := fs.String("addr", "", "host:port of an mtls-serve")
	serverName := fs.String("server-name", "", "the name the server's leaf must carry (DNS name, IP or URI SAN) and the SNI sent; empty: check the chain only")
	interval := fs.Duration("interval", 500*time.Millisecond, "time between connections")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	if *addr == "" {
		return errors.New("--addr is required")
	}
	if *interval <= 0 {
		return errors.New("--interval must be positive")
	}
	t := time.NewTicker(*interval)
	defer t.Stop()
	for {
		out.print(dialOnce(ctx, *addr, *serverName, f))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// dialOnce reads the files, connects, handshakes and reads the server's
// line; it returns a dialedEvent or a failedEvent.
func dialOnce(ctx context.Context, addr, serverName string, f files) any {
	fail := func(err error) any { return failedEvent{Event: "dial-failed", Error: err.Error()} }
	m, cert, err := tlsMaterial(f)
	if err != nil {
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{
		MinVersion:   tls.VersionTLS12,
		ServerName:   serverName,
		Certificates: []tls.Certificate{cert},
		// crypto/tls's own check wants the serverAuth EKU and a name;
		// VerifyConnection checks the chain for any EKU, and the name if
		// one is given.
		InsecureSkipVerify: true,
		VerifyConnection:   verifyPeer(m.roots, serverName),
	}}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fail(err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	peer := conn.(*tls.Conn).ConnectionState().PeerCertificates[0]
	line, err := bufio.NewReader(conn).ReadBytes('\n')
	if err != nil {
		return fail(fmt.Errorf("reading the server's line: %w", err))
	}
	var sl serverLine
	if err := json.Unmarshal(line, &sl); err != nil {
		return fail(fmt.Errorf("the server's line %q: %w", line, err))
	}
	if sl.ServerSerial != serial(peer) {
		return fail(fmt.Errorf("the server says it presented serial %s, but its handshake presented %s", sl.ServerSerial, serial(peer)))
	}
	return dialedEvent{Event: "dialed", OK: true, ServerSerial: serial(peer), ServerIssuer: peer.Issuer.String(),
		OwnSerial: serial(m.chain[0]), OwnIssuer: m.chain[0].Issuer.String()}
}
