package pcr

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Size limits of what keyward writes. kube-apiserver refuses condition
// messages over 32 KiB and Event notes over 1 KiB (events.k8s.io); keyward
// stays well inside both, so no request can make a status unwritable.
const (
	maxConditionMessage = 4 << 10
	maxEventMessage     = 1 << 10
	// maxQuoted is how much of a caller-supplied value a message quotes.
	maxQuoted = 64
)

// truncate cuts s to at most n bytes on a rune boundary, saying how long it
// was.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	suffix := fmt.Sprintf("… (truncated, %d bytes)", len(s))
	cut := max(n-len(suffix), 0)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + suffix
}

// quote quotes at most maxQuoted bytes of a value the requester chose,
// saying how long it was.
func quote(v string) string {
	if len(v) <= maxQuoted {
		return strconv.Quote(v)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(v[:cut]), len(v))
}
