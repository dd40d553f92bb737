package credbundle

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/nodehelper/atomicdir"
)

// testCA issues leaf certificates for fresh keys.
type testCA struct {
	cert *x509.Certificate
	key  crypto.Signer
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a new key and the chain (leaf, CA) for it as PEM; the leaf
// is named gen-<gen> and valid for localhost.
func (ca *testCA) issue(t *testing.T, gen int) (keyPEM, chainPEM []byte) {
	t.Helper()
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(int64(gen) + 100), Subject: pkix.Name{CommonName: fmt.Sprintf("gen-%d", gen)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err = nodehelper.MarshalPrivateKeyPEM(key)
	if err != nil {
		t.Fatal(err)
	}
	chain := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.pem...)
	return keyPEM, chain
}

func bundle(keyPEM, chainPEM []byte) []byte { return append(append([]byte{}, keyPEM...), chainPEM...) }

func TestLoad(t *testing.T) {
	ca := newTestCA(t, "ca")
	k1, c1 := ca.issue(t, 1)
	k2, _ := ca.issue(t, 2)
	block, _ := pem.Decode(k1)
	k1Key, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	k1SEC1, err := x509.MarshalECPrivateKey(k1Key.(*ecdsa.PrivateKey))
	if err != nil {
		t.Fatal(err)
	}
	k1EC := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: k1SEC1})
	cases := []struct {
		name    string
		files   map[string][]byte
		opts    func(dir string) Options
		wantCN  string
		wantErr error
	}{
		{name: "a single-file bundle with the key first loads",
			files: map[string][]byte{"b.pem": bundle(k1, c1)},
			opts:  func(d string) Options { return Options{BundleFile: filepath.Join(d, "b.pem")} }, wantCN: "gen-1"},
		{name: "a key and chain pair loads",
			files: map[string][]byte{"k.pem": k1, "c.pem": c1},
			opts: func(d string) Options {
				return Options{KeyFile: filepath.Join(d, "k.pem"), ChainFile: filepath.Join(d, "c.pem")}
			}, wantCN: "gen-1"},
		{name: "a key file in SEC 1 form (EC PRIVATE KEY) loads",
			files: map[string][]byte{"k.pem": k1EC, "c.pem": c1},
			opts: func(d string) Options {
				return Options{KeyFile: filepath.Join(d, "k.pem"), ChainFile: filepath.Join(d, "c.pem")}
			}, wantCN: "gen-1"},
		{name: "a bundle with the chain first is refused",
			files: map[string][]byte{"b.pem": bundle(c1, k1)},
			opts:  func(d string) Options { return Options{BundleFile: filepath.Join(d, "b.pem")} }, wantErr: ErrNoKey},
		{name: "a bundle without certificates is refused",
			files: map[string][]byte{"b.pem": k1},
			opts:  func(d string) Options { return Options{BundleFile: filepath.Join(d, "b.pem")} }, wantErr: ErrNoCertificate},
		{name: "a key that is not the leaf's is refused after the re-reads",
			files: map[string][]byte{"k.pem": k2, "c.pem": c1},
			opts: func(d string) Options {
				return Options{KeyFile: filepath.Join(d, "k.pem"), ChainFile: filepath.Join(d, "c.pem"), ReadAttempts: 3, RetryDelay: time.Millisecond}
			}, wantErr: ErrKeyMismatch},
		{name: "a missing file is refused",
			files: map[string][]byte{},
			opts:  func(d string) Options { return Options{BundleFile: filepath.Join(d, "b.pem"), ReadAttempts: 2} }, wantErr: os.ErrNotExist},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, b := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			c, err := New(tc.opts(dir))
			if err != nil {
				t.Fatal(err)
			}
			err = c.Reload()
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Reload = %v, want %v", err, tc.wantErr)
				}
				if c.Current() != nil {
					t.Errorf("a failed first load left a current certificate")
				}
				return
			}
			if err != nil {
				t.Fatalf("Reload: %v", err)
			}
			cert := c.Current()
			if cert.Leaf.Subject.CommonName != tc.wantCN || len(cert.Certificate) != 2 {
				t.Errorf("loaded %q with %d certificates, want %q with 2", cert.Leaf.Subject.CommonName, len(cert.Certificate), tc.wantCN)
			}
		})
	}
}

