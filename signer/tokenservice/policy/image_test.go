package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/tokenservice/policy"
)

func TestParseImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("ab", 32)
	cases := []struct {
		name       string
		image      string
		host, repo string // host "": want ErrInvalidImage
	}{
		{"a host with a tag", "registry.example.com/team/app:v1", "registry.example.com", "team/app"},
		{"a host without a tag", "registry.example.com/app", "registry.example.com", "app"},
		{"a host with a port and a digest", "localhost:5000/app@" + digest, "localhost:5000", "app"},
		{"a tag and a digest together", "registry.example.com:5000/a/b/c:v1.2_3-x@" + digest, "registry.example.com:5000", "a/b/c"},
		{"localhost alone is a host", "localhost/app", "localhost", "app"},
		{"a name with a port is a host", "registry:5000/app", "registry:5000", "app"},
		{"an IPv4 address with a port", "127.0.0.1:5000/keyward/hello:v1", "127.0.0.1:5000", "keyward/hello"},
		{"an IPv6 address with a port", "[::1]:5000/app:v1", "[::1]:5000", "app"},
		{"an uppercase first component is a host, as Docker decides", "MyRegistry/app", "MyRegistry", "app"},
		{"the host keeps its case", "Registry.Example.COM/app", "Registry.Example.COM", "app"},
		{"docker.io names are not rewritten to library/", "docker.io/alpine", "docker.io", "alpine"},

		{"an empty reference", "", "", ""},
		{"a bare name has no host", "alpine", "", ""},
		{"a bare name with a tag has no host", "alpine:3.20", "", ""},
		{"a lowercase first component is not a host", "library/alpine", "", ""},
		{"a host alone", "registry.example.com", "", ""},
		{"a host with an empty repository", "registry.example.com/", "", ""},
		{"an uppercase repository", "registry.example.com/App", "", ""},
		{"a dot-dot component", "registry.example.com/team/../other", "", ""},
		{"an empty component", "registry.example.com/team//app", "", ""},
		{"an empty tag", "registry.example.com/app:", "", ""},
		{"a tag with a slash-free colon run", "registry.example.com/app:v1:v2", "", ""},
		{"a tag too long", "registry.example.com/app:" + strings.Repeat("t", 129), "", ""},
		{"a short digest", "registry.example.com/app@sha256:abc", "", ""},
		{"an empty digest", "registry.example.com/app@", "", ""},
		{"a URL is not a reference", "https://registry.example.com/app", "", ""},
		{"a host with an underscore", "reg_istry.example.com/app", "", ""},
		{"a host with a bad port", "registry.example.com:http/app", "", ""},
		{"a repository of 256 characters", "registry.example.com/" + strings.Repeat("a", 256), "", ""},
		{"a very long reference", "registry.example.com/" + strings.Repeat("a/", 5000) + "a", "", ""},
		{"a NUL in the repository", "registry.example.com/app\x00", "", ""},
		{"a wildcard in the repository", "registry.example.com/team/*", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			host, repo, err := policy.ParseImage(tc.image)
			if tc.host == "" {
				if !errors.Is(err, policy.ErrInvalidImage) {
					t.Fatalf("ParseImage = %q, %q, %v; want ErrInvalidImage", host, repo, err)
				}
				if len(err.Error()) > 400 {
					t.Errorf("error is %d bytes long; hostile input must be cut", len(err.Error()))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if host != tc.host || repo != tc.repo {
				t.Errorf("ParseImage = %q, %q; want %q, %q", host, repo, tc.host, tc.repo)
			}
		})
	}
}
