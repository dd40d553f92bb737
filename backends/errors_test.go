package backends

import (
	"errors"
	"strings"
	"testing"
)

// An *Error shows no secret even when a backend put a raw URI, or a
// library quoted a URL with credentials, into it.
func TestErrorRedactsWhatItShows(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"a raw URI built into the struct", &Error{Kind: ErrInvalidURI, Op: "open", URI: "pkcs11:token=a;PIN-VALUE=314159", Part: "scheme", Err: errors.New("bad")}},
		{"a raw URI passed to Errorf", Errorf(ErrInvalidURI, "open", "pkcs11:token=a?Pin-Value=314159", "scheme", "bad")},
		{"a raw URI passed to Wrap", Wrap(ErrPermanent, "open", "awskms:key-id=k?endpoint=https://AK:314159@h", "", errors.New("bad"))},
		{"a library error quoting a URL with a password", Wrap(ErrTransient, "sign", "awskms:key-id=k", "", errors.New(`Post "https://AK:314159@h/": dial tcp: refused`))},
		{"a library error quoting a gRPC target with a password", Wrap(ErrTransient, "sign", "gcpkms:projects/p", "", errors.New(`dial tcp: address AK:314159@h:1: too many colons`))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Contains(tc.err.Error(), "314159") {
				t.Errorf("Error() = %q shows the secret", tc.err.Error())
			}
			var be *Error
			if errors.As(tc.err, &be) && tc.name != "a raw URI built into the struct" && strings.Contains(be.URI, "314159") {
				t.Errorf("URI field %q holds the secret", be.URI)
			}
		})
	}
}

// A Signer's URI, which logs quote, carries no secret even if a backend
// built it from one.
func TestKeyInfoURIIsRedacted(t *testing.T) {
	key, err := GenerateKey(ECDSAP256SHA256)
	if err != nil {
		t.Fatal(err)
	}
	info, err := NewKeyInfo(key.Public(), ECDSAP256SHA256, "", "pkcs11:token=a;object=ca?module-path=/m.so&pin-source=314159")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(info.URI(), "314159") {
		t.Errorf("URI() = %q shows the PIN", info.URI())
	}
}
