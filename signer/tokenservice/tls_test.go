package tokenservice

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

// writePair writes a fresh self-signed serving certificate for cn and its
// key to the two files, and returns the certificate.
func writePair(t *testing.T, certFile, keyFile, cn string) *x509.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, DNSNames: []string{"localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

// servedCN connects to addr and returns the served certificate's CN.
func servedCN(t *testing.T, addr string) string {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // the test reads the served certificate
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
}

func TestTheTLSPairIsReloadedWhenItsFilesChange(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair(t, certFile, keyFile, "first")
	var mu sync.Mutex
	var logged []string
	ctx := klog.NewContext(t.Context(), funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		logged = append(logged, args)
	}, funcr.Options{}))
	certs, err := newCertReloader(ctx, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	addr, stop, err := serveTLS(ctx, "127.0.0.1:0", http.NotFoundHandler(), certs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if cn := servedCN(t, addr); cn != "first" {
		t.Fatalf("served %q, want first", cn)
	}

	// A rotated pair is served from the next handshake.
	writePair(t, certFile, keyFile, "second")
	if cn := servedCN(t, addr); cn != "second" {
		t.Fatalf("after rotation served %q, want second", cn)
	}

	// A broken new certificate keeps the pair in use, logged once.
	if err := os.WriteFile(certFile, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if cn := servedCN(t, addr); cn != "second" {
			t.Fatalf("with a broken certificate file served %q, want second", cn)
		}
	}
	mu.Lock()
	var errs int
	for _, l := range logged {
		if strings.Contains(l, "does not load") {
			errs++
		}
	}
	mu.Unlock()
	if errs != 1 {
		t.Errorf("the broken pair was logged %d times, want once: %q", errs, logged)
	}

	// Mended: the new pair is served.
	writePair(t, certFile, keyFile, "third")
	if cn := servedCN(t, addr); cn != "third" {
		t.Fatalf("after mending served %q, want third", cn)
	}
}

func TestAHugeAuthorizationHeaderIsRefusedBeforeTheHandler(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair(t, certFile, keyFile, "localhost")
	certs, err := newCertReloader(t.Context(), certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, nil)
	addr, stop, err := serveTLS(t.Context(), "127.0.0.1:0", f.handler, certs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // test server
	req, err := http.NewRequest(http.MethodGet, "https://"+addr+"/token?service="+testService, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+strings.Repeat("a", 200<<10))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("status %d, want 431: %s", resp.StatusCode, body)
	}
	if n := f.reviewer.calls.Load(); n != 0 {
		t.Errorf("the reviewer was asked %d times", n)
	}
}

// TestFailedTLSHandshakesAreLoggedOnceAtDefaultVerbosity: a plugin with
// the wrong --ca-file fails the handshake on every pull; the token service
// logs the first failure through its logger at the default verbosity and
// the rest at -v=2, never through the standard library's log package
// (which would be one unstructured line per pull).
func TestFailedTLSHandshakesAreLoggedOnceAtDefaultVerbosity(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writePair(t, certFile, keyFile, "localhost")
	var std strings.Builder
	var stdMu sync.Mutex
	log.SetOutput(writerFunc(func(p []byte) (int, error) { stdMu.Lock(); defer stdMu.Unlock(); return std.Write(p) }))
	t.Cleanup(func() { log.SetOutput(os.Stderr) })
	var mu sync.Mutex
	var lines []string
	ctx := klog.NewContext(t.Context(), funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, args)
	}, funcr.Options{Verbosity: 2}))
	certs, err := newCertReloader(ctx, certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	addr, stop, err := serveTLS(ctx, "127.0.0.1:0", http.NotFoundHandler(), certs)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	const attempts = 5
	for range attempts {
		// The system roots do not hold the test certificate: the client
		// aborts the handshake, as the plugin with a wrong --ca-file does.
		if conn, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "localhost"}); err == nil {
			conn.Close()
			t.Fatal("handshake succeeded, want it refused by the client")
		}
	}
	handshakeLines := func() (all, v0 int) {
		mu.Lock()
		defer mu.Unlock()
		for _, l := range lines {
			if strings.Contains(l, "TLS handshake") {
				all++
				if strings.Contains(l, `"level"=0`) {
					v0++
				}
			}
		}
		return all, v0
	}
	deadline := time.Now().Add(30 * time.Second)
	for all, _ := handshakeLines(); all < attempts; all, _ = handshakeLines() {
		if time.Now().After(deadline) {
			stdMu.Lock()
			t.Fatalf("logged %d failed handshakes through the logger, want %d; standard log got:\n%s", all, attempts, std.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, v0 := handshakeLines(); v0 != 1 {
		t.Errorf("%d failed handshakes logged at the default verbosity, want 1 (lines %q)", v0, lines)
	}
	stdMu.Lock()
	defer stdMu.Unlock()
	if std.Len() != 0 {
		t.Errorf("the standard log package got %q, want nothing", std.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
