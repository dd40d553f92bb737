package uri

import "testing"

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
	} {
		if got := Redact(tc.in); got != tc.want {
			t.Errorf("%s: Redact(%q) = %q, want %q", tc.name, tc.in, got, tc.want)
		}
	}
}
