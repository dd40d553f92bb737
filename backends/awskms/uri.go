package awskms

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws/arn"
	"github.com/aws/aws-sdk-go-v2/service/kms/types"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
)

// URI attributes. key-id, region, signing-algorithm and description are
// path attributes, endpoint a query attribute (uri.Attr accepts each in
// either place).
const (
	attrKeyID       = "key-id"
	attrRegion      = "region"
	attrSigning     = "signing-algorithm"
	attrDescription = "description"
	attrEndpoint    = "endpoint"
)

// location is a parsed awskms URI.
type location struct {
	// keyID is the key as the URI names it: key id, key ARN, alias/NAME or
	// alias ARN. Empty in a CreateKey URI.
	keyID  string
	region string
	// signing is the signing algorithm the URI asks for; empty: the key
	// spec's default.
	signing types.SigningAlgorithmSpec
	// description is the new key's description (CreateKey URIs only).
	description string
	// endpoint replaces the SDK's endpoint for region ("" keeps it).
	endpoint string
}

// parseKeyURI parses the URI of an existing key:
// awskms:key-id=K;region=R[;signing-algorithm=A][?endpoint=URL]. It does
// no I/O.
func parseKeyURI(op, raw string) (location, error) {
	u, err := parseScheme(op, raw)
	if err != nil {
		return location{}, err
	}
	if unknown := u.Unknown(attrKeyID, attrRegion, attrSigning, attrEndpoint); len(unknown) > 0 {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, unknown[0], "unknown attribute (awskms: key URIs take key-id, region, signing-algorithm and endpoint)")
	}
	loc := location{keyID: u.Attr(attrKeyID), region: u.Attr(attrRegion)}
	if loc.keyID == "" {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, attrKeyID, "missing (want awskms:key-id=<key id, key ARN or alias/NAME>;region=<region>)")
	}
	arnRegion, err := checkKeyID(loc.keyID)
	if err != nil {
		return location{}, backends.Wrap(backends.ErrInvalidURI, op, raw, attrKeyID, err)
	}
	switch loc.region {
	case "":
		loc.region = arnRegion
	case arnRegion:
	default:
		if arnRegion != "" {
			return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, attrRegion, "%q is not the key ARN's region %q", loc.region, arnRegion)
		}
	}
	if err := checkRegion(loc.region); err != nil {
		return location{}, backends.Wrap(backends.ErrInvalidURI, op, raw, attrRegion, err)
	}
	if s := u.Attr(attrSigning); s != "" {
		loc.signing = types.SigningAlgorithmSpec(s)
		if !knownSigning(loc.signing) {
			return location{}, backends.Errorf(backends.ErrUnsupportedAlgorithm, op, raw, attrSigning, "keyward does not sign with %s", s)
		}
	}
	if loc.endpoint, err = checkEndpoint(u.Attr(attrEndpoint)); err != nil {
		return location{}, backends.Wrap(backends.ErrInvalidURI, op, raw, attrEndpoint, err)
	}
	return loc, nil
}

// parseCreateURI parses the URI CreateKey takes:
// awskms:region=R[;description=D][?endpoint=URL]. It does no I/O.
func parseCreateURI(op, raw string) (location, error) {
	u, err := parseScheme(op, raw)
	if err != nil {
		return location{}, err
	}
	if u.Attr(attrKeyID) != "" {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, attrKeyID, "a new key's URI names its region, not a key (want awskms:region=<region>)")
	}
	if unknown := u.Unknown(attrRegion, attrDescription, attrEndpoint); len(unknown) > 0 {
		return location{}, backends.Errorf(backends.ErrInvalidURI, op, raw, unknown[0], "unknown attribute (a new key's awskms: URI takes region, description and endpoint; the request's algorithm picks the signing algorithm)")
	}
	loc := location{region: u.Attr(attrRegion), description: u.Attr(attrDescription)}
	if err := checkRegion(loc.region); err != nil {
		return location{}, backends.Wrap(backends.ErrInvalidURI, op, raw, attrRegion, err)
	}
	if loc.endpoint, err = checkEndpoint(u.Attr(attrEndpoint)); err != nil {
		return location{}, backends.Wrap(backends.ErrInvalidURI, op, raw, attrEndpoint, err)
	}
	return loc, nil
}

