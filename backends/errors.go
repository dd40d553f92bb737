package backends

import (
	"errors"
	"fmt"
	"strings"

	"github.com/keyward/keyward/backends/uri"
)

// Sentinels for errors.Is. Every error a backend returns matches exactly one
// of ErrTransient and ErrPermanent; ErrNotFound, ErrUnsupportedAlgorithm and
// ErrInvalidURI are permanent.
var (
	// ErrNotFound: the key (or its token, key ring, …) does not exist.
	ErrNotFound = errors.New("key not found")
	// ErrUnsupportedAlgorithm: the backend or key cannot do what was asked.
	ErrUnsupportedAlgorithm = errors.New("unsupported algorithm")
	// ErrInvalidURI: the key URI is malformed or names something not allowed.
	ErrInvalidURI = errors.New("invalid key URI")
	// ErrTransient: retrying later may succeed (device error, throttling,
	// unavailable service, deadline).
	ErrTransient = errors.New("transient backend error")
	// ErrPermanent: retrying will not help (permission denied, key disabled,
	// corrupted response that keeps coming back).
	ErrPermanent = errors.New("permanent backend error")
	// ErrLoginRefused: the token refused the PIN (incorrect, invalid,
	// expired or locked). Always with ErrPermanent. Callers must not retry
	// with the same PIN source by themselves: HSMs count each refused login
	// toward locking the PIN. A PIN that could not be read (a missing or
	// empty file) is not this: no login was tried.
	ErrLoginRefused = errors.New("the token refused the login")
)

// Error is the error type backends return. Kind is one of the sentinels
// above; Part names the URI part at fault, when one is.
type Error struct {
	Kind error
	Op   string // "open", "sign", "create-key"
	// URI is the key URI; Errorf and Wrap pass it through uri.Redact, so
	// that it carries no PIN or credential.
	URI  string
	Part string // e.g. "token", "object", "module-path", "key-id"
	Err  error
	// raw is the key URI as given: Error replaces it wherever Err quotes
	// it, since free-text redaction cannot always tell where a secret ends.
	raw string
}

// Error is the message, passed through uri.Redact as a last line of
// defence: no PIN, password or URL user information that reached URI, Part
// or Err's message is shown.
func (e *Error) Error() string {
	msg := e.Op
	if e.URI != "" {
		msg += " " + e.URI
	}
	if e.Part != "" {
		msg += ": " + e.Part
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	if e.Err == nil || !errors.Is(e.Err, e.Kind) {
		msg += " (" + e.Kind.Error() + ")"
	}
	if e.raw != "" && e.raw != e.URI {
		msg = strings.ReplaceAll(msg, e.raw, e.URI)
	}
	return uri.Redact(msg)
}

// Is matches the error's Kind, and ErrPermanent for every non-transient kind.
func (e *Error) Is(target error) bool {
	if target == e.Kind {
		return true
	}
	return target == ErrPermanent && e.Kind != ErrTransient
}

func (e *Error) Unwrap() error { return e.Err }

// Errorf builds an *Error of kind for op on keyURI (redacted), blaming part.
func Errorf(kind error, op, keyURI, part, format string, args ...any) error {
	return &Error{Kind: kind, Op: op, URI: uri.RedactURI(keyURI), Part: part, Err: fmt.Errorf(format, args...), raw: keyURI}
}

// Wrap wraps err as an *Error of kind for op on keyURI (redacted), unless
// it already is one.
func Wrap(kind error, op, keyURI, part string, err error) error {
	if err == nil {
		return nil
	}
	var be *Error
	if errors.As(err, &be) {
		return err
	}
	return &Error{Kind: kind, Op: op, URI: uri.RedactURI(keyURI), Part: part, Err: err, raw: keyURI}
}

// OptionError is a backend option (a field of a backend's Options, such as
// "Retry.MaxBackoff") whose value cannot work. Option names the field.
type OptionError struct {
	Option string
	Reason string
}

func (e *OptionError) Error() string { return e.Option + ": " + e.Reason }

// IsTransient reports whether err is worth retrying.
func IsTransient(err error) bool { return errors.Is(err, ErrTransient) }
