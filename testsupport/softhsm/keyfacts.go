//go:build cgo

package softhsm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/miekg/pkcs11"
)

// Usage and protection attributes of a private key that KeyFacts reads.
var keyFlags = []uint{
	pkcs11.CKA_SENSITIVE, pkcs11.CKA_EXTRACTABLE, pkcs11.CKA_ALWAYS_SENSITIVE, pkcs11.CKA_NEVER_EXTRACTABLE,
	pkcs11.CKA_SIGN, pkcs11.CKA_DECRYPT, pkcs11.CKA_UNWRAP, pkcs11.CKA_DERIVE, pkcs11.CKA_SIGN_RECOVER,
	pkcs11.CKA_PRIVATE, pkcs11.CKA_TOKEN,
}

// FlagNames spell keyFlags for messages.
var FlagNames = map[uint]string{
	pkcs11.CKA_SENSITIVE: "CKA_SENSITIVE", pkcs11.CKA_EXTRACTABLE: "CKA_EXTRACTABLE",
	pkcs11.CKA_ALWAYS_SENSITIVE: "CKA_ALWAYS_SENSITIVE", pkcs11.CKA_NEVER_EXTRACTABLE: "CKA_NEVER_EXTRACTABLE",
	pkcs11.CKA_SIGN: "CKA_SIGN", pkcs11.CKA_DECRYPT: "CKA_DECRYPT", pkcs11.CKA_UNWRAP: "CKA_UNWRAP",
	pkcs11.CKA_DERIVE: "CKA_DERIVE", pkcs11.CKA_SIGN_RECOVER: "CKA_SIGN_RECOVER",
	pkcs11.CKA_PRIVATE: "CKA_PRIVATE", pkcs11.CKA_TOKEN: "CKA_TOKEN",
}

// Attributes that hold a private key's secret material, by key type.
var secretAttributes = map[uint][]uint{
	pkcs11.CKK_EC:  {pkcs11.CKA_VALUE},
	pkcs11.CKK_RSA: {pkcs11.CKA_PRIVATE_EXPONENT, pkcs11.CKA_PRIME_1, pkcs11.CKA_PRIME_2, pkcs11.CKA_EXPONENT_1, pkcs11.CKA_EXPONENT_2, pkcs11.CKA_COEFFICIENT},
}

// SecretNames spell the secret attributes for messages.
var SecretNames = map[uint]string{
	pkcs11.CKA_VALUE: "CKA_VALUE", pkcs11.CKA_PRIVATE_EXPONENT: "CKA_PRIVATE_EXPONENT",
	pkcs11.CKA_PRIME_1: "CKA_PRIME_1", pkcs11.CKA_PRIME_2: "CKA_PRIME_2", pkcs11.CKA_EXPONENT_1: "CKA_EXPONENT_1",
	pkcs11.CKA_EXPONENT_2: "CKA_EXPONENT_2", pkcs11.CKA_COEFFICIENT: "CKA_COEFFICIENT",
}

// KeyFacts is what the token tells any PKCS#11 application that holds the
// user PIN about one private key, and what such an application gets when
// it tries to take the key out.
type KeyFacts struct {
	// Flags holds each attribute of keyFlags the token reported.
	Flags map[uint]bool
	// Secret maps each attribute holding the key's private material to the
	// error C_GetAttributeValue gave for it: nil means the token returned
	// the value.
	Secret map[uint]error
	// Wrap is the error C_WrapKey gave for the key under a fresh AES key
	// (CKM_AES_KEY_WRAP_PAD): nil means the key left the token, wrapped.
	Wrap error
}

// KeyFacts opens its own session on t, logs in with the user PIN, finds
// the one private key labelled label and reads KeyFacts. The module is
// left initialised for others in this process (crypto11, keyward's
// backend), as pkcs11token.InitToken does.
func (t *Token) KeyFacts(label string) (*KeyFacts, error) {
	p, sess, done, err := t.session()
	if err != nil {
		return nil, err
	}
	defer done()
	if err := p.FindObjectsInit(sess, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_CLASS, pkcs11.CKO_PRIVATE_KEY), pkcs11.NewAttribute(pkcs11.CKA_LABEL, label)}); err != nil {
		return nil, fmt.Errorf("C_FindObjectsInit: %w", err)
	}
	objs, _, err := p.FindObjects(sess, 2)
	if ferr := p.FindObjectsFinal(sess); err == nil {
		err = ferr
	}
	if err != nil {
		return nil, fmt.Errorf("C_FindObjects: %w", err)
	}
	if len(objs) != 1 {
		return nil, fmt.Errorf("token %q holds %d private keys labelled %q, want 1", t.Label, len(objs), label)
	}
	key := objs[0]
	return t.facts(p, sess, key)
}

