package testregistry

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
)

// Open is a CNCF Distribution registry without authentication, on
// loopback, storing in a directory of the test's: where release tests push
// the packaged chart (helm push oci://) and images, as to a registry a
// user runs. Its Host is 127.0.0.1:PORT (plain HTTP: helm needs
// --plain-http).
type Open struct {
	URL, Host string
}

// StartOpen starts an Open registry that lives until the test ends.
func StartOpen(t testing.TB) *Open {
	t.Helper()
	return startOpen(t, nil, nil)
}

// StartOpenTLS starts an Open registry serving HTTPS with cert on l (the
// install test's stand-in for ghcr.io, on an address of the node's
// network namespace); its URL is https://HOST of l's address. It lives
// until the test ends.
func StartOpenTLS(t testing.TB, l net.Listener, cert tls.Certificate) *Open {
	t.Helper()
	return startOpen(t, l, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
}

func startOpen(t testing.TB, l net.Listener, tlsConfig *tls.Config) *Open {
	t.Helper()
	if os.Getenv("KEYWARD_TEST_REGISTRY_LOG") == "" {
		logrus.SetOutput(io.Discard)
	}
	cfg := baseConfig(t, filepath.Join(t.TempDir(), "storage"))
	ctx, cancel := context.WithCancel(context.Background())
	app := newApp(t, ctx, cfg)
	var srv *httptest.Server
	if l == nil {
		srv = httptest.NewServer(app)
	} else {
		srv = httptest.NewUnstartedServer(app)
		srv.Listener.Close()
		srv.Listener = l
		srv.TLS = tlsConfig
		srv.StartTLS()
	}
	t.Cleanup(func() {
		srv.Close()
		cancel()
		if err := app.Shutdown(); err != nil {
			t.Errorf("shutting the open test registry down: %v", err)
		}
	})
	return &Open{URL: srv.URL, Host: strings.TrimPrefix(strings.TrimPrefix(srv.URL, "http://"), "https://")}
}
