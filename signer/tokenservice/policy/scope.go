package policy

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/keyward/keyward/signer/tokenservice/config"
)

// ErrInvalidScope is wrapped by ParseScope and ParseScopes for a scope
// that does not parse; the token endpoint drops such a scope.
var ErrInvalidScope = errors.New("invalid scope")

// TypeRepository is the only resource type a token grants.
const TypeRepository = "repository"

// MaxScopes bounds the scopes ParseScopes reads from one request; the rest
// are refused with one error. Clients ask for a handful (containerd: one
// or two per pull).
const MaxScopes = 64

// maxScopeLength bounds one scope: a type, a 255-character name and a few
// actions fit many times over.
const maxScopeLength = 512

// Scope is one resource scope of the registry token protocol,
// "repository:team/app:pull,push": Type, Name, Actions.
type Scope struct {
	Type    string
	Name    string
	Actions []string
}

// String is the scope as the protocol writes it.
func (s Scope) String() string {
	return s.Type + ":" + s.Name + ":" + strings.Join(s.Actions, ",")
}

var (
	// A resource type, with the optional class Docker once used
	// ("repository(plugin)"); only "repository" is ever granted.
	typeRE = regexp.MustCompile(`^[a-z0-9]+(?:\([a-z0-9]+\))?$`)
	// An action: a lowercase word or "*".
	actionRE = regexp.MustCompile(`^(?:\*|[a-z]+)$`)
	// A non-repository resource name (e.g. registry:catalog): printable,
	// no space. Such scopes are parsed only to be dropped by name.
	otherNameRE = regexp.MustCompile(`^[\x21-\x7e]+$`)
)

// ParseScope parses "type:name:actions". The name lies between the first
// and the last ':', so "repository:a:pull:extra" has the name "a:pull",
// which no repository grammar allows: an error. A repository name must
// follow Distribution's grammar (lowercase, at most 255 characters);
// actions are comma-separated lowercase words or "*", duplicates removed,
// none empty.
func ParseScope(s string) (Scope, error) {
	if len(s) > maxScopeLength {
		return Scope{}, fmt.Errorf("%w: %s: longer than %d characters", ErrInvalidScope, quote(s), maxScopeLength)
	}
	first, last := strings.IndexByte(s, ':'), strings.LastIndexByte(s, ':')
	if first < 0 || first == last {
		return Scope{}, fmt.Errorf("%w: %s: want type:name:actions", ErrInvalidScope, quote(s))
	}
	sc := Scope{Type: s[:first], Name: s[first+1 : last]}
	acts := s[last+1:]
	switch {
	case sc.Type == "" || sc.Name == "" || acts == "":
		return Scope{}, fmt.Errorf("%w: %s: type, name and actions must not be empty", ErrInvalidScope, quote(s))
	case !typeRE.MatchString(sc.Type):
		return Scope{}, fmt.Errorf("%w: %s: resource type is not a lowercase word", ErrInvalidScope, quote(s))
	case sc.Type == TypeRepository && !config.ValidRepository(sc.Name):
		return Scope{}, fmt.Errorf("%w: %s: not a repository name (lowercase path components joined by '/', at most %d characters)", ErrInvalidScope, quote(s), config.MaxRepositoryLength)
	case !otherNameRE.MatchString(sc.Name):
		return Scope{}, fmt.Errorf("%w: %s: resource name has spaces or control characters", ErrInvalidScope, quote(s))
	}
	for a := range strings.SplitSeq(acts, ",") {
		if !actionRE.MatchString(a) {
			return Scope{}, fmt.Errorf("%w: %s: actions must be comma-separated lowercase words or *", ErrInvalidScope, quote(s))
		}
		if !slices.Contains(sc.Actions, a) {
			sc.Actions = append(sc.Actions, a)
		}
	}
	return sc, nil
}

// ParseScopes parses the scope parameters of a token request; each value
// may hold several scopes separated by spaces (the POST form's scope). It
// returns the scopes that parse and one error per scope that does not,
// reading at most MaxScopes scopes.
func ParseScopes(values []string) ([]Scope, []error) {
	var (
		scopes []Scope
		errs   []error
		n      int
	)
	for _, v := range values {
		for f := range strings.FieldsSeq(v) {
			if n++; n > MaxScopes {
				return scopes, append(errs, fmt.Errorf("%w: more than %d scopes in one request; the rest are ignored", ErrInvalidScope, MaxScopes))
			}
			sc, err := ParseScope(f)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			scopes = append(scopes, sc)
		}
	}
	return scopes, errs
}

// quote quotes s for an error message, cut to a length a log line can
// carry.
func quote(s string) string {
	const limit = 80
	if len(s) > limit {
		return fmt.Sprintf("%q…(%d bytes)", s[:limit], len(s))
	}
	return fmt.Sprintf("%q", s)
}
