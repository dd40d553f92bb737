package all_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Secrets the URIs below carry; none may appear in any error.
var secrets = []string{"31qz4159", "27qz182", "hunter2", "AKIDLEAKED", "kq7zz", "wq8yy"}

// mistakes are key URIs that carry a PIN or a credential and are wrong in
// one way each, so that opening or creating them fails.
func mistakes(t *testing.T) []struct{ name, uri string } {
	const module = "module-path=/usr/lib/softhsm/libsofthsm2.so"
	dir := t.TempDir()
	return []struct{ name, uri string }{
		{"an unknown scheme", "nosuch:token=a;pin-value=31qz4159"},
		{"an upper-case scheme", "PKCS11:token=a;object=ca;pin-value=31qz4159?" + module},
		{"no scheme at all", "token=a;pin-value=31qz4159"},
		{"a PIN in the path", "pkcs11:token=a;object=ca;pin-value=31qz4159?" + module},
		{"a PIN in the query", "pkcs11:token=a;object=ca?" + module + "&pin-value=31qz4159"},
		{"a PIN attribute in upper case", "pkcs11:token=a;object=ca;PIN-VALUE=31qz4159?" + module},
		{"a PIN attribute in mixed case in the query", "pkcs11:token=a;object=ca?" + module + "&Pin-Value=31qz4159"},
		{"a PIN with an unescaped ';'", "pkcs11:token=a;object=ca;pin-value=31415;9?" + module},
		{"a PIN with an unescaped '&' in the query", "pkcs11:token=a;object=ca?pin-value=314&159&" + module},
		{"a PIN with an unescaped '?' in the path", "pkcs11:token=a;object=ca;pin-value=314?159;" + module},
		{"a PIN with a space", "pkcs11:token=a;object=ca?" + module + "&pin-value=kq7zz wq8yy"},
		{"a PIN with a double quote", "pkcs11:token=a;object=ca?" + module + `&pin-value=kq7zz"wq8yy`},
		{"a PIN with a single quote, in upper case", "pkcs11:token=a;object=ca?" + module + "&PIN-VALUE=kq7zz'wq8yy"},
		{"a PIN with a tab in the path", "pkcs11:token=a;object=ca;pin-value=kq7zz\twq8yy?" + module},
		{"a PIN and an unknown attribute", "pkcs11:token=a;object=ca;bogus=1;pin-value=31qz4159?" + module},
		{"a PIN and a module that is not allowed", "pkcs11:token=a;object=ca;pin-value=31qz4159?module-path=/tmp/evil.so"},
		{"a PIN where its source belongs, and a module that is not allowed", "pkcs11:token=a;object=ca?module-path=/tmp/evil.so&pin-source=31qz4159"},
		{"a PIN where its source belongs, in mixed case", "pkcs11:token=a;object=ca?module-path=/tmp/evil.so&Pin-Source=31qz4159"},
		{"a PIN in a file URI", "file:" + filepath.Join(dir, "missing.pem") + "?pin-value=31qz4159"},
		{"a password in an upper-case file URI", "FILE:" + filepath.Join(dir, "missing.pem") + "?password=hunter2"},
		{"a PIN in a gcpkms URI", "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1?pin-value=31qz4159"},
		{"a PIN in a malformed gcpkms name", "gcpkms:projects/p;pin-value=31qz4159/locations/l"},
		{"a PIN in an awskms URI", "awskms:key-id=k;region=eu-west-1;pin-value=31qz4159"},
		{"an awskms endpoint with user information", "awskms:key-id=k;region=eu-west-1?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1"},
		{"an awskms endpoint with user information and a bad escape", "awskms:key-id=k;region=eu-west-1?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1/%zz"},
		{"an awskms endpoint of another scheme with user information", "awskms:key-id=k;region=eu-west-1?endpoint=ftp://AKIDLEAKED:hunter2@127.0.0.1"},
		{"an awskms endpoint with a password query parameter", "awskms:key-id=k;region=eu-west-1?endpoint=https://127.0.0.1:1/%3Fpassword%3Dhunter2"},
		{"a percent-encoded awskms endpoint with user information", "awskms:key-id=k;region=eu-west-1?endpoint=https%3A%2F%2FAKIDLEAKED%3Ahunter2%40127.0.0.1%3A1%2F%25zz"},
		{"a bad awskms region and a password", "awskms:key-id=k;region=EU?password=hunter2"},
		{"an awskms creation URI with user information", "awskms:region=eu-west-1;description=ca?endpoint=https://AKIDLEAKED:hunter2@127.0.0.1:1"},
		{"a gcpkms URI with a token parameter", "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k?access_token=27qz182"},
	}
}

// No PIN, password or URL user information reaches an error, whatever is
// wrong with the URI that carries it, through Open or CreateKey.
func TestRegistryErrorsCarryNoSecrets(t *testing.T) {
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	for _, tc := range mistakes(t) {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := reg.Open(ctx, backends.OpenRequest{URI: tc.uri})
			checkNoSecret(t, "Open", err)
			_, err = reg.CreateKey(ctx, backends.CreateKeyRequest{URI: tc.uri, Algorithm: backends.ECDSAP256SHA256})
			checkNoSecret(t, "CreateKey", err)
		})
	}
}

// A Cloud KMS endpoint with user information, which the client library
// tries to reach, does not show up in the errors either.
func TestGCPKMSEndpointCredentialsStayOutOfErrors(t *testing.T) {
	for _, endpoint := range []string{"AKIDLEAKED:hunter2@127.0.0.1:1", "https://AKIDLEAKED:hunter2@127.0.0.1:1"} {
		t.Run(endpoint, func(t *testing.T) {
			var opts all.Options
			opts.GCPKMS.ClientOptions = []option.ClientOption{
				option.WithEndpoint(endpoint), option.WithoutAuthentication(),
				option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
			}
			opts.GCPKMS.CallTimeout = time.Second
			opts.GCPKMS.Retry.MaxAttempts = 1
			reg, err := all.NewRegistry(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer reg.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = reg.Open(ctx, backends.OpenRequest{URI: "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1"})
			checkNoSecret(t, "Open", err)
		})
	}
}

func checkNoSecret(t *testing.T, op string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s succeeded", op)
	}
	shown := []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err.Error())}
	var be *backends.Error
	if errors.As(err, &be) {
		shown = append(shown, be.URI, be.Part)
	}
	for _, s := range shown {
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("%s error shows %q: %s", op, secret, s)
			}
		}
	}
	t.Logf("%s: %v", op, err)
}
