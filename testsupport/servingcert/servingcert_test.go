package servingcert

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"testing"
)

// A server on the written pair is trusted by a client given the pool.
func TestTheWrittenPairServesTLSTrustedByThePool(t *testing.T) {
	f, err := Write(t.TempDir(), "token-service")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair}}
	srv.StartTLS()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: f.Pool}}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}
