package credbundle

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/keyward/keyward/nodehelper/atomicdir"
)

func TestRESTConfigRefusesWhatCannotWork(t *testing.T) {
	cred, err := New(Options{BundleFile: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t, "ca")
	for _, tc := range []struct {
		name  string
		host  string
		ca    []byte
		cred  *Credential
		check func(error) bool
	}{
		{"an empty host is refused", "", ca.pem, cred, func(err error) bool { return err != nil }},
		{"a missing credential is refused", "https://127.0.0.1", ca.pem, nil, func(err error) bool { return err != nil }},
		{"a CA bundle without a certificate is refused", "https://127.0.0.1", []byte("not PEM"), cred, func(err error) bool { return errors.Is(err, ErrNoCertificate) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := RESTConfig(tc.host, tc.ca, tc.cred)
			if !tc.check(err) || cfg != nil {
				t.Fatalf("RESTConfig = %v, %v", cfg, err)
			}
		})
	}
}

// An HTTP/2 server that names the client certificate of each request's
// connection: after the bundle on disk rotates and the credential reloads
// it, the very next request presents the new certificate, although the
// old connection is still open and would be reused otherwise.
func TestRESTConfigPresentsTheRotatedCertificate(t *testing.T) {
	ca := newTestCA(t, "ca")
	srvKey, srvChain := ca.issue(t, 0)
	srvCert, err := tls.X509KeyPair(srvChain, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/watch" {
			// A watch: headers now, then nothing until the client goes.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		fmt.Fprintf(w, "%s %s", r.Proto, r.TLS.PeerCertificates[0].Subject.CommonName)
	}))
	srv.EnableHTTP2 = true
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{srvCert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: roots}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	dir := t.TempDir()
	keep := atomicdir.Options{UID: atomicdir.KeepOwner, GID: atomicdir.KeepOwner}
	rotate := func(gen int) {
		k, c := ca.issue(t, gen)
		if err := atomicdir.Write(dir, map[string]atomicdir.File{"bundle.pem": {Data: bundle(k, c), Mode: 0o600}}, keep); err != nil {
			t.Fatal(err)
		}
	}
	rotate(1)
	cred, err := New(Options{BundleFile: filepath.Join(dir, "bundle.pem")})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := RESTConfig(srv.URL, ca.pem, cred)
	if err != nil {
		t.Fatal(err)
	}
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	get := func() string {
		t.Helper()
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// A watch open on the first certificate's connection ends once a
	// request finds the certificate rotated.
	watch, err := client.Get(srv.URL + "/watch")
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Body.Close()
	watchEnded := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, watch.Body)
		watchEnded <- err
	}()
	for gen := 1; gen <= 3; gen++ {
		if gen > 1 {
			rotate(gen)
			if err := cred.Reload(); err != nil {
				t.Fatal(err)
			}
		}
		for i := 0; i < 2; i++ {
			if got, want := get(), fmt.Sprintf("HTTP/2.0 gen-%d", gen); got != want {
				t.Fatalf("gen %d, request %d: server saw %q, want %q", gen, i, got, want)
			}
		}
		if gen == 2 {
			select {
			case err := <-watchEnded:
				t.Logf("the watch made with gen-1 ended: %v", err)
			case <-time.After(30 * time.Second):
				t.Fatal("the watch made with gen-1 is still open after the rotation")
			}
		}
	}
}
