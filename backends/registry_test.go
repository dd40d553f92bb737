package backends

import (
	"context"
	"errors"
	"strings"
	"testing"
)

type stubProvider struct{ scheme string }

func (p stubProvider) Scheme() string        { return p.scheme }
func (stubProvider) Algorithms() []Algorithm { return nil }
func (stubProvider) Close() error            { return nil }
func (stubProvider) Open(context.Context, OpenRequest) (Signer, error) {
	return nil, errors.New("not reached")
}

// A URI the registry cannot route is ErrInvalidURI blaming the scheme,
// names the operation, suggests the lower-case spelling of an upper-case
// scheme, and does not show a PIN.
func TestRegistryRefusesURIsItCannotRoute(t *testing.T) {
	reg, err := NewRegistry(stubProvider{scheme: "pkcs11"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, uri, op, wantText string
	}{
		{"an unknown scheme", "nosuch:pin-value=314159", "open", `no backend for scheme "nosuch"`},
		{"an upper-case scheme", "PKCS11:token=a;PIN-VALUE=314159", "open", `schemes are lower case, "pkcs11"`},
		{"an upper-case scheme when creating a key", "PKCS11:token=a?Pin-Value=314159", "create-key", `schemes are lower case, "pkcs11"`},
		{"no scheme", "pin-value=314159", "open", "no scheme"},
		{"a PIN where the scheme belongs", "token=a;pin-value=314159:x", "create-key", "no scheme"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.op == "open" {
				_, err = reg.Open(context.Background(), OpenRequest{URI: tc.uri})
			} else {
				_, err = reg.CreateKey(context.Background(), CreateKeyRequest{URI: tc.uri, Algorithm: ECDSAP256SHA256})
			}
			var be *Error
			if !errors.Is(err, ErrInvalidURI) || !errors.As(err, &be) || be.Part != "scheme" || be.Op != tc.op {
				t.Fatalf("got %v, want ErrInvalidURI for %s blaming the scheme", err, tc.op)
			}
			// The test is about the message's text.
			if msg := err.Error(); !strings.Contains(msg, tc.wantText) || strings.Contains(msg, "314159") {
				t.Errorf("message %q: want it to say %q and not show the PIN", msg, tc.wantText)
			}
		})
	}
}
