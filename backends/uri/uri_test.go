package uri

import (
	"strings"
	"testing"
)

func TestRedactHidesSecretValuesAndKeepsTheRest(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"no secret", "pkcs11:token=a;object=b?module-path=/m.so", "pkcs11:token=a;object=b?module-path=/m.so"},
		{"PIN in the path before the query", "pkcs11:token=a;pin-value=1234?module-path=/m.so", "pkcs11:token=a;pin-value=REDACTED?module-path=/m.so"},
		{"PIN in the path between attributes", "pkcs11:pin-value=1234;token=a", "pkcs11:pin-value=REDACTED;token=a"},
		{"PIN in the query", "pkcs11:token=a?pin-value=12?34&module-path=/m.so", "pkcs11:token=a?pin-value=REDACTED&module-path=/m.so"},
		{"PIN in the path and the query", "pkcs11:pin-value=1?pin-value=2", "pkcs11:pin-value=REDACTED?pin-value=REDACTED"},
		{"already redacted", "pkcs11:pin-value=REDACTED", "pkcs11:pin-value=REDACTED"},
		{"an error quoting a redacted URI keeps its ': '", "create-key pkcs11:token=a?pin-source=REDACTED: pin-source: want pin-source=file:/path", "create-key pkcs11:token=a?pin-source=REDACTED: pin-source: want pin-source=file:/path"},
		{"attribute names in upper case", "PKCS11:token=a;PIN-VALUE=1234?module-path=/m.so", "PKCS11:token=a;PIN-VALUE=REDACTED?module-path=/m.so"},
		{"attribute names in mixed case", "pkcs11:token=a?Pin-Value=1234&Module-Path=/m.so", "pkcs11:token=a?Pin-Value=REDACTED&Module-Path=/m.so"},
		{"a PIN whose ';' was not escaped", "pkcs11:pin-value=12;34;token=a", "pkcs11:pin-value=REDACTED;token=a"},
		{"a PIN whose '?' was not escaped in the path", "pkcs11:pin-value=12?34&module-path=/m.so", "pkcs11:pin-value=REDACTED&module-path=/m.so"},
		{"a PIN with percent-encoded characters", "pkcs11:pin-value=12%3B34;token=a", "pkcs11:pin-value=REDACTED;token=a"},
		{"pin-source naming a file or a variable is kept", "pkcs11:token=a?Pin-Source=file:/etc/pin&pin-source=env:PIN", "pkcs11:token=a?Pin-Source=file:/etc/pin&pin-source=env:PIN"},
		{"pin-source holding a PIN is hidden", "pkcs11:token=a?pin-source=1234&module-path=/m.so", "pkcs11:token=a?pin-source=REDACTED&module-path=/m.so"},
		{"URL user and password", "https://user:pw@kms.example:443/path", "https://REDACTED@kms.example:443/path"},
		{"URL user only", "http://user@127.0.0.1:8080", "http://REDACTED@127.0.0.1:8080"},
		{"URL password with an unescaped '/'", "https://user:p/w@host/", "https://REDACTED@host/"},
		{"URL userinfo already redacted", "https://REDACTED@host", "https://REDACTED@host"},
		{"a gRPC target with user and password", `dial tcp: address AK:pw@127.0.0.1:1: too many colons`, `dial tcp: address REDACTED@127.0.0.1:1: too many colons`},
		{"an e-mail address or a label with '@' is kept", "mail ca@example.com; pkcs11:token=ops@corp;object=team:ca@prod; file:/k/a:b@c.pem", "mail ca@example.com; pkcs11:token=ops@corp;object=team:ca@prod; file:/k/a:b@c.pem"},
		{"a placeholder pin-source in a help text is kept", "want pkcs11:token=…?pin-source=…", "want pkcs11:token=…?pin-source=…"},
		{"endpoint with userinfo in a key URI", "awskms:key-id=k;region=eu-west-1?endpoint=https://ak:sk@h:1", "awskms:key-id=k;region=eu-west-1?endpoint=https://REDACTED@h:1"},
		{"percent-encoded endpoint with userinfo", "awskms:key-id=k?endpoint=https%3A%2F%2Fak%3Ask%40h", "awskms:key-id=k?endpoint=https://REDACTED@h"},
		{"credential query parameters", "https://h/p?X-Amz-Security-Token=t1&access_token=t2&client_secret=s&api-key=k&sig=x&keep=1", "https://h/p?X-Amz-Security-Token=REDACTED&access_token=REDACTED&client_secret=REDACTED&api-key=REDACTED&sig=REDACTED&keep=1"},
		{"password parameter", "postgres://h/db?password=pw&sslmode=disable", "postgres://h/db?password=REDACTED&sslmode=disable"},
		{"a token label is not a secret", "pkcs11:token=keyward;object=ca", "pkcs11:token=keyward;object=ca"},
		{"free text quoting a URI", `open "PKCS11:token=a;pin-value=1234": no backend for scheme "PKCS11"`, `open "PKCS11:token=a;pin-value=REDACTED": no backend for scheme "PKCS11"`},
		{"free text quoting a URL", `parse "https://u:pw@h/%zz": invalid URL escape "%zz"`, `parse "https://REDACTED@h/%zz": invalid URL escape "%zz"`},
		{"file and gcpkms URIs", "file:/etc/ca.key?algorithm=ed25519 gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", "file:/etc/ca.key?algorithm=ed25519 gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Redact(tc.in)
			if got != tc.want {
				t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if again := Redact(got); again != got {
				t.Errorf("Redact is not idempotent: %q, then %q", got, again)
			}
		})
	}
}

