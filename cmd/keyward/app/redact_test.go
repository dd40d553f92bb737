package app

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/config"
	"k8s.io/klog/v2"
)

// Secrets the URIs and configurations below carry.
// (Not all digits: a random temp dir name, which the output quotes, can hold
// any run of digits.)
var secrets = []string{"31qz4159", "27qz182", "hunter2", "AKIDLEAKED"}

// `keyward key inspect` and `key create` print no PIN or credential, whatever
// is wrong with the URI or endpoint that carries it.
func TestKeyCommandsShowNoSecrets(t *testing.T) {
	const module = "module-path=/usr/lib/softhsm/libsofthsm2.so"
	gcpKey := "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k"
	cases := []struct {
		name  string
		uri   string
		flags []string
	}{
		{name: "an unknown scheme", uri: "nosuch:token=a;pin-value=31qz4159"},
		{name: "an upper-case scheme", uri: "PKCS11:token=a;object=ca;pin-value=31qz4159?" + module},
		{name: "a PIN in the path", uri: "pkcs11:token=a;object=ca;pin-value=31qz4159?" + module},
		{name: "a PIN with a space and a quote", uri: "pkcs11:token=a;object=ca?" + module + `&pin-value=31qz4159 27qz182"hunter2`},
		{name: "a PIN in the query, in mixed case", uri: "pkcs11:token=a;object=ca?" + module + "&Pin-Value=31qz4159"},
		{name: "a PIN and an unknown attribute", uri: "pkcs11:token=a;object=ca;bogus=1?" + module + "&PIN-VALUE=31qz4159"},
		{name: "a PIN where its source belongs", uri: "pkcs11:token=a;object=ca?module-path=/tmp/evil.so&pin-source=31qz4159"},
		{name: "an awskms endpoint with user information", uri: "awskms:key-id=k;region=eu-west-1?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1"},
		{name: "a bad awskms endpoint with user information", uri: "awskms:region=eu-west-1?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1/%zz"},
		{name: "a Cloud KMS emulator address with user information", uri: gcpKey + "/cryptoKeyVersions/1", flags: []string{"--gcpkms-emulator", "AKIDLEAKED:hunter2@127.0.0.1:1", "--timeout", "5s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, args := range [][]string{
				append([]string{"key", "inspect", "--uri", tc.uri}, tc.flags...),
				append([]string{"key", "create", "--uri", strings.TrimSuffix(tc.uri, "/cryptoKeyVersions/1")}, tc.flags...),
			} {
				out, err := runKeyward(t, args...)
				if err == nil {
					t.Fatalf("%v succeeded:\n%s", args[:2], out)
				}
				checkNoSecret(t, args[1], out+"\n"+err.Error())
			}
		})
	}
}

// `keyward signer --check-config` on a configuration whose key URI holds a
// PIN and whose Cloud KMS endpoint holds a password, with mistakes next to
// them, fails without showing either.
func TestSignerCheckConfigShowsNoSecrets(t *testing.T) {
	full, err := os.ReadFile("../../../signer/config/testdata/full.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// A leftover ca: block whose key URI holds a PIN.
	cfg := bytes.Replace(full, []byte("  profile: podIdentity\n"), []byte("  profile: podIdentity\n  ca:\n    keyURI: PKCS11:pin-value=31qz4159;token=keyward;object=ca\n"), 1)
	cfg = bytes.Replace(cfg, []byte("maxLifetime: 24h"), []byte("maxLifetime: 30m"), 1)
	cfg = bytes.Replace(cfg, []byte("endpoint: cloudkms.googleapis.com:443"), []byte("endpoint: AKIDLEAKED:hunter2@cloudkms.googleapis.com:443"), 1)
	if bytes.Equal(cfg, full) || !bytes.Contains(cfg, []byte("31qz4159")) || !bytes.Contains(cfg, []byte("hunter2")) {
		t.Fatal("the test configuration did not change as intended")
	}
	file := filepath.Join(t.TempDir(), "secret.yaml")
	if err := os.WriteFile(file, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runKeyward(t, "signer", "--check-config", file)
	if err == nil {
		t.Fatalf("check-config accepted it:\n%s", out)
	}
	checkNoSecret(t, "check-config", out+"\n"+err.Error())
}

func checkNoSecret(t *testing.T, what, shown string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(shown, s) {
			t.Errorf("%s shows %q:\n%s", what, s, shown)
		}
	}
}

// `keyward signer` whose configuration still has a ca: block, with a key
// URI holding a PIN or a credential, refuses it with the migration error
// without showing the secret in its error or its log. (Key URIs now come
// from Authority objects, whose CRD refuses a PIN; the generations tests
// cover the messages about them.)
func TestSignerRunShowsNoSecrets(t *testing.T) {
	var log bytes.Buffer
	klog.LogToStderr(false)
	klog.SetOutput(&log)
	defer func() {
		klog.Flush()
		klog.SetOutput(io.Discard)
		klog.LogToStderr(true)
	}()
	for _, keyURI := range []string{
		"pkcs11:token=keyward;object=ca;PIN-VALUE=31qz4159?module-path=/tmp/evil.so",
		"PKCS11:token=keyward;object=ca?module-path=/usr/lib/softhsm/libsofthsm2.so&pin-value=31qz4159",
		"awskms:key-id=k;region=eu-west-1?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1",
	} {
		t.Run(keyURI[:6], func(t *testing.T) {
			cfg := fmt.Sprintf(`apiVersion: keyward.dev/v1alpha1
kind: SignerConfiguration
metricsAddress: 127.0.0.1:0
healthAddress: 127.0.0.1:0
signers:
- name: keyward.dev/pod-identity
  profile: podIdentity
  ca:
    certificateFile: /nonexistent/ca.crt
    keyURI: %q
`, keyURI)
			file := filepath.Join(t.TempDir(), "signer.yaml")
			if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := runKeyward(t, "signer", "--config", file, "-v=6")
			if !errors.Is(err, config.ErrCABlockRemoved) {
				t.Fatalf("got %v, want the configuration's refusal of the ca block\n%s", err, out)
			}
			klog.Flush()
			checkNoSecret(t, "signer", out+"\n"+err.Error()+"\n"+log.String())
		})
	}
}
