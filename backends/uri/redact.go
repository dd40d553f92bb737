package uri

import (
	"net/url"
	"strings"
)

// Redacted replaces every secret Redact removes.
const Redacted = "REDACTED"

// Redact returns s with its secrets replaced by Redacted, for errors, logs,
// Events and metrics. s may be a key URI, a URL or free text quoting them
// (an error message). It removes
//
//   - URL user information: https://user:pw@host → https://REDACTED@host,
//     and user:pw@host:port → REDACTED@host:port;
//   - the value of every attribute or query parameter whose name says it
//     is secret, matched case-insensitively (RFC 7512 attribute names are
//     case-insensitive) with '-', '_' and '.' ignored: pin-value, pin,
//     password, passwd, pwd, passphrase, anything naming a secret, a
//     credential, a signature or an API or access key, and *token but not
//     token itself (the PKCS#11 token label);
//   - the value of pin-source unless it is a file: or env: reference (a
//     PIN typed where its source belongs);
//   - the same inside percent-encoded text (an endpoint URL given as an
//     attribute value).
//
// A value ends at ';', '&', white space or a quote, and at '?' before the
// query. A secret value runs on over following ';', '&' or '?' segments
// that are not name=value (a separator the writer forgot to escape).
// Redact is idempotent.
func Redact(s string) string {
	out := redactPlain(s)
	if !strings.Contains(out, "%") {
		return out
	}
	// Percent-encoded secrets: decode each field that has any, and show it
	// decoded and redacted.
	for _, f := range strings.Fields(out) {
		if !strings.Contains(f, "%") {
			continue
		}
		d, err := url.PathUnescape(f)
		if err != nil || d == f {
			continue
		}
		if r := redactPlain(d); r != d {
			out = strings.Replace(out, f, r, 1)
		}
	}
	return out
}

// redactPlain redacts user information and secret values written without
// percent-encoding.
func redactPlain(s string) string {
	return redactValues(redactBareUserinfo(redactUserinfo(s)))
}

// redactUserinfo replaces what lies between "://" and the last '@' before
// the end of the URL's authority-or-path (white space, a quote, '?', '#' or
// '&'). '/' does not end it: a password with an unescaped '/' must not leak.
func redactUserinfo(s string) string {
	var b strings.Builder
	rest := s
	for {
		i := strings.Index(rest, "://")
		if i < 0 {
			break
		}
		start := i + len("://")
		end := start
		for end < len(rest) && !isSpaceOrQuote(rest[end]) && strings.IndexByte("?#&", rest[end]) < 0 {
			end++
		}
		at := strings.LastIndexByte(rest[start:end], '@')
		if at < 0 || rest[start:start+at] == Redacted {
			b.WriteString(rest[:start])
			rest = rest[start:]
			continue
		}
		b.WriteString(rest[:start] + Redacted)
		rest = rest[start+at:]
	}
	if b.Len() == 0 {
		return s
	}
	b.WriteString(rest)
	return b.String()
}

// redactBareUserinfo replaces user:password before an '@' where no
// "scheme://" precedes it: a gRPC target (user:pw@host:443) quoted by a
// dial error. What stands before the '@' back to white space, a quote, '/',
// ';', '?', '&' or '=' is replaced when it holds a ':' and a host:port
// follows the '@' (a user name alone, as in an e-mail address, and a label
// such as team:ca@prod are kept).
func redactBareUserinfo(s string) string {
	var b strings.Builder
	copied := 0
	for k := 0; k < len(s); k++ {
		if s[k] != '@' || !hostPortAt(s, k+1) {
			continue
		}
		j := k
		for j > 0 && !isSpaceOrQuote(s[j-1]) && strings.IndexByte("/;?&=", s[j-1]) < 0 {
			j--
		}
		if j < copied || !strings.Contains(s[j:k], ":") {
			continue
		}
		b.WriteString(s[copied:j] + Redacted)
		copied = k
	}
	if copied == 0 {
		return s
	}
	b.WriteString(s[copied:])
	return b.String()
}

