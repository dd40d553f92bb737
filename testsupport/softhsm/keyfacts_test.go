//go:build cgo

package softhsm

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/pkcs11"
)

// KeyFacts sees a key that can leave the token: for an EC key made
// extractable and not sensitive, its CKA_VALUE reads and C_WrapKey wraps
// it, and SignOnlyProblems names each. Without this, a check that keyward's keys cannot leave would pass
// for a reader that never manages to read anything.
func TestKeyFactsSeesAnExportableKey(t *testing.T) {
	env, err := NewEnv(filepath.Join(t.TempDir(), "softhsm"))
	if errors.Is(err, ErrNotInstalled) && os.Getenv("CI") == "" {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	tok, err := env.NewToken("facts")
	if err != nil {
		t.Fatal(err)
	}
	p, sess, done, err := tok.session()
	if err != nil {
		t.Fatal(err)
	}
	p256 := []byte{0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07}
	_, _, err = p.GenerateKeyPair(sess, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_EC_KEY_PAIR_GEN, nil)},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_EC_PARAMS, p256),
			pkcs11.NewAttribute(pkcs11.CKA_VERIFY, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "exportable")},
		[]*pkcs11.Attribute{pkcs11.NewAttribute(pkcs11.CKA_TOKEN, true), pkcs11.NewAttribute(pkcs11.CKA_PRIVATE, true),
			pkcs11.NewAttribute(pkcs11.CKA_SIGN, true), pkcs11.NewAttribute(pkcs11.CKA_SENSITIVE, false),
			pkcs11.NewAttribute(pkcs11.CKA_EXTRACTABLE, true), pkcs11.NewAttribute(pkcs11.CKA_LABEL, "exportable")})
	done()
	if err != nil {
		t.Fatalf("generating the exportable control key: %v", err)
	}
	f, err := tok.KeyFacts("exportable")
	if err != nil {
		t.Fatal(err)
	}
	if f.Flags[pkcs11.CKA_SENSITIVE] || !f.Flags[pkcs11.CKA_EXTRACTABLE] {
		t.Errorf("flags %v: want CKA_SENSITIVE false, CKA_EXTRACTABLE true as generated", f.Flags)
	}
	if err := f.Secret[pkcs11.CKA_VALUE]; err != nil {
		t.Errorf("reading CKA_VALUE of a non-sensitive key: %v, want the value", err)
	}
	if f.Wrap != nil {
		t.Errorf("wrapping an extractable key: %v, want it wrapped", f.Wrap)
	}
	problems := strings.Join(f.SignOnlyProblems(), "\n")
	for _, want := range []string{"CKA_SENSITIVE is false, want true", "CKA_EXTRACTABLE is true, want false",
		"CKA_VALUE was returned", "C_WrapKey wrapped the private key"} {
		if !strings.Contains(problems, want) {
			t.Errorf("SignOnlyProblems of the exportable key:\n%s\nwant a line with %q", problems, want)
		}
	}
}
