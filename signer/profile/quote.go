package profile

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// MaxQuoted is how much of a value the requester chose a message quotes.
const MaxQuoted = 64

// Quote quotes at most MaxQuoted bytes of v, a value the requester chose,
// and says how long it was: a denial must stay readable and small whatever
// the request carried.
func Quote(v string) string {
	if len(v) <= MaxQuoted {
		return strconv.Quote(v)
	}
	cut := MaxQuoted
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d bytes)", strconv.Quote(v[:cut]), len(v))
}
