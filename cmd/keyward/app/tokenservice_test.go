package app

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// token-service --check-config reports the shipped example valid and a
// bad file invalid naming the field; without --config it says what is
// needed.
func TestTokenServiceCheckConfig(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := NewCommand()
		var out bytes.Buffer
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("token-service", "--check-config", "../../../docs/token-service-config.yaml")
	if err != nil || !strings.Contains(out, "valid") {
		t.Fatalf("the example: %q, %v", out, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("apiVersion: keyward.dev/v1alpha1\nkind: TokenServiceConfiguration\ntokenLifetime: 2h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := run("token-service", "--check-config", bad); err == nil || !strings.Contains(err.Error(), "tokenLifetime") {
		t.Errorf("a bad file: %v, want an error naming tokenLifetime", err)
	}
	if _, err := run("token-service"); err == nil || !strings.Contains(err.Error(), "--config") {
		t.Errorf("no flags: %v, want --config required", err)
	}
}
