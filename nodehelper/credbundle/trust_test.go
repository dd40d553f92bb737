package credbundle

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/atomicdir"
)

// serve accepts TLS connections on cfg until the listener closes, writing
// "ok" after each handshake.
func serve(t *testing.T, cfg *tls.Config) net.Listener {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if conn.(*tls.Conn).Handshake() == nil {
					_, _ = conn.Write([]byte("ok"))
				}
			}()
		}
	}()
	return ln
}

// dial handshakes and reads the server's "ok" (a server-side refusal of the
// client certificate shows up at that read under TLS 1.3).
func dial(addr string, cfg *tls.Config) error {
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = io.ReadAll(conn)
	return err
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A client built by ClientConfig follows the trust file: after it names
// only another CA, the same server is refused.
func TestTrustPoolClientFollowsTheFile(t *testing.T) {
	ca1, ca2 := newTestCA(t, "ca1"), newTestCA(t, "ca2")
	dir := t.TempDir()
	k, c := ca1.issue(t, 1)
	writeFile(t, filepath.Join(dir, "server.pem"), bundle(k, c))
	cred, err := New(Options{BundleFile: filepath.Join(dir, "server.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ln := serve(t, &tls.Config{GetCertificate: cred.GetCertificate})

	trustFile := filepath.Join(dir, "trust.pem")
	writeFile(t, trustFile, append(append([]byte{}, ca1.pem...), ca2.pem...))
	trust, err := NewTrustPool(TrustOptions{File: trustFile})
	if err != nil {
		t.Fatal(err)
	}
	client := trust.ClientConfig(&tls.Config{ServerName: "localhost"})
	if err := dial(ln.Addr().String(), client); err != nil {
		t.Fatalf("with ca1 trusted: %v", err)
	}

	t.Run("another server name is refused", func(t *testing.T) {
		err := dial(ln.Addr().String(), trust.ClientConfig(&tls.Config{ServerName: "elsewhere.example"}))
		var hostErr x509.HostnameError
		if !errors.As(err, &hostErr) {
			t.Errorf("dial = %v, want a HostnameError", err)
		}
	})
	t.Run("no server name is refused", func(t *testing.T) {
		// tls.Dial would fill ServerName in from the address; tls.Client
		// on a raw connection leaves it empty.
		raw, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer raw.Close()
		err = tls.Client(raw, trust.ClientConfig(nil)).Handshake()
		if !errors.Is(err, ErrNoServerName) {
			t.Errorf("handshake = %v, want ErrNoServerName", err)
		}
	})
	t.Run("an empty trust file is refused and the pool kept", func(t *testing.T) {
		writeFile(t, trustFile, nil)
		if err := trust.Reload(); !errors.Is(err, ErrNoCertificate) {
			t.Fatalf("Reload = %v, want ErrNoCertificate", err)
		}
		if err := dial(ln.Addr().String(), client); err != nil {
			t.Errorf("after a refused empty file: %v", err)
		}
	})
	t.Run("after the file names only ca2 the server is refused", func(t *testing.T) {
		writeFile(t, trustFile, ca2.pem)
		if err := trust.Reload(); err != nil {
			t.Fatal(err)
		}
		err := dial(ln.Addr().String(), client)
		var unknown x509.UnknownAuthorityError
		if !errors.As(err, &unknown) {
			t.Errorf("dial = %v, want an UnknownAuthorityError", err)
		}
	})
}

// A server built by ServerConfig checks client certificates against the
// current pool.
func TestTrustPoolServerFollowsTheFile(t *testing.T) {
	ca1, ca2 := newTestCA(t, "ca1"), newTestCA(t, "ca2")
	dir := t.TempDir()
	sk, sc := ca1.issue(t, 0)
	writeFile(t, filepath.Join(dir, "server.pem"), bundle(sk, sc))
	server, err := New(Options{BundleFile: filepath.Join(dir, "server.pem")})
	if err != nil {
		t.Fatal(err)
	}
	ck, cc := ca1.issue(t, 1)
	writeFile(t, filepath.Join(dir, "client.pem"), bundle(ck, cc))
	clientCred, err := New(Options{BundleFile: filepath.Join(dir, "client.pem")})
	if err != nil {
		t.Fatal(err)
	}
	trustFile := filepath.Join(dir, "clients.pem")
	writeFile(t, trustFile, ca1.pem)
	trust, err := NewTrustPool(TrustOptions{File: trustFile})
	if err != nil {
		t.Fatal(err)
	}
	ln := serve(t, trust.ServerConfig(&tls.Config{GetCertificate: server.GetCertificate, ClientAuth: tls.RequireAndVerifyClientCert}))
	roots := x509.NewCertPool()
	roots.AddCert(ca1.cert)
	client := &tls.Config{RootCAs: roots, ServerName: "localhost", GetClientCertificate: clientCred.GetClientCertificate}
	if err := dial(ln.Addr().String(), client); err != nil {
		t.Fatalf("with ca1 trusted for clients: %v", err)
	}
	writeFile(t, trustFile, ca2.pem)
	if err := trust.Reload(); err != nil {
		t.Fatal(err)
	}
	// The refusal reaches the client as a TLS alert, which crypto/tls
	// reports as an unexported type: only its presence is checked.
	if err := dial(ln.Addr().String(), client); err == nil {
		t.Errorf("a client certificate from ca1 was accepted after the trust file named only ca2")
	}
}

// Run picks up a trust file that atomicdir replaced.
func TestTrustPoolRunReloadsAChangedFile(t *testing.T) {
	ca1, ca2 := newTestCA(t, "ca1"), newTestCA(t, "ca2")
	dir := t.TempDir()
	keep := atomicdir.Options{UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner}
	if err := atomicdir.Write(dir, map[string]atomicdir.File{"ca.pem": {Data: ca1.pem}}, keep); err != nil {
		t.Fatal(err)
	}
	trust, err := NewTrustPool(TrustOptions{File: filepath.Join(dir, "ca.pem"), PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := trust.Reload(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go trust.Run(ctx)
	if err := atomicdir.Write(dir, map[string]atomicdir.File{"ca.pem": {Data: ca2.pem}}, keep); err != nil {
		t.Fatal(err)
	}
	want := x509.NewCertPool()
	want.AddCert(ca2.cert)
	// A generous bound: a slow machine only makes the test slower.
	for deadline := time.Now().Add(30 * time.Second); !trust.Pool().Equal(want); {
		if time.Now().After(deadline) {
			t.Fatal("Run never loaded the changed trust file")
		}
		time.Sleep(2 * time.Millisecond)
	}
}
