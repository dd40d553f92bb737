//go:build !cgo

// Package softhsm makes SoftHSM2 tokens; it needs cgo, and this build has none.
package softhsm

import "errors"

// ErrNotInstalled is returned by every function in a build without cgo.
var ErrNotInstalled = errors.New("SoftHSM2 support needs cgo: this keyward was built without PKCS#11 support")

// Env is unusable without cgo.
type Env struct{ Dir, ConfPath, ModulePath string }

// Token is unusable without cgo.
type Token struct{ Label, Serial, ModulePath, PINFile string }

// PIN is empty without cgo.
func (t *Token) PIN() string { return "" }

// SOPIN is empty without cgo.
func (t *Token) SOPIN() string { return "" }

// FindModule fails without cgo.
func FindModule() (string, error) { return "", ErrNotInstalled }

// NewEnv fails without cgo.
func NewEnv(string) (*Env, error) { return nil, ErrNotInstalled }

// TokenDir is the token directory.
func (e *Env) TokenDir() string { return "" }

// NewToken fails without cgo.
func (e *Env) NewToken(string) (*Token, error) { return nil, ErrNotInstalled }