// Parse's errors about a URI that holds a secret do not quote the secret,
// not even a piece of it cut off by an unescaped separator.
func TestParseErrorsDoNotQuoteSecrets(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"an unescaped ';' in a PIN in the path", "pkcs11:token=a;pin-value=12;3456"},
		{"an unescaped '&' in a PIN in the query", "pkcs11:token=a?pin-value=12&3456"},
		{"a bad percent-escape in a PIN", "pkcs11:token=a;pin-value=3456%zz"},
		{"a bad percent-escape in a password", "x:password=3456%zz"},
		{"a repeated PIN", "pkcs11:pin-value=3456;PIN-VALUE=3456;pin-value=3456"},
		{"an attribute without '=' after a PIN", "pkcs11:pin-value=3456;x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.in)
			if err == nil {
				t.Fatalf("Parse(%q) succeeded", tc.in)
			}
			if strings.Contains(err.Error(), "3456") {
				t.Errorf("Parse(%q) error quotes the secret: %v", tc.in, err)
			}
		})
	}
}

// A secret in one key URI is hidden whole, white space, quotes and
// unescaped separators included: free-text redaction cannot know where
// such a value ends, RedactURI can.
func TestRedactURIHidesWholeValues(t *testing.T) {
	for _, tc := range []struct{ in, secret string }{
		{"pkcs11:token=a;object=b?module-path=/m.so&pin-value=12 34", "34"},
		{`pkcs11:token=a;object=b?module-path=/m.so&pin-value=ab"cd`, `cd`},
		{"pkcs11:token=a;object=b?module-path=/m.so&pin-value=se cret'tail&x=1", "tail"},
		{"pkcs11:token=a;pin-value=12;34;object=b?module-path=/m.so", "34"},
		{"pkcs11:token=a;object=b?module-path=/m.so&PIN-VALUE=99\t88", "88"},
		{"awskms:region=x?endpoint=https://user:p w@h", "p w"},
		{"pkcs11:token=a;object=b;pin-value =1234?module-path=/m.so", "1234"}, // found by FuzzParseLocation
		{"pkcs11:token=a;object=b?module-path=/m.so& pin-value\t=5678", "5678"},
		{"pkcs11:token=a;pin=&9012", "9012"}, // found by FuzzParseLocation: a PIN that begins with '&'
		{"pkcs11:token=a?pin-source=&3456&module-path=/m.so", "3456"},
		// Segments end where Parse ends them: '&' belongs to a path value,
		// ';' to a query value, '#' to either.
		{"0:pin=&0000=", "0000"}, // found by FuzzParseLocation
		{"pkcs11:token=a;pin-value=ab&c=d;object=b", "c=d"},
		{"pkcs11:token=a?pin-value=ab;c=d&module-path=/m.so", "c=d"},
		{"pkcs11:token=a;pin-value=ab#c=d", "c=d"},
		{"=:pin= 7890", "7890"},                                      // found by FuzzParseLocation: the scheme is not part of a name
		{"token=a;pin-value=my pass:word?module-path=/m.so", "pass"}, // "pkcs11:" forgotten, a ':' in the PIN
	} {
		got := RedactURI(tc.in)
		if strings.Contains(got, tc.secret) {
			t.Errorf("RedactURI(%q) = %q: shows %q", tc.in, got, tc.secret)
		}
		if !strings.Contains(got, Redacted) {
			t.Errorf("RedactURI(%q) = %q: nothing redacted", tc.in, got)
		}
	}
	for _, plain := range []string{
		"pkcs11:token=a;object=b c?module-path=/m.so&pin-source=file:/p",
		"pkcs11:token=a;pin-value=;object=b?module-path=/m.so", // an empty PIN hides nothing
		"", ";", "a;;b", // empty segments
	} {
		if got := RedactURI(plain); got != plain {
			t.Errorf("RedactURI(%q) = %q, want it unchanged", plain, got)
		}
	}
}