func (t *Token) facts(p *pkcs11.Ctx, sess pkcs11.SessionHandle, key pkcs11.ObjectHandle) (*KeyFacts, error) {
	f := &KeyFacts{Flags: map[uint]bool{}, Secret: map[uint]error{}}
	var tmpl []*pkcs11.Attribute
	for _, a := range keyFlags {
		tmpl = append(tmpl, pkcs11.NewAttribute(a, nil))
	}
	tmpl = append(tmpl, pkcs11.NewAttribute(pkcs11.CKA_KEY_TYPE, nil))
	attrs, err := p.GetAttributeValue(sess, key, tmpl)
	if err != nil {
		return nil, fmt.Errorf("reading the key's attributes: %w", err)
	}
	keyType := ^uint(0)
	for _, a := range attrs {
		if a.Type == pkcs11.CKA_KEY_TYPE {
			if len(a.Value) == 8 { // a CK_ULONG in host byte order
				keyType = uint(binary.NativeEndian.Uint64(a.Value))
			}
			continue
		}
		f.Flags[a.Type] = len(a.Value) == 1 && a.Value[0] != 0
	}
	secrets, ok := secretAttributes[keyType]
	if !ok {
		return nil, fmt.Errorf("key type 0x%x: no secret attributes known", keyType)
	}
	for _, a := range secrets {
		_, err := p.GetAttributeValue(sess, key, []*pkcs11.Attribute{pkcs11.NewAttribute(a, nil)})
		f.Secret[a] = err
	}
	kek, err := p.GenerateKey(sess, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_GEN, nil)}, []*pkcs11.Attribute{
		pkcs11.NewAttribute(pkcs11.CKA_TOKEN, false), pkcs11.NewAttribute(pkcs11.CKA_WRAP, true),
		pkcs11.NewAttribute(pkcs11.CKA_ENCRYPT, false), pkcs11.NewAttribute(pkcs11.CKA_VALUE_LEN, 32)})
	if err != nil {
		return nil, fmt.Errorf("making the AES wrapping key: %w", err)
	}
	defer p.DestroyObject(sess, kek)
	_, f.Wrap = p.WrapKey(sess, []*pkcs11.Mechanism{pkcs11.NewMechanism(pkcs11.CKM_AES_KEY_WRAP_PAD, nil)}, kek, key)
	return f, nil
}

// session loads the module, opens a read-write session on t and logs in
// as the user. done closes the session (logging out) and unloads this
// handle, finalising the module only if this call initialised it.
func (t *Token) session() (*pkcs11.Ctx, pkcs11.SessionHandle, func(), error) {
	p := pkcs11.New(t.ModulePath)
	if p == nil {
		return nil, 0, nil, fmt.Errorf("loading PKCS#11 module %s failed", t.ModulePath)
	}
	finalize := true
	if err := p.Initialize(); err != nil {
		if !errors.Is(err, pkcs11.Error(pkcs11.CKR_CRYPTOKI_ALREADY_INITIALIZED)) {
			p.Destroy()
			return nil, 0, nil, fmt.Errorf("C_Initialize: %w", err)
		}
		finalize = false
	}
	release := func() {
		if finalize {
			p.Finalize()
		}
		p.Destroy()
	}
	slots, err := p.GetSlotList(true)
	if err != nil {
		release()
		return nil, 0, nil, fmt.Errorf("C_GetSlotList: %w", err)
	}
	for _, s := range slots {
		ti, err := p.GetTokenInfo(s)
		if err != nil || strings.TrimSpace(ti.Label) != t.Label {
			continue
		}
		sess, err := p.OpenSession(s, pkcs11.CKF_SERIAL_SESSION|pkcs11.CKF_RW_SESSION)
		if err != nil {
			release()
			return nil, 0, nil, fmt.Errorf("C_OpenSession: %w", err)
		}
		// Another session of this process may have logged in already: the
		// login state is per application, not per session.
		if err := p.Login(sess, pkcs11.CKU_USER, t.pin); err != nil && !errors.Is(err, pkcs11.Error(pkcs11.CKR_USER_ALREADY_LOGGED_IN)) {
			p.CloseSession(sess)
			release()
			return nil, 0, nil, fmt.Errorf("C_Login: %w", err)
		}
		return p, sess, func() { p.CloseSession(sess); release() }, nil
	}
	release()
	return nil, 0, nil, fmt.Errorf("no token labelled %q", t.Label)
}

// signOnly is what every key keyward creates must say: it signs, does
// nothing else, and never leaves the token.
var signOnly = map[uint]bool{
	pkcs11.CKA_SENSITIVE: true, pkcs11.CKA_EXTRACTABLE: false, pkcs11.CKA_ALWAYS_SENSITIVE: true, pkcs11.CKA_NEVER_EXTRACTABLE: true,
	pkcs11.CKA_SIGN: true, pkcs11.CKA_DECRYPT: false, pkcs11.CKA_UNWRAP: false, pkcs11.CKA_DERIVE: false, pkcs11.CKA_SIGN_RECOVER: false,
	pkcs11.CKA_PRIVATE: true, pkcs11.CKA_TOKEN: true,
}

// SignOnlyProblems lists, one line each, every way f differs from a
// sign-only key that cannot leave the token: a usage or protection
// attribute of the wrong value, a secret attribute the token returned
// (or refused for another reason than its sensitivity), a wrap that
// succeeded. Empty means none.
func (f *KeyFacts) SignOnlyProblems() []string {
	var out []string
	for _, a := range keyFlags {
		got, ok := f.Flags[a]
		switch {
		case !ok:
			out = append(out, FlagNames[a]+" was not reported")
		case got != signOnly[a]:
			out = append(out, fmt.Sprintf("%s is %t, want %t", FlagNames[a], got, signOnly[a]))
		}
	}
	for a, err := range f.Secret {
		switch {
		case err == nil:
			out = append(out, SecretNames[a]+" was returned: the private key is readable")
		case !errors.Is(err, pkcs11.Error(pkcs11.CKR_ATTRIBUTE_SENSITIVE)):
			out = append(out, fmt.Sprintf("reading %s failed with %v, want CKR_ATTRIBUTE_SENSITIVE", SecretNames[a], err))
		}
	}
	switch {
	case f.Wrap == nil:
		out = append(out, "C_WrapKey wrapped the private key: it can leave the token")
	case !errors.Is(f.Wrap, pkcs11.Error(pkcs11.CKR_KEY_UNEXTRACTABLE)):
		out = append(out, fmt.Sprintf("C_WrapKey failed with %v, want CKR_KEY_UNEXTRACTABLE", f.Wrap))
	}
	slices.Sort(out)
	return out
}
