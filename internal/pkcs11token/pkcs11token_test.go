//go:build cgo

package pkcs11token_test

import (
	"strings"
	"testing"

	"github.com/keyward/keyward/internal/pkcs11token"
	"github.com/keyward/keyward/testsupport/softhsm"
	"github.com/miekg/pkcs11"
)

// A PIN the token refuses is refused before C_InitToken, so no half-made
// token is left; a token an earlier run left without its user PIN (its
// C_InitPIN failed) is not "present", and the next run finishes it.
func TestInitTokenLeavesNoHalfMadeToken(t *testing.T) {
	env, err := softhsm.NewEnv(t.TempDir())
	if err != nil {
		t.Skipf("SoftHSM2: %v", err)
	}
	module := env.ModulePath

	if _, err := pkcs11token.InitToken(module, "short", "123456", "12"); err == nil || !strings.Contains(err.Error(), "user PIN is 2 characters") {
		t.Fatalf("InitToken with a 2-character PIN: %v, want refused naming the user PIN's length", err)
	}
	if _, err := pkcs11token.InitToken(module, "short", "123456", "1234"); err != nil {
		t.Fatalf("InitToken after the refused PIN: %v (a half-made token was left?)", err)
	}

	// An earlier run's C_InitToken without its C_InitPIN.
	p := pkcs11.New(module)
	if err := p.Initialize(); err != nil {
		t.Fatal(err)
	}
	slots, err := p.GetSlotList(true)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err == nil && ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED == 0 {
			if err := p.InitToken(s, "123456", "half"); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	_ = p.Finalize()
	p.Destroy()
	if present, err := pkcs11token.TokenPresent(module, "half"); err != nil || present {
		t.Fatalf("TokenPresent(half) = %v, %v; want false: its user PIN was never set", present, err)
	}
	if _, err := pkcs11token.InitToken(module, "half", "123456", "1234"); err != nil {
		t.Fatalf("finishing the half-made token: %v", err)
	}
	if present, err := pkcs11token.TokenPresent(module, "half"); err != nil || !present {
		t.Fatalf("TokenPresent(half) after finishing = %v, %v; want true", present, err)
	}
}
