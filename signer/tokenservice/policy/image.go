package policy

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/keyward/keyward/signer/tokenservice/config"
)

// ErrInvalidImage is wrapped by ParseImage.
var ErrInvalidImage = errors.New("invalid image reference")

// maxImageLength bounds an image reference: a host, a 255-character
// repository, a 128-character tag and a digest fit.
const maxImageLength = 1024

var (
	tagRE    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	digestRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}$`)
)

// ParseImage splits an image reference "host[:port]/repository[:tag][@digest]"
// into its registry host (as written) and repository; the tag and digest
// are checked and dropped. The first path component is the host, as
// Docker decides it, iff it holds a '.' or ':', is "localhost", or has an
// uppercase letter; a reference without one is an error: keyward never
// guesses docker.io, and does not rewrite docker.io names (no "library/").
func ParseImage(image string) (host, repository string, err error) {
	if image == "" {
		return "", "", fmt.Errorf("%w: empty", ErrInvalidImage)
	}
	if len(image) > maxImageLength {
		return "", "", fmt.Errorf("%w: %s: longer than %d characters", ErrInvalidImage, quote(image), maxImageLength)
	}
	host, rest, ok := strings.Cut(image, "/")
	if !ok || !(strings.ContainsAny(host, ".:") || host == "localhost" || strings.ToLower(host) != host) {
		return "", "", fmt.Errorf("%w: %s names no registry host (host[:port]/repository; keyward does not assume docker.io)", ErrInvalidImage, quote(image))
	}
	if !config.ValidHost(host) {
		return "", "", fmt.Errorf("%w: %s: %s is not a registry host[:port]", ErrInvalidImage, quote(image), quote(host))
	}
	if name, digest, ok := strings.Cut(rest, "@"); ok {
		if !digestRE.MatchString(digest) {
			return "", "", fmt.Errorf("%w: %s: %s is not a digest", ErrInvalidImage, quote(image), quote(digest))
		}
		rest = name
	}
	if i := strings.LastIndexByte(rest, ':'); i >= 0 && !strings.Contains(rest[i:], "/") {
		if !tagRE.MatchString(rest[i+1:]) {
			return "", "", fmt.Errorf("%w: %s: %s is not a tag", ErrInvalidImage, quote(image), quote(rest[i+1:]))
		}
		rest = rest[:i]
	}
	if !config.ValidRepository(rest) {
		return "", "", fmt.Errorf("%w: %s: %s is not a repository name (lowercase path components joined by '/', at most %d characters)", ErrInvalidImage, quote(image), quote(rest), config.MaxRepositoryLength)
	}
	return host, rest, nil
}
