package uripattern

import (
	"net/url"
	"slices"
	"testing"
)

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, uri string
		want         bool
	}{
		{"spiffe://td/ns/*", "spiffe://td/ns/a", true},
		{"spiffe://td/ns/*", "spiffe://td/ns/a/sa/b", true},
		{"spiffe://td/ns/a", "spiffe://td/ns/a", true},
		{"spiffe://td/ns/a", "spiffe://td/ns/b", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/", false},
		{"spiffe://td/ns/*", "spiffe://td/other/a", false},
		{"spiffe://td/ns/a/*", "spiffe://td/ns/a/../b", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/../x", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/./x", false},
		{"spiffe://td/ns/*", "spiffe://td/ns//a", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/a/", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/%2e%2e/a", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/a?x=1", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/a?", false},
		{"spiffe://td/ns/*", "spiffe://td/ns/a#f", false},
		{"spiffe://td/*", "spiffe://user@td/a", false},
	} {
		u, err := url.Parse(tc.uri)
		if err != nil {
			t.Fatal(err)
		}
		if got := Match(tc.pattern, u); got != tc.want {
			t.Errorf("Match(%q, %q) = %v, want %v", tc.pattern, tc.uri, got, tc.want)
		}
	}
}

func TestUnderSegments(t *testing.T) {
	u, _ := url.Parse("https://node.example/nodes/n1/kubelet")
	segs, ok := Under(u, "https://node.example/nodes/")
	if !ok || !slices.Equal(segs, []string{"n1", "kubelet"}) {
		t.Fatalf("Under = %q, %v; want [n1 kubelet], true", segs, ok)
	}
}
