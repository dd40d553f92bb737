package main

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// ca is a test CA: a certificate and its key.
type ca struct {
	cert *x509.Certificate
	key  crypto.Signer
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

var serials struct {
	sync.Mutex
	n int64
}

func issue(t *testing.T, parent *ca, tmpl *x509.Certificate, pub crypto.PublicKey, key crypto.Signer) *x509.Certificate {
	t.Helper()
	serials.Lock()
	serials.n++
	tmpl.SerialNumber = big.NewInt(1000 + serials.n)
	serials.Unlock()
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(time.Hour)
	p, pk := tmpl, key
	if parent != nil {
		p, pk = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p, pub, pk)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newRoot(t *testing.T, name string) *ca {
	k := newKey(t)
	return &ca{issue(t, nil, &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, k.Public(), k), k}
}

func (c *ca) intermediate(t *testing.T, name string) *ca {
	k := newKey(t)
	return &ca{issue(t, c, &x509.Certificate{Subject: pkix.Name{CommonName: name}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}, k.Public(), nil), k}
}

// leaf issues a pod-certificate-like leaf: client auth only, a SPIFFE URI,
// no DNS name.
func (c *ca) leaf(t *testing.T, key crypto.Signer) *x509.Certificate {
	u, _ := url.Parse("spiffe://cluster.local/ns/default/sa/workload")
	return issue(t, c, &x509.Certificate{Subject: pkix.Name{CommonName: "system:serviceaccount:default:workload"},
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, key.Public(), nil)
}

func certsPEM(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

func pkcs8PEM(t *testing.T, k crypto.Signer) []byte {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func ecPEM(t *testing.T, k *ecdsa.PrivateKey) []byte {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})
}

// write replaces path's content atomically, as kubelet's projection does.
func write(t *testing.T, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// events parses the lines run printed.
func events(t *testing.T, out string) []map[string]any {
	t.Helper()
	var evs []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		j, ok := strings.CutPrefix(line, Prefix)
		if !ok {
			t.Fatalf("line %q lacks the prefix %q", line, Prefix)
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(j), &ev); err != nil {
			t.Fatalf("line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func TestVerifyOnce(t *testing.T) {
	root, other := newRoot(t, "root A"), newRoot(t, "root B")
	inter := root.intermediate(t, "intermediate A")
	key, stranger := newKey(t), newKey(t)
	leaf := inter.leaf(t, key)

	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	write(t, p("bundle.pem"), append(pkcs8PEM(t, key), certsPEM(leaf, inter.cert)...))
	write(t, p("mismatch.pem"), append(pkcs8PEM(t, stranger), certsPEM(leaf, inter.cert)...))
	write(t, p("key.pem"), ecPEM(t, key))
	write(t, p("chain.pem"), certsPEM(leaf, inter.cert))
	write(t, p("trust.pem"), certsPEM(other.cert, root.cert))
	write(t, p("other-trust.pem"), certsPEM(other.cert))
	write(t, p("garbage.pem"), []byte("not PEM at all\n"))

	for _, tc := range []struct {
		name    string
		args    []string
		wantOK  bool
		wantErr string // a part of the error the event names
	}{
		{name: "a good chain in a credential bundle verifies",
			args: []string{"--credential-bundle", p("bundle.pem"), "--trust", p("trust.pem")}, wantOK: true},
		{name: "a good chain in separate key and chain files verifies",
			args: []string{"--key", p("key.pem"), "--chain", p("chain.pem"), "--trust", p("trust.pem")}, wantOK: true},
		{name: "a trust bundle without the chain's root fails",
			args:    []string{"--credential-bundle", p("bundle.pem"), "--trust", p("other-trust.pem")},
			wantErr: "verifying the leaf against the trust bundle " + p("other-trust.pem") + ": x509: certificate signed by unknown authority"},
		{name: "a key that is not the leaf's fails",
			args:    []string{"--credential-bundle", p("mismatch.pem"), "--trust", p("trust.pem")},
			wantErr: "does not match the leaf certificate's public key"},
		{name: "a missing credential bundle fails naming the file",
			args:    []string{"--credential-bundle", p("absent.pem"), "--trust", p("trust.pem")},
			wantErr: "reading the credential bundle: open " + p("absent.pem") + ": no such file or directory"},
		{name: "a missing trust bundle fails naming the file",
			args:    []string{"--credential-bundle", p("bundle.pem"), "--trust", p("absent.pem")},
			wantErr: "reading the trust bundle: open " + p("absent.pem")},
		{name: "an unparseable trust bundle fails naming the file",
			args:    []string{"--credential-bundle", p("bundle.pem"), "--trust", p("garbage.pem")},
			wantErr: "trust bundle " + p("garbage.pem") + ": no CERTIFICATE PEM block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"verify", "--once"}, tc.args...), &stdout, &stderr)
			evs := events(t, stdout.String())
			if len(evs) != 1 {
				t.Fatalf("printed %d events, want 1: %s", len(evs), stdout.String())
			}
			ev := evs[0]
			if ev["event"] != "verify" || ev["ok"] != tc.wantOK {
				t.Fatalf("event %v, want verify with ok %v", ev, tc.wantOK)
			}
			if wantCode := map[bool]int{true: 0, false: 1}[tc.wantOK]; code != wantCode {
				t.Errorf("exit status %d, want %d (stderr %q)", code, wantCode, stderr.String())
			}
			if tc.wantOK {
				if ev["serial"] != serial(leaf) || ev["issuer"] != inter.cert.Subject.String() || ev["keyType"] != "ECDSAP256" ||
					ev["leafSHA256"] != fingerprint(leaf) || ev["chainLen"] != 2.0 {
					t.Errorf("event %v does not describe the leaf", ev)
				}
				roots, _ := json.Marshal(ev["rootSHA256"])
				if want, _ := json.Marshal([]string{fingerprint(other.cert), fingerprint(root.cert)}); !bytes.Equal(roots, want) {
					t.Errorf("rootSHA256 %s, want %s", roots, want)
				}
				if uris, _ := json.Marshal(ev["uris"]); string(uris) != `["spiffe://cluster.local/ns/default/sa/workload"]` {
					t.Errorf("uris %s", uris)
				}
				return
			}
			if e, _ := ev["error"].(string); !strings.Contains(e, tc.wantErr) {
				t.Errorf("error %q, want it to contain %q", e, tc.wantErr)
			}
		})
	}
}

// TestVerifyLoopPrintsOnChange runs verify in its loop and rotates the
// trust bundle under it: the first check prints, an unchanged file does
// not, a changed one does.
func TestVerifyLoopPrintsOnChange(t *testing.T) {
	root, other := newRoot(t, "root A"), newRoot(t, "root B")
	key := newKey(t)
	dir := t.TempDir()
	bundle, trust := filepath.Join(dir, "bundle.pem"), filepath.Join(dir, "trust.pem")
	write(t, bundle, append(pkcs8PEM(t, key), certsPEM(root.leaf(t, key))...))
	write(t, trust, certsPEM(other.cert))

	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() {
		done <- run(ctx, []string{"verify", "--credential-bundle", bundle, "--trust", trust, "--interval", "20ms"}, out, out)
	}()
	waitFor(t, func() bool { return strings.Count(out.String(), "\n") == 1 })
	time.Sleep(100 * time.Millisecond) // several unchanged rounds
	if n := strings.Count(out.String(), "\n"); n != 1 {
		t.Fatalf("printed %d lines with no file changed, want 1:\n%s", n, out)
	}
	write(t, trust, certsPEM(other.cert, root.cert))
	waitFor(t, func() bool { return strings.Count(out.String(), "\n") == 2 })
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit status %d after cancel, want 0", code)
	}
	evs := events(t, out.String())
	if evs[0]["ok"] != false || evs[1]["ok"] != true {
		t.Errorf("events %v, want not ok then ok", evs)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestMTLSRoundTripFollowsRootChange runs mtls-serve on 127.0.0.1 and
// dials it; then the server's credential moves to a new root, which the
// dialer trusts only once its trust bundle file says so, with neither
// restarted.
func TestMTLSRoundTripFollowsRootChange(t *testing.T) {
	rootA, rootB := newRoot(t, "root A"), newRoot(t, "root B")
	serverKey, clientKey := newKey(t), newKey(t)
	dir := t.TempDir()
	p := func(name string) string { return filepath.Join(dir, name) }
	srv := files{bundle: p("server.pem"), trust: p("server-trust.pem")}
	cli := files{bundle: p("client.pem"), trust: p("client-trust.pem")}
	serverLeafA := rootA.leaf(t, serverKey)
	clientLeaf := rootA.leaf(t, clientKey)
	write(t, srv.bundle, append(pkcs8PEM(t, serverKey), certsPEM(serverLeafA)...))
	write(t, srv.trust, certsPEM(rootA.cert))
	write(t, cli.bundle, append(pkcs8PEM(t, clientKey), certsPEM(clientLeaf)...))
	write(t, cli.trust, certsPEM(rootA.cert))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serverOut := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error)
	go func() { served <- serve(ctx, ln, srv, &printer{w: serverOut}) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()
	addr := ln.Addr().String()

	dial := func() map[string]any {
		t.Helper()
		b, _ := json.Marshal(dialOnce(context.Background(), addr, "spiffe://cluster.local/ns/default/sa/workload", cli))
		var ev map[string]any
		json.Unmarshal(b, &ev)
		return ev
	}
	lastServerEvent := func(n int) map[string]any {
		t.Helper()
		waitFor(t, func() bool { return strings.Count(serverOut.String(), "\n") >= n })
		evs := events(t, serverOut.String())
		return evs[n-1]
	}

	if ev := dial(); ev["event"] != "dialed" || ev["serverSerial"] != serial(serverLeafA) || ev["ownSerial"] != serial(clientLeaf) ||
		ev["ownIssuer"] != rootA.cert.Subject.String() {
		t.Fatalf("first dial: %v", ev)
	}
	if ev := lastServerEvent(2); ev["event"] != "accepted" || ev["peerSerial"] != serial(clientLeaf) || ev["peerIssuer"] != rootA.cert.Subject.String() {
		t.Fatalf("server after the first dial: %v", ev)
	}

	// The server moves to root B; the dialer still trusts only root A.
	serverLeafB := rootB.leaf(t, serverKey)
	write(t, srv.bundle, append(pkcs8PEM(t, serverKey), certsPEM(serverLeafB)...))
	if ev := dial(); ev["event"] != "dial-failed" || !strings.Contains(ev["error"].(string), "x509: certificate signed by unknown authority") {
		t.Fatalf("dial to a server under an untrusted root: %v", ev)
	}
	if ev := lastServerEvent(3); ev["event"] != "handshake-failed" {
		t.Fatalf("server after the refused dial: %v", ev)
	}

	// The dialer's trust bundle gains root B.
	write(t, cli.trust, certsPEM(rootA.cert, rootB.cert))
	if ev := dial(); ev["event"] != "dialed" || ev["serverSerial"] != serial(serverLeafB) || ev["serverIssuer"] != rootB.cert.Subject.String() {
		t.Fatalf("dial after the trust bundle gained root B: %v", ev)
	}

	// The server's trust bundle drops root A: the client's leaf is refused.
	write(t, srv.trust, certsPEM(rootB.cert))
	if ev := dial(); ev["event"] != "dial-failed" {
		t.Fatalf("dial with a client leaf the server no longer trusts: %v", ev)
	}
	if ev := lastServerEvent(5); ev["event"] != "handshake-failed" || !strings.Contains(ev["error"].(string), "unknown authority") {
		t.Fatalf("server after refusing the client: %v", ev)
	}
}

func TestSleepExitsZeroOnSignal(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if code := run(ctx, []string{"sleep"}, &bytes.Buffer{}, &bytes.Buffer{}); code != 0 {
		t.Errorf("exit status %d", code)
	}
}
