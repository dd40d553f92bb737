package testregistry

import (
	"context"
	"io"
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
	if os.Getenv("KEYWARD_TEST_REGISTRY_LOG") == "" {
		logrus.SetOutput(io.Discard)
	}
	cfg := baseConfig(t, filepath.Join(t.TempDir(), "storage"))
	ctx, cancel := context.WithCancel(context.Background())
	app := newApp(t, ctx, cfg)
	srv := httptest.NewServer(app)
	t.Cleanup(func() {
		srv.Close()
		cancel()
		if err := app.Shutdown(); err != nil {
			t.Errorf("shutting the open test registry down: %v", err)
		}
	})
	return &Open{URL: srv.URL, Host: strings.TrimPrefix(srv.URL, "http://")}
}