func TestNewRefusesAmbiguousOptions(t *testing.T) {
	for _, o := range []Options{{}, {BundleFile: "b", KeyFile: "k", ChainFile: "c"}, {KeyFile: "k"}} {
		if _, err := New(o); err == nil {
			t.Errorf("New(%+v) succeeded", o)
		}
	}
}

// Two files written one after the other are briefly out of step; Reload
// re-reads until they agree.
func TestReloadRereadsAPairMidRotation(t *testing.T) {
	ca := newTestCA(t, "ca")
	k1, c1 := ca.issue(t, 1)
	k2, c2 := ca.issue(t, 2)
	dir := t.TempDir()
	keyPath, chainPath := filepath.Join(dir, "k.pem"), filepath.Join(dir, "c.pem")
	write := func(p string, b []byte) {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(keyPath, k1)
	write(chainPath, c1)
	c, err := New(Options{KeyFile: keyPath, ChainFile: chainPath, RetryDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Reload(); err != nil {
		t.Fatal(err)
	}
	// The writer has replaced the key but not yet the chain.
	write(keyPath, k2)
	failed := 0
	c.afterAttempt = func(attempt int) {
		failed++
		if attempt == 2 {
			write(chainPath, c2)
		}
	}
	if err := c.Reload(); err != nil {
		t.Fatalf("Reload: %v", err)
	}
	if got := c.Current().Leaf.Subject.CommonName; got != "gen-2" || failed != 2 {
		t.Errorf("loaded %s after %d failed attempts, want gen-2 after 2", got, failed)
	}
}

// TestTLSAcrossRotations serves TLS with GetCertificate while atomicdir
// replaces the bundle; a real client handshakes without pause and must never
// fail, and must see every generation.
func TestTLSAcrossRotations(t *testing.T) {
	for _, layout := range []string{"single file", "key and chain pair"} {
		t.Run(layout, func(t *testing.T) { testTLSAcrossRotations(t, layout == "single file") })
	}
}

func testTLSAcrossRotations(t *testing.T, single bool) {
	ca := newTestCA(t, "ca")
	dir := t.TempDir()
	writeGen := func(gen int) {
		k, c := ca.issue(t, gen)
		files := map[string]atomicdir.File{"key.pem": {Data: k, Mode: 0o600}, "chain.pem": {Data: c}}
		if single {
			files = map[string]atomicdir.File{"bundle.pem": {Data: bundle(k, c), Mode: 0o600}}
		}
		if err := atomicdir.Write(dir, files, atomicdir.Options{UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner}); err != nil {
			t.Fatal(err)
		}
	}
	writeGen(0)
	opts := Options{KeyFile: filepath.Join(dir, "key.pem"), ChainFile: filepath.Join(dir, "chain.pem"), PollInterval: 5 * time.Millisecond}
	if single {
		opts = Options{BundleFile: filepath.Join(dir, "bundle.pem"), PollInterval: 5 * time.Millisecond}
	}
	cred, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cred.Run(ctx)

	ln := serve(t, &tls.Config{GetCertificate: cred.GetCertificate})

	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	var (
		mu       sync.Mutex
		seen     = map[string]bool{}
		failures []error
		count    int
	)
	stop := make(chan struct{})
	clientDone := make(chan struct{})
	go func() {
		defer close(clientDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{RootCAs: roots, ServerName: "localhost"})
			mu.Lock()
			count++
			if err != nil {
				failures = append(failures, err)
				mu.Unlock()
				continue
			}
			seen[conn.ConnectionState().PeerCertificates[0].Subject.CommonName] = true
			mu.Unlock()
			buf := make([]byte, 2)
			if _, err := conn.Read(buf); err != nil || !bytes.Equal(buf, []byte("ok")) {
				mu.Lock()
				failures = append(failures, fmt.Errorf("reading from server: %v", err))
				mu.Unlock()
			}
			conn.Close()
		}
	}()

	const rotations = 8
	for gen := 1; gen <= rotations; gen++ {
		writeGen(gen)
		// Wait until the client has been served this generation: the
		// bound is generous, a slow machine only makes the test slower.
		want := fmt.Sprintf("gen-%d", gen)
		deadline := time.Now().Add(30 * time.Second)
		for {
			mu.Lock()
			ok := seen[want]
			mu.Unlock()
			if ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the client never saw %s", want)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	close(stop)
	<-clientDone
	mu.Lock()
	defer mu.Unlock()
	for _, err := range failures {
		t.Errorf("handshake failed: %v", err)
	}
	t.Logf("%d handshakes across %d rotations", count, rotations)
}

// TestReaderHammeringAPairNeverSeesAMismatch reloads a key and chain pair
// in a loop while atomicdir replaces it, each time with a new key: every
// load must succeed and hold a key that is its leaf's.
func TestReaderHammeringAPairNeverSeesAMismatch(t *testing.T) {
	ca := newTestCA(t, "ca")
	dir := t.TempDir()
	const rotations = 200
	sets := make([]map[string]atomicdir.File, rotations+1)
	for gen := range sets {
		k, c := ca.issue(t, gen)
		sets[gen] = map[string]atomicdir.File{"key.pem": {Data: k, Mode: 0o600}, "chain.pem": {Data: c}}
	}
	keep := atomicdir.Options{UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner}
	if err := atomicdir.Write(dir, sets[0], keep); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		cred, err := New(Options{KeyFile: filepath.Join(dir, "key.pem"), ChainFile: filepath.Join(dir, "chain.pem"), RetryDelay: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-done:
					return
				default:
				}
				if err := cred.Reload(); err != nil {
					errs <- err
					return
				}
				cert := cred.Current()
				pub := cert.PrivateKey.(crypto.Signer).Public().(interface{ Equal(crypto.PublicKey) bool })
				if !pub.Equal(cert.Leaf.PublicKey) {
					errs <- fmt.Errorf("loaded %s with another key", cert.Leaf.Subject.CommonName)
					return
				}
			}
		}()
	}
	for gen := 1; gen <= rotations; gen++ {
		if err := atomicdir.Write(dir, sets[gen], keep); err != nil {
			t.Fatal(err)
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// A client presenting GetClientCertificate shows the server each rotated
// certificate.
func TestClientCertificateFollowsRotations(t *testing.T) {
	ca := newTestCA(t, "ca")
	dir := t.TempDir()
	keep := atomicdir.Options{UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner}
	writeGen := func(gen int) {
		k, c := ca.issue(t, gen)
		if err := atomicdir.Write(dir, map[string]atomicdir.File{"key.pem": {Data: k, Mode: 0o600}, "chain.pem": {Data: c}}, keep); err != nil {
			t.Fatal(err)
		}
	}
	writeGen(100)
	serverCred, err := New(Options{KeyFile: filepath.Join(dir, "key.pem"), ChainFile: filepath.Join(dir, "chain.pem")})
	if err != nil {
		t.Fatal(err)
	}
	if err := serverCred.Reload(); err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	seen := make(chan string, 1)
	ln := serve(t, &tls.Config{
		Certificates: []tls.Certificate{*serverCred.Current()},
		ClientAuth:   tls.RequireAndVerifyClientCert, ClientCAs: roots,
		VerifyConnection: func(cs tls.ConnectionState) error {
			seen <- cs.PeerCertificates[0].Subject.CommonName
			return nil
		},
	})
	clientDir := t.TempDir()
	cred, err := New(Options{BundleFile: filepath.Join(clientDir, "bundle.pem")})
	if err != nil {
		t.Fatal(err)
	}
	client := &tls.Config{RootCAs: roots, ServerName: "localhost", GetClientCertificate: cred.GetClientCertificate}
	for gen := 1; gen <= 3; gen++ {
		k, c := ca.issue(t, gen)
		if err := atomicdir.Write(clientDir, map[string]atomicdir.File{"bundle.pem": {Data: bundle(k, c), Mode: 0o600}}, keep); err != nil {
			t.Fatal(err)
		}
		if err := cred.Reload(); err != nil {
			t.Fatal(err)
		}
		if err := dial(ln.Addr().String(), client); err != nil {
			t.Fatalf("gen %d: %v", gen, err)
		}
		if got, want := <-seen, fmt.Sprintf("gen-%d", gen); got != want {
			t.Errorf("server saw %s, want %s", got, want)
		}
	}
}
