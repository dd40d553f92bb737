//go:build cgo

// Package pkcs11token initialises a token in a PKCS#11 module's free slot
// (C_InitToken, C_InitPIN) with PINs handed over by the caller, never on a
// command line, and tells whether a token is present: what `keyward key
// init-token` does for a SoftHSM2 token, and what the SoftHSM2 test support
// builds its tokens with.
package pkcs11token

import (
	"errors"
	"fmt"
	"strings"

	"github.com/miekg/pkcs11"
)

// InitToken initialises a token labelled label in the free slot of the
// SoftHSM2 module at module path, with SO PIN soPIN and user PIN pin, all
// through the PKCS#11 API (C_InitToken, C_InitPIN): no PIN is ever on a
// command line. It returns the token's serial. SoftHSM reads SOFTHSM2_CONF
// from the environment.
func InitToken(module, label, soPIN, pin string) (string, error) {
	if soPIN == "" || pin == "" {
		return "", errors.New("initialising a token needs a non-empty SO PIN and user PIN")
	}
	return initToken(module, label, soPIN, pin)
}

// TokenPresent reports whether the module has an initialised token
// labelled label whose user PIN is set too: a token whose C_InitPIN failed
// is not present (InitToken finishes it).
func TokenPresent(module, label string) (bool, error) {
	p := pkcs11.New(module)
	if p == nil {
		return false, fmt.Errorf("loading PKCS#11 module %s failed", module)
	}
	defer p.Destroy()
	if err := p.Initialize(); err != nil {
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			return false, fmt.Errorf("C_Initialize: %w", err)
		}
	} else {
		defer p.Finalize()
	}
	slots, err := p.GetSlotList(true)
	if err != nil {
		return false, fmt.Errorf("C_GetSlotList: %w", err)
	}
	for _, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err != nil {
			return false, fmt.Errorf("C_GetTokenInfo: %w", err)
		}
		if strings.TrimSpace(ti.Label) == label && ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED != 0 && ti.Flags&pkcs11.CKF_USER_PIN_INITIALIZED != 0 {
			return true, nil
		}
	}
	return false, nil
}

// pinFits checks a PIN against a token's length limits before any call
// that would leave a half-made token behind.
func pinFits(what, pin string, ti pkcs11.TokenInfo) error {
	if n := uint(len(pin)); (ti.MinPinLen > 0 && n < ti.MinPinLen) || (ti.MaxPinLen > 0 && n > ti.MaxPinLen) {
		return fmt.Errorf("the %s is %d characters; the token takes %d to %d", what, n, ti.MinPinLen, ti.MaxPinLen)
	}
	return nil
}

// initToken finds the free slot SoftHSM always offers, initialises a token
// there and sets its user PIN. If another part of this process (crypto11)
// already initialised the module, it is used as it is and left initialised.
func initToken(module, label, soPIN, pin string) (string, error) {
	p := pkcs11.New(module)
	if p == nil {
		return "", fmt.Errorf("loading PKCS#11 module %s failed", module)
	}
	defer p.Destroy()
	finalize := true
	if err := p.Initialize(); err != nil {
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			return "", fmt.Errorf("C_Initialize: %w", err)
		}
		finalize = false
	}
	if finalize {
		defer p.Finalize()
	}
	slots, err := p.GetSlotList(true)
	if err != nil {
		return "", fmt.Errorf("C_GetSlotList: %w", err)
	}
	free := -1
	var freeInfo pkcs11.TokenInfo
	halfMade := false
	for i, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err != nil {
			return "", fmt.Errorf("C_GetTokenInfo: %w", err)
		}
		if strings.TrimSpace(ti.Label) == label && ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED != 0 {
			if ti.Flags&pkcs11.CKF_USER_PIN_INITIALIZED != 0 {
				return "", fmt.Errorf("a token labelled %q already exists", label)
			}
			// An earlier run's C_InitPIN failed: finish it below.
			if err := pinFits("user PIN", pin, ti); err != nil {
				return "", err
			}
			halfMade = true
			break
		}
		if free < 0 && ti.Flags&pkcs11.CKF_TOKEN_INITIALIZED == 0 {
			free, freeInfo = i, ti
		}
	}
	if !halfMade {
		if free < 0 {
			return "", errors.New("SoftHSM offers no free slot")
		}
		for _, c := range []struct{ what, pin string }{{"SO PIN", soPIN}, {"user PIN", pin}} {
			if err := pinFits(c.what, c.pin, freeInfo); err != nil {
				return "", err
			}
		}
		if err := p.InitToken(slots[free], soPIN, label); err != nil {
			return "", fmt.Errorf("C_InitToken: %w", err)
		}
	}
	// SoftHSM moves the initialised token to a slot of its own; find it again by label.
	slots, err = p.GetSlotList(true)
	if err != nil {
		return "", fmt.Errorf("C_GetSlotList: %w", err)
	}
	for _, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err != nil || strings.TrimSpace(ti.Label) != label {
			continue
		}
		sess, err := p.OpenSession(s, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			return "", fmt.Errorf("C_OpenSession: %w", err)
		}
		defer p.CloseSession(sess)
		if err := p.Login(sess, pkcs11.CKU_SO, soPIN); err != nil {
			return "", fmt.Errorf("C_Login as SO: %w", err)
		}
		defer p.Logout(sess)
		if err := p.InitPIN(sess, pin); err != nil {
			return "", fmt.Errorf("C_InitPIN: %w", err)
		}
		return strings.TrimSpace(ti.SerialNumber), nil
	}
	return "", fmt.Errorf("token %q not found after C_InitToken", label)
}
