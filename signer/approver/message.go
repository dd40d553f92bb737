package approver

import (
	"fmt"
	"unicode/utf8"
)

// A denial quotes what the request asked for (a SAN, a CN), which the
// requester chose; kube-apiserver refuses long condition messages and
// Event notes, so keyward cuts them well inside the limits (the same sizes
// as signer/pcr's).
const (
	maxConditionMessage = 4 << 10
	maxEventMessage     = 1 << 10
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
