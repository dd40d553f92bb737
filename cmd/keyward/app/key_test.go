package app

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
	"github.com/keyward/keyward/testsupport/softhsm"
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
	gcp, err := gcpkmsfake.Start(gcpkmsfake.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer gcp.Close()
	gcpKey := "projects/p/locations/global/keyRings/ca/cryptoKeys/cli"
	if err := gcp.AddCryptoKey(gcpKey, kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256); err != nil {
		t.Fatal(err)
	}
	// awskms reads credentials the SDK's default way: here, from the
	// environment, with shared files and instance metadata out of reach.
	awsKMS := awskmsfake.Start(awskmsfake.Options{})
	defer awsKMS.Close()
	kmstest.AWSEnv(t, awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey)
	cases := []struct {
		name, uri, algorithm string
		flags                []string
	}{
		{name: "file", uri: "file:" + filepath.Join(t.TempDir(), "ca.pem"), algorithm: "ecdsa-p384-sha384"},
		{name: "pkcs11", uri: "pkcs11:token=cli;object=ca?module-path=" + tok.ModulePath + "&pin-source=file:" + tok.PINFile, algorithm: "rsa-2048-pss-sha256"},
		{name: "gcpkms", uri: "gcpkms:" + gcpKey, algorithm: "ecdsa-p256-sha256", flags: []string{"--gcpkms-emulator", gcp.Addr()}},
		{name: "awskms", uri: "awskms:region=eu-west-1;description=cli?endpoint=" + awsKMS.URL(), algorithm: "rsa-3072-pss-sha384"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			created, err := runKeyward(t, append([]string{"key", "create", "--uri", tc.uri, "--algorithm", tc.algorithm}, tc.flags...)...)
			if err != nil {
				t.Fatalf("create: %v\n%s", err, created)
			}
			uri := field(created, "uri:")
			if uri == "" || field(created, "algorithm:") != tc.algorithm {
				t.Fatalf("create printed:\n%s", created)
			}
			inspected, err := runKeyward(t, append([]string{"key", "inspect", "--uri", uri}, tc.flags...)...)
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
	_, err = runKeyward(t, "key", "inspect", "--uri", "nosuch:thing")
	var be *backends.Error
	if !errors.Is(err, backends.ErrInvalidURI) || !errors.As(err, &be) || be.Part != "scheme" {
		t.Fatalf("unknown scheme: got %v, want ErrInvalidURI naming the scheme", err)
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
