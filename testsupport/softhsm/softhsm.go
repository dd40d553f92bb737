//go:build cgo

// Package softhsm makes SoftHSM2 tokens for keyward's tests and demo: a
// softhsm2.conf in a directory of the caller's, tokens initialised there
// through the PKCS#11 API and selected by label, and PINs that are handed
// over in a 0600 file or by method, never on a command line or in a log.
package softhsm

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/keyward/keyward/internal/pkcs11token"
)

// EnvModule overrides where the SoftHSM2 PKCS#11 module is looked for.
const EnvModule = "SOFTHSM2_MODULE"

// ErrNotInstalled is returned (wrapped) when libsofthsm2.so cannot be found.
var ErrNotInstalled = errors.New("SoftHSM2 is not installed")

var moduleCandidates = []string{
	"/usr/lib/softhsm/libsofthsm2.so",
	"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
	"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
	"/usr/local/lib/softhsm/libsofthsm2.so",
}

// FindModule returns the path of the SoftHSM2 PKCS#11 module.
func FindModule() (string, error) {
	if p := os.Getenv(EnvModule); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%w: %s=%s: %v", ErrNotInstalled, EnvModule, p, err)
		}
		return p, nil
	}
	for _, p := range moduleCandidates {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("%w: libsofthsm2.so not found in %s: run `make deps` (installs Debian's softhsm2) or set %s",
		ErrNotInstalled, strings.Join(moduleCandidates, ", "), EnvModule)
}

// Env is a SoftHSM2 configuration whose tokens live under one directory.
// SoftHSM reads SOFTHSM2_CONF once per process, when the module is first
// initialised, so a process has one Env: NewEnv sets SOFTHSM2_CONF and must
// run before any PKCS#11 use of the module.
type Env struct {
	Dir        string
	ConfPath   string
	ModulePath string

	mu sync.Mutex
}

// NewEnv writes dir/softhsm2.conf with its token directory in dir/tokens and
// points this process's SOFTHSM2_CONF at it.
func NewEnv(dir string) (*Env, error) {
	module, err := FindModule()
	if err != nil {
		return nil, err
	}
	// The path with symlinks resolved, as keyward's pkcs11 backend loads it:
	// crypto11 keeps one module handle per path string, so a test that uses
	// crypto11 directly must spell the module as keyward does.
	if real, err := filepath.EvalSymlinks(module); err == nil {
		module = real
	}
	tokens := filepath.Join(dir, "tokens")
	if err := os.MkdirAll(tokens, 0o700); err != nil {
		return nil, fmt.Errorf("creating SoftHSM token dir: %w", err)
	}
	conf := filepath.Join(dir, "softhsm2.conf")
	body := fmt.Sprintf("directories.tokendir = %s\nobjectstore.backend = file\nlog.level = ERROR\nslots.removable = false\n", tokens)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		return nil, fmt.Errorf("writing %s: %w", conf, err)
	}
	if err := os.Setenv("SOFTHSM2_CONF", conf); err != nil {
		return nil, err
	}
	return &Env{Dir: dir, ConfPath: conf, ModulePath: module}, nil
}

// TokenDir is the directory SoftHSM keeps its token files in.
func (e *Env) TokenDir() string { return filepath.Join(e.Dir, "tokens") }

// Token is an initialised SoftHSM2 token. Its PIN is not part of its printed
// form; read it with PIN or from PINFile.
type Token struct {
	Label      string
	Serial     string
	ModulePath string
	// PINFile holds the user PIN (mode 0600), for pin-source=file:… URIs.
	PINFile string

	pin, soPIN string
}

// PIN returns the token's user PIN.
func (t *Token) PIN() string { return t.pin }

// SOPIN returns the token's security officer PIN, which nothing of keyward
// uses after the token is made; tests look for it where it must not be.
func (t *Token) SOPIN() string { return t.soPIN }

// String describes the token without its PIN.
func (t *Token) String() string {
	return fmt.Sprintf("softhsm token %q (serial %s, PIN in %s)", t.Label, t.Serial, t.PINFile)
}

// GoString keeps %#v from printing the PIN.
func (t *Token) GoString() string { return t.String() }

// NewToken initialises a new token labelled label with random SO and user
// PINs. Labels must be unique within the Env.
func (e *Env) NewToken(label string) (*Token, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	soPIN, err := randomPIN()
	if err != nil {
		return nil, err
	}
	pin, err := randomPIN()
	if err != nil {
		return nil, err
	}
	serial, err := pkcs11token.InitToken(e.ModulePath, label, soPIN, pin)
	if err != nil {
		return nil, fmt.Errorf("initialising SoftHSM token %q: %w", label, err)
	}
	pinFile := filepath.Join(e.Dir, label+".pin")
	if err := os.WriteFile(pinFile, []byte(pin), 0o600); err != nil {
		return nil, fmt.Errorf("writing PIN file: %w", err)
	}
	return &Token{Label: label, Serial: serial, ModulePath: e.ModulePath, PINFile: pinFile, pin: pin, soPIN: soPIN}, nil
}

func randomPIN() (string, error) {
	b := make([]byte, 12)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}
