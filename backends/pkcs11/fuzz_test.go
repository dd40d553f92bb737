package pkcs11

// No build constraint: location.go is shared by the cgo and the !cgo
// build, and so is its fuzz target.

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
)

// FuzzParseLocation: whatever a key URI holds, parseLocation never panics;
// it refuses with a *backends.Error of kind ErrInvalidURI or
// ErrUnsupportedAlgorithm that quotes no PIN it was given, or its location
// formats (String) to a URI that parses to the same location and formats
// to the same text again.
func FuzzParseLocation(f *testing.F) {
	const mod = "/usr/lib/softhsm/libsofthsm2.so"
	for _, s := range []string{
		"pkcs11:token=keyward;object=ca-2026?module-path=" + mod + "&pin-source=file:/etc/keyward/pin",
		"pkcs11:serial=7f1c2a9d03e4b5c6;id=%01%A2?module-path=" + mod + "&pin-source=env:KEYWARD_PIN&algorithm=ecdsa-p256-sha256",
		"pkcs11:token=My%20Token%3Bx;object=a%26b;type=private?module-path=/usr/lib/softhsm/../softhsm/libsofthsm2.so&pin-source=file:/run/pin",
		"pkcs11:?token=t&object=o&module-path=" + mod + "&pin-source=file:/p",
		"pkcs11:token=t;object=o;pin-value=s3cr3t-1234?module-path=" + mod,
		"pkcs11:token=t;object=o?module-path=" + mod + "&pin-source=file:/p&pin-value=s3cr3t;5678",
		"pkcs11:token=t;object=o;pin-value =s3cr3t-9876?module-path=" + mod + "&pin-source=file:/p",
		"pkcs11://token=t;object=o?module-path=" + mod + "&pin-source=file:/p",
		"pkcs11:slot-id=0;object=o?module-path=" + mod + "&pin-source=file:/p",
		"pkcs11:token=t;object=o?module-path=/tmp/evil.so&pin-source=file:/p",
		"pkcs11:token=t;object=o?module-path=" + mod + "&pin-source=file:/p&algorithm=dsa",
		"pkcs11:token=%ZZ",
	} {
		f.Add(s)
	}
	allowed := []string{mod}
	f.Fuzz(func(t *testing.T, raw string) {
		loc, err := parseLocation("open", raw, allowed)
		if err != nil {
			var be *backends.Error
			if !errors.As(err, &be) || !(errors.Is(err, backends.ErrInvalidURI) || errors.Is(err, backends.ErrUnsupportedAlgorithm)) {
				t.Fatalf("%q: %T %v, want an invalid-URI or unsupported-algorithm *backends.Error", raw, err, err)
			}
			for _, pin := range secretValues(raw) {
				if !strings.Contains(err.Error(), pin) {
					continue
				}
				// Unless keyward's own text holds it ("file:/" is in
				// every pin-source hint): then it stays with the PIN
				// replaced.
				other := strings.Replace(raw, pin, strings.Repeat("Q", len(pin)), 1)
				if _, err2 := parseLocation("open", other, allowed); err2 == nil || !strings.Contains(err2.Error(), pin) {
					t.Fatalf("%q: error quotes the PIN %q: %v", raw, pin, err)
				}
			}
			return
		}
		formatted := loc.String()
		again, err := parseLocation("open", formatted, allowed)
		if err != nil {
			t.Fatalf("%q formats to %q, which does not parse: %v", raw, formatted, err)
		}
		if !reflect.DeepEqual(again, loc) {
			t.Fatalf("%q formats to %q, which parses to another location:\n%#v\n%#v", raw, formatted, loc, again)
		}
		if s := again.String(); s != formatted {
			t.Fatalf("%q: String is not canonical: %q, then %q", raw, formatted, s)
		}
	})
}

// secretValues returns the values of raw's secret attributes (pin-value
// and the like) that appear once in raw and are long enough that finding
// one in an error is no coincidence.
func secretValues(raw string) []string {
	u, err := uri.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	for _, name := range u.Secrets() {
		for _, m := range []map[string]string{u.Path, u.Query} {
			if v, ok := m[name]; ok && len(v) >= 6 && strings.Count(raw, v) == 1 {
				out = append(out, v)
			}
		}
	}
	return out
}
