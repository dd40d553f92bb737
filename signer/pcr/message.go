package pcr

import (
	"fmt"
	"unicode/utf8"
)

// Size limits of what keyward writes. kube-apiserver refuses condition
// messages over 32 KiB and Event notes over 1 KiB (events.k8s.io); keyward
// stays well inside both, so no request can make a status unwritable.
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
