package pkcs11

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
)

// Scheme is the URI scheme of this backend.
const Scheme = "pkcs11"

// DefaultAllowedModules are the PKCS#11 modules a Provider loads when
// Options.AllowedModules is empty: SoftHSM2 as Debian and others install it.
// Production deployments list their HSM's module explicitly.
func DefaultAllowedModules() []string {
	return []string{
		"/usr/lib/softhsm/libsofthsm2.so",
		"/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
		"/usr/lib/aarch64-linux-gnu/softhsm/libsofthsm2.so",
		"/usr/local/lib/softhsm/libsofthsm2.so",
	}
}

// location is a parsed pkcs11: key URI (RFC 7512):
//
//	pkcs11:token=<label>;object=<label>;id=<%xx bytes>?module-path=<path>&pin-source=file:<path>
//
// The token is chosen by label (token=) or serial (serial=), never by slot
// number. The PIN comes from pin-source=file:<path> or pin-source=env:<NAME>;
// pin-value is refused so that no PIN sits in a configuration file.
type location struct {
	module    string // module-path as written
	modPath   string // module-path with symlinks resolved: what is loaded
	token     string // label
	serial    string
	object    string // key label
	id        []byte // CKA_ID
	pinSource string
	alg       backends.Algorithm
}

var knownAttrs = []string{"token", "serial", "object", "id", "type", "module-path", "pin-source", "algorithm"}

func parseLocation(op, raw string, allowed []string) (location, error) {
	if strings.HasPrefix(raw, Scheme+"://") {
		// uri.Parse reads "//token" as an attribute name, which looks
		// like a secret's (…token) and would be refused as a PIN.
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, "scheme", "a pkcs11: URI has no '//' (RFC 7512): write pkcs11:token=…;object=…?module-path=…&pin-source=…")
	}
	u, err := uri.Parse(raw)
	if err != nil {
		// Parse's errors name the attribute at fault and quote no secret.
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, "", "%v (want pkcs11:token=…;object=…?module-path=…&pin-source=…)", err)
	}
	if u.Scheme != Scheme {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, "scheme", "want pkcs11:token=…;object=…?module-path=…&pin-source=…")
	}
	red := raw // Errorf redacts it
	if s := u.Secrets(); len(s) > 0 {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, s[0],
			"PINs are not accepted in URIs: use pin-source=file:/path or pin-source=env:NAME")
	}
	if u.Attr("slot-id") != "" {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "slot-id",
			"slot numbers change between reboots: select the token by token= (label) or serial=")
	}
	if unknown := u.Unknown(knownAttrs...); len(unknown) > 0 {
		// An unknown name may be a PIN's, misspelled: its value is hidden.
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, uri.RedactURIWith(raw, unknown...), unknown[0], "unknown attribute (known: %s)", strings.Join(knownAttrs, ", "))
	}
	if t := u.Attr("type"); t != "" && t != "private" {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "type", "type=%s: keyward signs with private keys (type=private or no type)", t)
	}
	loc := location{
		module:    u.Attr("module-path"),
		token:     u.Attr("token"),
		serial:    u.Attr("serial"),
		object:    u.Attr("object"),
		id:        []byte(u.Attr("id")),
		pinSource: u.Attr("pin-source"),
	}
	if len(loc.id) == 0 {
		loc.id = nil
	}
	if loc.module == "" {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "module-path", "missing (e.g. ?module-path=/usr/lib/softhsm/libsofthsm2.so)")
	}
	loc.modPath = canonicalModule(loc.module)
	if !slices.ContainsFunc(allowed, func(a string) bool { return canonicalModule(a) == loc.modPath }) {
		shown := loc.module
		if loc.modPath != filepath.Clean(loc.module) {
			shown += " (" + loc.modPath + ")"
		}
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "module-path", "%s is not in the allowed modules %v", shown, allowed)
	}
	switch {
	case loc.token == "" && loc.serial == "":
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "token", "name the token by token=<label> or serial=<serial>")
	case loc.token != "" && loc.serial != "":
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "token", "give token= or serial=, not both")
	case loc.object == "" && loc.id == nil:
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "object", "name the key by object=<label> and/or id=<CKA_ID>")
	case loc.pinSource == "":
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, red, "pin-source", "missing (pin-source=file:/path or pin-source=env:NAME)")
	}
	if a := u.Attr("algorithm"); a != "" {
		if loc.alg, err = backends.ParseAlgorithm(a); err != nil {
			return location{}, backends.Wrap(backends.ErrUnsupportedAlgorithm, op, red, "algorithm", err)
		}
	}
	return loc, nil
}

// canonicalModule is the path a module is loaded from and counted by: clean,
// with symlinks resolved, so that two spellings of one module (a symlink and
// its target) are checked against the allowlist alike and share one module
// handle in crypto11, which counts its references by path. A path that does
// not resolve is only cleaned; loading it then fails.
func canonicalModule(path string) string {
	clean := filepath.Clean(path)
	if real, err := filepath.EvalSymlinks(clean); err == nil {
		return real
	}
	return clean
}

// readPIN resolves pin-source. The PIN is never put in an error.
func (l location) readPIN() (string, error) {
	kind, ref, _ := strings.Cut(l.pinSource, ":")
	switch kind {
	case "file":
		b, err := os.ReadFile(ref)
		if err != nil {
			return "", fmt.Errorf("reading PIN file: %w", err)
		}
		pin := strings.TrimRight(string(b), "\r\n")
		if pin == "" {
			return "", fmt.Errorf("PIN file %s is empty", ref)
		}
		return pin, nil
	case "env":
		pin := os.Getenv(ref)
		if pin == "" {
			return "", fmt.Errorf("environment variable %s is empty or unset", ref)
		}
		return pin, nil
	}
	return "", errors.New("want pin-source=file:/path or pin-source=env:NAME")
}

// String is the URI without secrets, in a canonical attribute order.
func (l location) String() string {
	var path []string
	if l.token != "" {
		path = append(path, "token="+escape(l.token))
	}
	if l.serial != "" {
		path = append(path, "serial="+escape(l.serial))
	}
	if l.object != "" {
		path = append(path, "object="+escape(l.object))
	}
	if l.id != nil {
		path = append(path, "id="+escapeBytes(l.id))
	}
	q := "module-path=" + escape(l.module) + "&pin-source=" + escape(l.pinSource)
	if l.alg != "" {
		q += "&algorithm=" + string(l.alg)
	}
	return Scheme + ":" + strings.Join(path, ";") + "?" + q
}

func escape(s string) string {
	return strings.NewReplacer(";", "%3B", "?", "%3F", "&", "%26", "%", "%25", " ", "%20").Replace(s)
}

// escapeBytes percent-encodes every byte, as RFC 7512 suggests for ids.
func escapeBytes(b []byte) string {
	var sb strings.Builder
	for _, c := range b {
		fmt.Fprintf(&sb, "%%%02X", c)
	}
	return sb.String()
}

// tokenKey identifies one token: the canonical module path and the label or
// serial that selects it. The PIN source is not part of it: a token has one
// context and one login, and every open's PIN is checked against it.
type tokenKey struct {
	module, label, serial string
}

func (l location) tokenKey() tokenKey {
	return tokenKey{module: l.modPath, label: l.token, serial: l.serial}
}
