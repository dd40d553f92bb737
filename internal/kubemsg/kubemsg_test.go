package kubemsg

import (
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTruncate(t *testing.T) {
	cases := []struct {
		name string
		s    string
		n    int
	}{
		{"a message within the limit is kept as is", "short", 64},
		{"a long ASCII message is cut to the limit", strings.Repeat("a", 10<<10), MaxConditionMessage},
		{"a long message is cut on a rune boundary", strings.Repeat("é", 10<<10), MaxEventMessage},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Truncate(tc.s, tc.n)
			if len(tc.s) <= tc.n {
				if got != tc.s {
					t.Fatalf("Truncate changed %q to %q", tc.s, got)
				}
				return
			}
			if !utf8.ValidString(got) || !strings.Contains(got, "truncated") {
				t.Fatalf("Truncate = %q, want valid UTF-8 saying it was truncated", got)
			}
			if len(got) > tc.n {
				t.Fatalf("Truncate = %d bytes, want at most %d", len(got), tc.n)
			}
		})
	}
}
