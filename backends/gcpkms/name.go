package gcpkms

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
)

// Parts of a Cloud KMS resource name, as backends.Error.Part names them.
const (
	partProjects  = "projects"
	partLocations = "locations"
	partKeyRings  = "keyRings"
	partKeys      = "cryptoKeys"
	partVersions  = "cryptoKeyVersions"
)

// collections are the collection IDs of a crypto key version name, in order.
func collections() []string {
	return []string{partProjects, partLocations, partKeyRings, partKeys, partVersions}
}

// parseURI checks a gcpkms: URI and returns the resource name it holds: a
// crypto key version when version is true (Open), else a crypto key
// (CreateKey). Errors wrap backends.ErrInvalidURI and name the part at fault.
func parseURI(op, raw string, version bool) (string, error) {
	shown := uri.RedactURI(raw)
	u, err := uri.Parse(raw)
	if err != nil {
		scheme, rest, _ := strings.Cut(raw, ":")
		if scheme != Scheme {
			return "", backends.Errorf(backends.ErrInvalidURI, op, shown, "scheme", "want %s:projects/P/locations/L/keyRings/R/cryptoKeys/K/cryptoKeyVersions/N", Scheme)
		}
		name, _, _ := strings.Cut(rest, "?")
		if part, perr := checkName(name, version); perr != nil {
			return "", backends.Wrap(backends.ErrInvalidURI, op, shown, part, perr)
		}
		return "", backends.Wrap(backends.ErrInvalidURI, op, shown, "query", err)
	}
	if u.Scheme != Scheme {
		return "", backends.Errorf(backends.ErrInvalidURI, op, shown, "scheme", "want %s:projects/P/locations/L/keyRings/R/cryptoKeys/K/cryptoKeyVersions/N", Scheme)
	}
	if part, err := checkName(u.Opaque, version); err != nil {
		return "", backends.Wrap(backends.ErrInvalidURI, op, shown, part, err)
	}
	if unknown := u.Unknown(); len(unknown) > 0 {
		return "", backends.Errorf(backends.ErrInvalidURI, op, shown, unknown[0], "unknown attribute (%s: URIs take no attributes)", Scheme)
	}
	return u.Opaque, nil
}

// checkName checks that name is a crypto key version resource name (or,
// when version is false, a crypto key name) and returns the part at fault.
func checkName(name string, version bool) (part string, err error) {
	colls := collections()
	want := 2 * len(colls)
	if !version {
		want -= 2
	}
	segs := strings.Split(name, "/")
	for i := 0; i+1 <= len(segs) && i/2 < len(colls); i += 2 {
		coll := colls[i/2]
		if segs[i] != coll {
			return coll, fmt.Errorf("segment %d is %q, want %q (form: projects/P/locations/L/keyRings/R/cryptoKeys/K/cryptoKeyVersions/N)", i+1, segs[i], coll)
		}
		if i+1 == len(segs) || segs[i+1] == "" {
			return coll, fmt.Errorf("no %s ID after %q", coll, coll+"/")
		}
		if err := checkID(coll, segs[i+1]); err != nil {
			return coll, err
		}
	}
	switch {
	case len(segs) == want:
		return "", nil
	case version && len(segs) == want-2:
		return partVersions, fmt.Errorf("no key version: a key URI pins one, …/cryptoKeys/K/cryptoKeyVersions/N")
	case !version && len(segs) > want:
		return partVersions, fmt.Errorf("creating a key takes a crypto key URI, …/cryptoKeys/K, without a version: it adds the next version")
	case len(segs) > want:
		return partVersions, fmt.Errorf("unexpected %q after the version", strings.Join(segs[want:], "/"))
	default:
		return colls[len(segs)/2], fmt.Errorf("name ends before %s", colls[len(segs)/2])
	}
}

// checkID applies Cloud KMS's rules for the IDs in a resource name.
func checkID(coll, id string) error {
	if coll == partVersions {
		n, err := strconv.ParseUint(id, 10, 64)
		if err != nil || n == 0 || strconv.FormatUint(n, 10) != id {
			return fmt.Errorf("version %q is not a positive decimal number", id)
		}
		return nil
	}
	allowed := func(r rune) bool {
		return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_'
	}
	switch coll {
	case partProjects: // project IDs, numbers, and domain-scoped "example.com:project"
		base := allowed
		allowed = func(r rune) bool { return base(r) || r == '.' || r == ':' }
	case partKeyRings, partKeys:
		if len(id) > 63 {
			return fmt.Errorf("%s ID %q is longer than 63 characters", coll, id)
		}
	}
	for _, r := range id {
		if !allowed(r) {
			return fmt.Errorf("%s ID %q has character %q", coll, id, r)
		}
	}
	return nil
}
