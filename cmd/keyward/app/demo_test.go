package app

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"
)

// `keyward demo --once` brings up the control plane and the token, prints how
// to reach them, and leaves nothing behind.
func TestDemoOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := runDemo(ctx, &out, &demoOptions{dir: dir, once: true}); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{"control plane ready", "export KUBECONFIG=" + dir + "/admin.kubeconfig", "token label \"keyward-demo\"",
		"CA key created in SoftHSM", ": Issued in ", "PodIdentity (1.3.6.1.4.1.57683.1, non-critical)", "issuer:    CN=keyward demo CA"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(dir + "/admin.kubeconfig"); err != nil {
		t.Error(err)
	}
	if strings.Contains(out.String(), mustRead(t, dir+"/softhsm/keyward-demo.pin")) {
		t.Error("demo output contains the token PIN")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
