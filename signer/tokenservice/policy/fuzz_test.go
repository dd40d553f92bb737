package policy_test

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
)

// FuzzParseScopes: whatever a client sends, every scope that parses
// round-trips through its String form, a repository scope names a valid
// repository, at most MaxScopes are read, and Grant under a policy that
// allows everything writes only valid names and the three actions, never
// "*".
func FuzzParseScopes(f *testing.F) {
	for _, s := range []string{
		"repository:team/app:pull,push",
		"repository:a:pull repository:b:*",
		"registry:catalog:*",
		"repository:a:pull:extra",
		"repository(plugin):a:pull",
		"repository:a//b:pull",
	} {
		f.Add(s, "repository:team/app:pull")
	}
	p, err := policy.New(&config.TokenServiceConfiguration{
		Registries: []config.Registry{{Service: "r"}},
		Rules: []config.Rule{{Namespaces: []string{"*"}, Repositories: []string{"**"},
			Actions: []string{config.ActionPull, config.ActionPush, config.ActionDelete}}},
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		scopes, errs := policy.ParseScopes([]string{a, b})
		if len(scopes) > policy.MaxScopes {
			t.Fatalf("%d scopes read, more than %d", len(scopes), policy.MaxScopes)
		}
		if len(scopes)+len(errs) == 0 && strings.TrimSpace(a+" "+b) != "" {
			t.Fatalf("%q %q: neither a scope nor an error", a, b)
		}
		for _, s := range scopes {
			again, err := policy.ParseScope(s.String())
			if err != nil || !reflect.DeepEqual(again, s) {
				t.Fatalf("%+v does not round-trip: %+v, %v", s, again, err)
			}
			if s.Type == policy.TypeRepository && !config.ValidRepository(s.Name) {
				t.Fatalf("invalid repository %q parsed", s.Name)
			}
			if len(s.Actions) == 0 {
				t.Fatalf("%+v has no actions", s)
			}
		}
		granted, dropped := p.Grant(policy.Identity{Namespace: "ns", ServiceAccount: "sa"}, "r", scopes)
		for _, g := range granted {
			if g.Type != policy.TypeRepository || !config.ValidRepository(g.Name) || len(g.Actions) == 0 {
				t.Fatalf("granted %+v", g)
			}
			for _, act := range g.Actions {
				if !slices.Contains([]string{config.ActionPull, config.ActionPush, config.ActionDelete}, act) {
					t.Fatalf("granted action %q in %+v", act, g)
				}
			}
		}
		for _, d := range dropped {
			if d.Type == policy.TypeRepository && slices.ContainsFunc(d.Actions, func(a string) bool {
				return a == config.ActionPull || a == config.ActionPush || a == config.ActionDelete || a == "*"
			}) {
				t.Fatalf("dropped %+v under a policy that allows every action on every repository", d)
			}
		}
	})
}

// FuzzParseImage: an accepted reference yields a valid host and repository
// that the reference starts with, and host/repository parses to itself.
func FuzzParseImage(f *testing.F) {
	for _, s := range []string{
		"registry.example.com/team/app:v1",
		"localhost:5000/app@sha256:0123456789abcdef0123456789abcdef",
		"[::1]:5000/a/b:c",
		"alpine",
		"MyRegistry/app",
		"registry.example.com/app:v1@sha256:0123456789abcdef0123456789abcdef0123",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, image string) {
		host, repo, err := policy.ParseImage(image)
		if err != nil {
			return
		}
		if !config.ValidHost(host) || !config.ValidRepository(repo) {
			t.Fatalf("%q: host %q repository %q", image, host, repo)
		}
		if !strings.HasPrefix(image, host+"/"+repo) {
			t.Fatalf("%q does not start with %q/%q", image, host, repo)
		}
		h2, r2, err := policy.ParseImage(host + "/" + repo)
		if err != nil || h2 != host || r2 != repo {
			t.Fatalf("%q/%q parses to %q, %q, %v", host, repo, h2, r2, err)
		}
	})
}