// hostPortAt reports whether s[i:] starts with host:port.
func hostPortAt(s string, i int) bool {
	j := i
	for j < len(s) && (isNameChar(s[j]) || s[j] == '[' || s[j] == ']') {
		j++
	}
	if j == i || j >= len(s) || s[j] != ':' {
		return false
	}
	return j+1 < len(s) && s[j+1] >= '0' && s[j+1] <= '9'
}

// redactValues replaces the values of secret name=value pairs.
func redactValues(s string) string {
	var b strings.Builder
	copied, inQuery := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case isSpaceOrQuote(c):
			inQuery = false
		case c == '?':
			inQuery = true
		case c == '=':
			name := nameBefore(s, i)
			end := valueEnd(s, i+1, inQuery)
			if !secret(name, s[i+1:end]) {
				continue
			}
			end, inQuery = continuation(s, end, inQuery)
			b.WriteString(s[copied : i+1])
			b.WriteString(Redacted)
			copied = end
			i = end - 1
		}
	}
	if copied == 0 {
		return s
	}
	b.WriteString(s[copied:])
	return b.String()
}

// nameBefore is the attribute name that ends at s[i].
func nameBefore(s string, i int) string {
	j := i
	for j > 0 && isNameChar(s[j-1]) {
		j--
	}
	return s[j:i]
}

// valueEnd is where the value starting at s[start] ends.
func valueEnd(s string, start int, inQuery bool) int {
	j := start
	for j < len(s) && !endsValue(s[j], inQuery) {
		j++
	}
	return j
}

// continuation extends a secret value that ended at s[end] over following
// segments without '=': the rest of a value whose ';', '&' or '?' was not
// escaped. It returns the new end and whether it lies in the query.
func continuation(s string, end int, inQuery bool) (int, bool) {
	for end < len(s) && (s[end] == ';' || s[end] == '&' || s[end] == '?') {
		q := inQuery || s[end] == '?'
		next := valueEnd(s, end+1, q)
		seg := s[end+1 : next]
		if seg == "" || strings.Contains(seg, "=") {
			break
		}
		end, inQuery = next, q
	}
	return end, inQuery
}

func endsValue(c byte, inQuery bool) bool {
	return isSpaceOrQuote(c) || c == ';' || c == '&' || (c == '?' && !inQuery)
}

func isSpaceOrQuote(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '"' || c == '\'' || c == '`'
}

func isNameChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
}

// secret reports whether the attribute name, with this value, must not be
// shown.
func secret(name, value string) bool {
	if value == "" || strings.TrimRight(value, ":,.)") == Redacted {
		// Already redacted, maybe followed by the ": " of an error
		// message that quotes the URI: keep the punctuation.
		return false
	}
	n := normalize(name)
	switch n {
	case "pinsource":
		// A file: or env: reference, or a placeholder in a help text.
		v := strings.ToLower(value)
		return !strings.HasPrefix(v, "file:") && !strings.HasPrefix(v, "env:") && !strings.HasPrefix(v, "…") && !strings.HasPrefix(v, "<")
	case "pinvalue", "pin", "password", "passwd", "pwd", "passphrase", "sig", "auth", "authorization":
		return true
	}
	for _, part := range []string{"password", "passwd", "secret", "credential", "signature", "apikey", "accesskey", "privatekey"} {
		if strings.Contains(n, part) {
			return true
		}
	}
	return strings.HasSuffix(n, "token") && n != "token"
}

// IsSecret reports whether an attribute of this name is a secret whatever
// its value (pin-value, password, …), comparing names as Redact does and
// reading them as RedactURI does: the letters, digits, '-', '_' and '.'
// before the '=' (" pin-value " and "x;pin-value" are pin-value, "!token"
// is the token label), so that what Parse holds secret is what RedactURI
// hides.
func IsSecret(name string) bool {
	name = segmentName(name)
	return normalize(name) != "pinsource" && secret(name, "x")
}

// normalize lower-cases name and drops '-', '_' and '.'.
func normalize(name string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '-', '_', '.':
			return -1
		}
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}, name)
}

// RedactURI is Redact for a string known to be one key URI or URL, not free
// text: a value ends only where Parse ends it, at ';' and '?' in the path
// and at '&' in the query, so a secret holding white space, a quote or the
// other part's separator is hidden whole. A secret value runs on over
// following segments that are not name=value, as in Redact.
func RedactURI(s string) string {
	return RedactURIWith(s)
}