func parseScheme(op, raw string) (*uri.URI, error) {
	u, err := uri.Parse(raw)
	if err != nil {
		return nil, backends.Wrap(backends.ErrInvalidURI, op, raw, "", err)
	}
	if u.Scheme != Scheme {
		return nil, backends.Errorf(backends.ErrInvalidURI, op, raw, "scheme", "want awskms:key-id=…;region=…")
	}
	if u.Path == nil && u.Opaque != "" {
		return nil, backends.Errorf(backends.ErrInvalidURI, op, raw, attrKeyID, "want name=value attributes: awskms:key-id=<key id, key ARN or alias/NAME>;region=<region>")
	}
	return u, nil
}

// checkKeyID checks the form of a key id, key ARN, alias/NAME or alias
// ARN, and returns an ARN's region.
func checkKeyID(id string) (arnRegion string, _ error) {
	if strings.ContainsFunc(id, func(r rune) bool { return r <= ' ' || r == 0x7f }) || len(id) > 2048 {
		return "", fmt.Errorf("%q is not a key id, key ARN or alias", id)
	}
	if !strings.HasPrefix(id, "arn:") {
		if name, ok := strings.CutPrefix(id, "alias/"); ok && name == "" {
			return "", fmt.Errorf("alias %q has no name", id)
		}
		return "", nil
	}
	a, err := arn.Parse(id)
	if err != nil {
		return "", fmt.Errorf("parsing the key ARN: %w", err)
	}
	if a.Service != "kms" || !(strings.HasPrefix(a.Resource, "key/") || strings.HasPrefix(a.Resource, "alias/")) || a.Region == "" {
		return "", fmt.Errorf("%q is not the ARN of a KMS key or alias", id)
	}
	return a.Region, nil
}

// checkRegion checks that region looks like an AWS region ("eu-west-1").
func checkRegion(region string) error {
	if region == "" {
		return fmt.Errorf("missing (give region=, or a key ARN)")
	}
	ok := len(region) <= 64 && region[0] >= 'a' && region[0] <= 'z' && region[len(region)-1] != '-'
	for _, r := range region {
		ok = ok && (r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-')
	}
	if !ok {
		return fmt.Errorf("%q is not an AWS region", region)
	}
	return nil
}

// checkEndpoint checks an endpoint URL: http or https, a host, no user
// information, query or fragment.
func checkEndpoint(s string) (string, error) {
	if s == "" {
		return "", nil
	}
	u, err := url.Parse(s)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		ue.URL = uri.Redact(ue.URL) // it quotes the URL, password and all
	}
	if err != nil {
		return "", fmt.Errorf("parsing the endpoint URL: %w", err)
	}
	if u.User != nil {
		return "", fmt.Errorf("%q carries user information: KMS credentials come from the AWS SDK's credential chain, never from the endpoint", uri.Redact(s))
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", fmt.Errorf("%q is not an http(s)://host[:port][/path] URL", uri.Redact(s))
	}
	return s, nil
}

// String is the canonical URI: key-id (as given), region, signing-algorithm
// when set, description when set, and endpoint when set.
func (l location) String() string {
	var b strings.Builder
	b.WriteString(Scheme + ":")
	sep := ""
	attr := func(name, value string) {
		if value != "" {
			b.WriteString(sep + name + "=" + escape(value))
			sep = ";"
		}
	}
	attr(attrKeyID, l.keyID)
	attr(attrRegion, l.region)
	attr(attrSigning, string(l.signing))
	attr(attrDescription, l.description)
	if l.endpoint != "" {
		b.WriteString("?" + attrEndpoint + "=" + escape(l.endpoint))
	}
	return b.String()
}

// escape percent-encodes what would end or confuse an attribute value.
func escape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-._~:/@!$'()*+,", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}
