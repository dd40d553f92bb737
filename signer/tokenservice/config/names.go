package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// Repository names follow the grammar of the CNCF Distribution registry
// (github.com/distribution/reference): path components of lowercase
// letters and digits, separated inside a component by ".", "_", "__" or a
// run of "-", joined by "/"; at most 255 characters in all. A name the
// grammar refuses is one no registry serves, so the token service never
// grants it.
var pathComponentRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)

// MaxRepositoryLength is the longest repository name Distribution accepts.
const MaxRepositoryLength = 255

// ValidPathComponent reports whether s is one path component of a
// repository name (no "/").
func ValidPathComponent(s string) bool { return pathComponentRE.MatchString(s) }

// ValidRepository reports whether name is a repository name in
// Distribution's grammar (without a registry host).
func ValidRepository(name string) bool {
	if name == "" || len(name) > MaxRepositoryLength {
		return false
	}
	for c := range strings.SplitSeq(name, "/") {
		if !ValidPathComponent(c) {
			return false
		}
	}
	return true
}

// Placeholders a repository pattern may hold; each is replaced by the
// caller's namespace or service-account name before matching.
const (
	PlaceholderNamespace      = "${namespace}"
	PlaceholderServiceAccount = "${serviceAccount}"
)

// AllRepositories is the pattern that matches every repository name.
const AllRepositories = "**"

// ErrInvalidPattern is wrapped by CheckRepositoryPattern.
var ErrInvalidPattern = errors.New("invalid repository pattern")

// CheckRepositoryPattern reports whether p is a repository pattern:
// a repository name in which "*" stands for any run of characters within
// one path component, ${namespace} and ${serviceAccount} for the
// caller's names, and a trailing "/**" for one or more further path
// components ("team/**" matches "team/a" and "team/a/b", not "team").
// "**" alone matches every repository. Nothing else ("?", "[", "**"
// elsewhere, other ${…}, uppercase) is a pattern.
func CheckRepositoryPattern(p string) error {
	if p == AllRepositories {
		return nil
	}
	prefix := strings.TrimSuffix(p, "/**")
	if prefix == "" {
		return fmt.Errorf("%w: empty", ErrInvalidPattern)
	}
	if strings.Contains(prefix, "**") {
		return fmt.Errorf("%w: \"**\" only as the whole last path component (\"team/**\") or the whole pattern", ErrInvalidPattern)
	}
	// Every placeholder and wildcard stands for at least one character
	// that keeps its component valid; what is left must be a repository
	// name, so a pattern that can match no name is refused.
	sample := strings.NewReplacer(PlaceholderNamespace, "x", PlaceholderServiceAccount, "x", "*", "x").Replace(prefix)
	if strings.Contains(sample, "$") {
		return fmt.Errorf("%w: the only placeholders are %s and %s", ErrInvalidPattern, PlaceholderNamespace, PlaceholderServiceAccount)
	}
	if !ValidRepository(sample) {
		return fmt.Errorf("%w: want lowercase path components ([a-z0-9] separated by '.', '_', '__' or '-') joined by '/', with '*' within a component and an optional trailing \"/**\"", ErrInvalidPattern)
	}
	return nil
}

// hostRE is an image reference's registry host as Distribution's
// reference grammar has it: DNS labels (any case) joined by "." or an
// IPv6 address in brackets, with an optional port.
var hostRE = regexp.MustCompile(`^(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*|\[[a-fA-F0-9:]+\])(?::[0-9]+)?$`)

// ValidHost reports whether h is a registry host as written in an image
// reference: host or host:port.
func ValidHost(h string) bool { return len(h) <= 255 && hostRE.MatchString(h) }
