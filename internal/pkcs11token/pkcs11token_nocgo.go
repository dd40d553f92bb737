//go:build !cgo

// Package pkcs11token initialises PKCS#11 tokens; it needs cgo, and this build has none.
package pkcs11token

import "errors"

// ErrNoCgo is returned by every function in a build without cgo.
var ErrNoCgo = errors.New("SoftHSM2 support needs cgo: this keyward was built without PKCS#11 support")

// InitToken fails without cgo.
func InitToken(string, string, string, string) (string, error) { return "", ErrNoCgo }

// TokenPresent fails without cgo.
func TokenPresent(string, string) (bool, error) { return false, ErrNoCgo }
