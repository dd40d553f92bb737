package app

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyward/keyward/internal/softhsm"
)

func runKeyward(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.Execute()
	return out.String(), err
}

// `keyward key create` then `keyward key inspect` on the URI it printed
// report the same key, for each backend.
func TestKeyCreateThenInspect(t *testing.T) {
	hsm, err := softhsm.NewEnv(filepath.Join(t.TempDir(), "softhsm"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := hsm.NewToken("cli")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, uri, algorithm string
	}{
		{"file", "file:" + filepath.Join(t.TempDir(), "ca.pem"), "ecdsa-p384-sha384"},
		{"pkcs11", "pkcs11:token=cli;object=ca?module-path=" + tok.ModulePath + "&pin-source=file:" + tok.PINFile, "rsa-2048-pss-sha256"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			created, err := runKeyward(t, "key", "create", "--uri", tc.uri, "--algorithm", tc.algorithm)
			if err != nil {
				t.Fatalf("create: %v\n%s", err, created)
			}
			uri := field(created, "uri:")
			if uri == "" || field(created, "algorithm:") != tc.algorithm {
				t.Fatalf("create printed:\n%s", created)
			}
			inspected, err := runKeyward(t, "key", "inspect", "--uri", uri)
			if err != nil {
				t.Fatalf("inspect %s: %v\n%s", uri, err, inspected)
			}
			if inspected != created {
				t.Fatalf("inspect differs from create:\n%s\nvs\n%s", inspected, created)
			}
			if !strings.Contains(inspected, "-----BEGIN PUBLIC KEY-----") || !strings.HasPrefix(field(inspected, "fingerprint:"), "sha256:") {
				t.Fatalf("inspect output lacks the public key or fingerprint:\n%s", inspected)
			}
		})
	}
	out, err := runKeyward(t, "key", "inspect", "--uri", "nosuch:thing")
	if err == nil || !strings.Contains(out, "scheme") {
		t.Fatalf("unknown scheme: err=%v out=%s", err, out)
	}
}

func field(out, name string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, name) {
			return strings.TrimSpace(strings.TrimPrefix(line, name))
		}
	}
	return ""
}
