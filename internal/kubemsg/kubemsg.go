// Package kubemsg keeps what keyward writes into a Kubernetes object's
// condition message or an Event note within the sizes kube-apiserver
// accepts. A message often quotes what a request asked for (a SAN, a CN),
// which the requester chose, so it can be arbitrarily long.
package kubemsg

import (
	"fmt"
	"unicode/utf8"
)

// Size limits of what keyward writes. kube-apiserver refuses condition
// messages over 32 KiB and Event notes over 1 KiB (events.k8s.io); keyward
// stays well inside both, so no request can make a status unwritable.
const (
	MaxConditionMessage = 4 << 10
	MaxEventMessage     = 1 << 10
)

// Truncate cuts s to at most n bytes on a rune boundary, saying how long it
// was. The note ("… (truncated, N bytes)") takes 23 bytes plus N's digits:
// for an n smaller than that, the result is the note alone and longer than n.
func Truncate(s string, n int) string {
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