// RedactURIWith is RedactURI hiding also the values of the attributes named
// also (compared as IsSecret compares names): for a URI that names an
// attribute keyward does not know, whose value may be a secret under a
// misspelled name ("pin-valeu=1234").
func RedactURIWith(s string, also ...string) string {
	hide := secret
	if len(also) > 0 {
		extra := map[string]bool{}
		for _, n := range also {
			extra[normalize(segmentName(n))] = true
		}
		hide = func(name, value string) bool {
			// secret("pin", value): any value but an empty or redacted one.
			return secret(name, value) || extra[normalize(name)] && secret("pin", value)
		}
	}
	var b strings.Builder
	// shown: whether Redacted stands for the secret being read; not yet
	// when its value looked empty ("pin=&1234": the PIN begins with the
	// separator).
	inQuery, inSecret, shown, start := false, false, false, 0
	segment := func(seg string) {
		eq := strings.IndexByte(seg, '=')
		switch {
		case inSecret && eq < 0 && seg != "":
			// The rest of a secret whose separator was not escaped.
			if !shown {
				b.WriteString(Redacted)
				shown = true
			}
		case eq >= 0 && hide(segmentName(seg[:eq]), seg[eq+1:]):
			b.WriteString(seg[:eq+1] + Redacted)
			inSecret, shown = true, true
		case eq >= 0 && eq == len(seg)-1 && hide(segmentName(seg[:eq]), "x"):
			// A secret's name with nothing after '=' yet: what follows
			// up to the next name=value is its value.
			b.WriteString(seg)
			inSecret, shown = true, false
		default:
			b.WriteString(seg)
			inSecret = false
		}
	}
	// The first ':' ends the scheme, as Parse cuts it: no part of the
	// first attribute's name ("=:pin=1234" holds pin). It is a separator
	// like the others, so that what comes before it is judged too (a URI
	// missing "pkcs11:" whose PIN holds a ':').
	scheme := strings.IndexByte(s, ':')
	for i := start; i < len(s); i++ {
		c := s[i]
		if separates(c, inQuery) || i == scheme {
			segment(s[start:i])
			next := i + 1
			// Keep the separator unless it only continues a secret.
			if !(inSecret && next < len(s) && !strings.Contains(s[next:segEnd(s, next, inQuery || c == '?')], "=")) {
				b.WriteByte(c)
			}
			inQuery = inQuery || c == '?'
			start = next
		}
	}
	segment(s[start:])
	return Redact(redactURIUserinfo(b.String()))
}

// segmentName is the attribute name of a URI segment whose '=' follows
// head: white space before the '=' is a typo, not the end of the name, so
// "pin-value =1234" is read as pin-value (and its value hidden).
func segmentName(head string) string {
	head = strings.TrimRight(head, " \t")
	return nameBefore(head, len(head))
}

// redactURIUserinfo hides the user information of every "scheme://…@host"
// in s, wherever the authority ends ('/', '?', '#', '&', ';' or the end),
// white space included.
func redactURIUserinfo(s string) string {
	var b strings.Builder
	for {
		i := strings.Index(s, "://")
		if i < 0 {
			b.WriteString(s)
			return b.String()
		}
		auth := i + 3
		end := auth
		for end < len(s) && strings.IndexByte("/?#&;", s[end]) < 0 {
			end++
		}
		at := strings.LastIndexByte(s[auth:end], '@')
		if at < 0 || s[auth:auth+at] == Redacted {
			b.WriteString(s[:end])
		} else {
			b.WriteString(s[:auth] + Redacted + s[auth+at:end])
		}
		s = s[end:]
	}
}

// separates reports whether c ends a URI segment, as Parse splits: ';' and
// '?' in the path, '&' in the query.
func separates(c byte, inQuery bool) bool {
	if inQuery {
		return c == '&'
	}
	return c == ';' || c == '?'
}

// segEnd is where the URI segment starting at s[start] ends.
func segEnd(s string, start int, inQuery bool) int {
	for j := start; j < len(s); j++ {
		if separates(s[j], inQuery) {
			return j
		}
	}
	return len(s)
}
