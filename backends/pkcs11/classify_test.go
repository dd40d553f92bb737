//go:build cgo

package pkcs11

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/keyward/keyward/backends"
	p11 "github.com/miekg/pkcs11"
	"github.com/thales-e-security/pool"
)

func TestClassify(t *testing.T) {
	// crypto11 wraps module errors with a message; the code must still count.
	wrapped := func(code uint) error { return fmt.Errorf("failed to log into long term session: %w", p11.Error(code)) }
	tests := []struct {
		name   string
		err    error
		reopen bool
		want   error // the kind; every case is also checked against ErrTransient/ErrPermanent
	}{
		{"CKR_DEVICE_ERROR means the HSM is down", p11.Error(p11.CKR_DEVICE_ERROR), true, backends.ErrTransient},
		{"CKR_SESSION_HANDLE_INVALID means the HSM is down", p11.Error(p11.CKR_SESSION_HANDLE_INVALID), true, backends.ErrTransient},
		{"CKR_TOKEN_NOT_PRESENT means the HSM is down", p11.Error(p11.CKR_TOKEN_NOT_PRESENT), true, backends.ErrTransient},
		{"CKR_CRYPTOKI_NOT_INITIALIZED means the HSM is down", p11.Error(p11.CKR_CRYPTOKI_NOT_INITIALIZED), true, backends.ErrTransient},
		{"a wrapped CKR_DEVICE_ERROR means the HSM is down", wrapped(p11.CKR_DEVICE_ERROR), true, backends.ErrTransient},
		{"a wrapped CKR_CRYPTOKI_NOT_INITIALIZED means the HSM is down", wrapped(p11.CKR_CRYPTOKI_NOT_INITIALIZED), true, backends.ErrTransient},
		{"a stale key handle means finding the key again", p11.Error(p11.CKR_OBJECT_HANDLE_INVALID), true, backends.ErrTransient},
		{"no free session within the pool wait is transient", fmt.Errorf("signing: %w", pool.ErrTimeout), false, backends.ErrTransient},
		{"a context deadline is transient", context.DeadlineExceeded, false, backends.ErrTransient},
		{"CKR_FUNCTION_FAILED is transient", p11.Error(p11.CKR_FUNCTION_FAILED), false, backends.ErrTransient},
		{"bad arguments are the caller's fault", p11.Error(p11.CKR_ARGUMENTS_BAD), false, backends.ErrPermanent},
		{"data of the wrong length is the caller's fault", p11.Error(p11.CKR_DATA_LEN_RANGE), false, backends.ErrPermanent},
		{"invalid data is the caller's fault", wrapped(p11.CKR_DATA_INVALID), false, backends.ErrPermanent},
		{"a refused PIN is permanent", p11.Error(p11.CKR_PIN_INCORRECT), false, backends.ErrPermanent},
		{"an unknown mechanism is an unsupported algorithm", p11.Error(p11.CKR_MECHANISM_INVALID), false, backends.ErrUnsupportedAlgorithm},
		{"crypto11 refusing the options (no PKCS#11 code) is permanent", errors.New("unsupported RSA option value"), false, backends.ErrPermanent},
		{"a malformed key on the token (no PKCS#11 code) is permanent", errors.New("malformed RSA public key"), false, backends.ErrPermanent},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := needsReopen(tt.err); got != tt.reopen {
				t.Errorf("needsReopen = %t, want %t", got, tt.reopen)
			}
			err := backends.Wrap(classify(tt.err), "sign", "pkcs11:token=t;object=o", "", tt.err)
			if !errors.Is(err, tt.want) {
				t.Errorf("classified as %v, want %v", err, tt.want)
			}
			if backends.IsTransient(err) == errors.Is(err, backends.ErrPermanent) {
				t.Errorf("%v is not exactly one of transient and permanent", err)
			}
		})
	}
}

func TestIsTokenNotFound(t *testing.T) {
	// The text of crypto11 v1.6.0's unexported errTokenNotFound; the
	// end-to-end check against crypto11 itself is the "token that does not
	// exist" case of TestURIErrorsNameThePart.
	if !isTokenNotFound(errors.New("could not find PKCS#11 token")) {
		t.Error("crypto11's token-not-found error is not recognised")
	}
	for _, err := range []error{nil, p11.Error(p11.CKR_TOKEN_NOT_PRESENT), errors.New("failed to open module")} {
		if isTokenNotFound(err) {
			t.Errorf("%v taken for a missing token", err)
		}
	}
}
