package policy_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/signer/tokenservice/policy"
)

const svc = "registry.example.com"

func newPolicy(t *testing.T, rules ...config.Rule) *policy.Policy {
	t.Helper()
	p, err := policy.New(&config.TokenServiceConfiguration{
		Registries: []config.Registry{
			{Service: svc},
			{Service: "mirror", Hosts: []string{"mirror.example.com", "mirror.example.com:5000"}},
		},
		Rules: rules,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func id(ns, sa string) policy.Identity {
	return policy.Identity{Namespace: ns, ServiceAccount: sa, PodName: "p", PodUID: "u", NodeName: "n"}
}

// Pattern semantics, through Allows (pull).
func TestRepositoryPatterns(t *testing.T) {
	cases := []struct {
		name    string
		pattern string
		who     policy.Identity
		repo    string
		want    bool
	}{
		{"a literal matches itself", "team/app", id("a", "b"), "team/app", true},
		{"a literal does not match a longer name", "team/app", id("a", "b"), "team/app/x", false},
		{"a star matches one component", "*", id("a", "b"), "app", true},
		{"a star does not cross a slash", "*", id("a", "b"), "team/app", false},
		{"a star within a component matches a suffix", "team/app-*", id("a", "b"), "team/app-one", true},
		{"a star within a component needs its literal part", "team/app-*", id("a", "b"), "team/web-one", false},
		{"team/* matches a child", "team/*", id("a", "b"), "team/app", true},
		{"team/* does not match a grandchild", "team/*", id("a", "b"), "team/app/x", false},
		{"team/* does not match team", "team/*", id("a", "b"), "team", false},
		{"team/** matches a child", "team/**", id("a", "b"), "team/app", true},
		{"team/** matches a deep descendant", "team/**", id("a", "b"), "team/a/b/c", true},
		{"team/** does not match team itself", "team/**", id("a", "b"), "team", false},
		{"team/** does not match a sibling with the same prefix", "team/**", id("a", "b"), "teamx/app", false},
		{"*/** matches any nested name", "*/**", id("a", "b"), "x/y/z", true},
		{"*/** does not match a single component", "*/**", id("a", "b"), "x", false},
		{"** matches everything", "**", id("a", "b"), "x/y/z", true},
		{"${namespace} is the caller's namespace", "${namespace}/**", id("team-a", "b"), "team-a/app", true},
		{"${namespace} is not another namespace", "${namespace}/**", id("team-a", "b"), "team-b/app", false},
		{"${namespace} and ${serviceAccount} together", "${namespace}/${serviceAccount}", id("team", "builder"), "team/builder", true},
		{"${serviceAccount} may hold dots", "ci/${serviceAccount}", id("team", "sa.v1"), "ci/sa.v1", true},
		{"placeholders combine with a star", "${namespace}-*/app", id("team", "b"), "team-dev/app", true},
		{"a namespace holding a slash matches nothing", "${namespace}/app", id("a/b", "s"), "a/b/app", false},
		{"a namespace that is a star matches nothing", "${namespace}/app", id("*", "s"), "x/app", false},
		{"a namespace that is dot-dot matches nothing", "${namespace}/app", id("..", "s"), "../app", false},
		{"an uppercase namespace matches nothing", "${namespace}/app", id("Team", "s"), "team/app", false},
		{"a service account holding a star matches nothing", "ci/${serviceAccount}", id("team", "*"), "ci/x", false},
		{"an empty service account matches nothing", "ci/${serviceAccount}/**", id("team", ""), "ci/x/y", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPolicy(t, config.Rule{Namespaces: []string{"*"}, ServiceAccounts: []string{"*"}, Repositories: []string{tc.pattern}})
			if got := p.Allows(tc.who, svc, tc.repo, "pull"); got != tc.want {
				t.Errorf("Allows(%+v, %q) under %q = %v, want %v", tc.who, tc.repo, tc.pattern, got, tc.want)
			}
		})
	}
}

func TestRuleSelectors(t *testing.T) {
	withAnn := func(i policy.Identity, kv ...string) policy.Identity {
		i.Annotations = map[string]string{}
		for j := 0; j < len(kv); j += 2 {
			i.Annotations[kv[j]] = kv[j+1]
		}
		return i
	}
	base := config.Rule{Namespaces: []string{"team"}, Repositories: []string{"**"}}
	cases := []struct {
		name string
		edit func(*config.Rule)
		who  policy.Identity
		svc  string
		want bool
	}{
		{"a listed namespace is selected", nil, id("team", "s"), svc, true},
		{"another namespace is not", nil, id("other", "s"), svc, false},
		{"an empty namespace is never selected, even by *", func(r *config.Rule) { r.Namespaces = []string{"*"} }, id("", "s"), svc, false},
		{"service accounts default to all", nil, id("team", "anything"), svc, true},
		{"a listed service account is selected", func(r *config.Rule) { r.ServiceAccounts = []string{"builder"} }, id("team", "builder"), svc, true},
		{"another service account is not", func(r *config.Rule) { r.ServiceAccounts = []string{"builder"} }, id("team", "default"), svc, false},
		{"a required annotation with its value is selected",
			func(r *config.Rule) { r.ServiceAccountAnnotations = map[string]string{"keyward.dev/pull": "yes"} },
			withAnn(id("team", "s"), "keyward.dev/pull", "yes"), svc, true},
		{"a required annotation with another value is not",
			func(r *config.Rule) { r.ServiceAccountAnnotations = map[string]string{"keyward.dev/pull": "yes"} },
			withAnn(id("team", "s"), "keyward.dev/pull", "no"), svc, false},
		{"a missing annotation is not",
			func(r *config.Rule) { r.ServiceAccountAnnotations = map[string]string{"keyward.dev/pull": "yes"} },
			id("team", "s"), svc, false},
		{"a star annotation selects any value",
			func(r *config.Rule) { r.ServiceAccountAnnotations = map[string]string{"keyward.dev/pull": "*"} },
			withAnn(id("team", "s"), "keyward.dev/pull", ""), svc, true},
		{"a star annotation still needs the key",
			func(r *config.Rule) { r.ServiceAccountAnnotations = map[string]string{"keyward.dev/pull": "*"} },
			withAnn(id("team", "s"), "keyward.dev/other", "x"), svc, false},
		{"every annotation must match",
			func(r *config.Rule) { r.ServiceAccountAnnotations = map[string]string{"a.dev/x": "1", "a.dev/y": "2"} },
			withAnn(id("team", "s"), "a.dev/x", "1"), svc, false},
		{"rules default to every registry", nil, id("team", "s"), "mirror", true},
		{"a rule for one registry does not apply to another", func(r *config.Rule) { r.Registries = []string{svc} }, id("team", "s"), "mirror", false},
		{"an unknown service is never allowed", nil, id("team", "s"), "unknown.example.com", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := base
			if tc.edit != nil {
				tc.edit(&r)
			}
			p := newPolicy(t, r)
			if got := p.Allows(tc.who, tc.svc, "any/repo", "pull"); got != tc.want {
				t.Errorf("Allows = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAllowsActions(t *testing.T) {
	p := newPolicy(t, config.Rule{Namespaces: []string{"team"}, Repositories: []string{"team/**"}, Actions: []string{"pull", "push"}})
	cases := []struct {
		name   string
		repo   string
		action string
		want   bool
	}{
		{"a granted action is allowed", "team/app", "push", true},
		{"an action no rule grants is not", "team/app", "delete", false},
		{"a star is no action", "team/app", "*", false},
		{"an invalid repository is not allowed", "team/App", "pull", false},
		{"a dot-dot repository is not allowed", "team/../x", "pull", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Allows(id("team", "s"), svc, tc.repo, tc.action); got != tc.want {
				t.Errorf("Allows(%q, %q) = %v, want %v", tc.repo, tc.action, got, tc.want)
			}
		})
	}
}

func TestGrant(t *testing.T) {
	rules := []config.Rule{
		{Namespaces: []string{"team"}, Repositories: []string{"team/**", "shared/*"}},
		{Namespaces: []string{"team"}, ServiceAccounts: []string{"builder"}, Repositories: []string{"team/**"}, Actions: []string{"push"}},
		{Namespaces: []string{"*"}, Registries: []string{"mirror"}, Repositories: []string{"**"}, Actions: []string{"pull", "push", "delete"}},
	}
	sc := func(typ, name string, actions ...string) policy.Scope {
		return policy.Scope{Type: typ, Name: name, Actions: actions}
	}
	acc := func(name string, actions ...string) registrytoken.Access {
		return registrytoken.Access{Type: "repository", Name: name, Actions: actions}
	}
	cases := []struct {
		name        string
		who         policy.Identity
		service     string
		scopes      []policy.Scope
		wantGranted []registrytoken.Access
		wantDropped []policy.Scope
	}{
		{"a pull of an allowed repository is granted", id("team", "default"), svc,
			[]policy.Scope{sc("repository", "team/app", "pull")},
			[]registrytoken.Access{acc("team/app", "pull")}, nil},
		{"push where only pull is allowed grants pull and drops push", id("team", "default"), svc,
			[]policy.Scope{sc("repository", "team/app", "pull", "push")},
			[]registrytoken.Access{acc("team/app", "pull")}, []policy.Scope{sc("repository", "team/app", "push")}},
		{"the actions of two matching rules are united", id("team", "builder"), svc,
			[]policy.Scope{sc("repository", "team/app", "push", "pull")},
			[]registrytoken.Access{acc("team/app", "pull", "push")}, nil},
		{"a star is granted only as the actions the rules allow", id("team", "builder"), svc,
			[]policy.Scope{sc("repository", "team/app", "*")},
			[]registrytoken.Access{acc("team/app", "pull", "push")}, []policy.Scope{sc("repository", "team/app", "delete")}},
		{"a star where everything is allowed is spelt out, never written as a star", id("team", "default"), "mirror",
			[]policy.Scope{sc("repository", "x", "*")},
			[]registrytoken.Access{acc("x", "pull", "push", "delete")}, nil},
		{"a star where nothing is allowed drops the scope as asked", id("other", "default"), svc,
			[]policy.Scope{sc("repository", "team/app", "*")},
			nil, []policy.Scope{sc("repository", "team/app", "*")}},
		{"the catalog scope is dropped", id("team", "default"), "mirror",
			[]policy.Scope{sc("registry", "catalog", "*")},
			nil, []policy.Scope{sc("registry", "catalog", "*")}},
		{"a resource class is dropped", id("team", "default"), svc,
			[]policy.Scope{sc("repository(plugin)", "team/app", "pull")},
			nil, []policy.Scope{sc("repository(plugin)", "team/app", "pull")}},
		{"an unknown action is dropped and the rest granted", id("team", "default"), svc,
			[]policy.Scope{sc("repository", "team/app", "pull", "frobnicate")},
			[]registrytoken.Access{acc("team/app", "pull")}, []policy.Scope{sc("repository", "team/app", "frobnicate")}},
		{"a repository outside every rule is dropped", id("team", "default"), svc,
			[]policy.Scope{sc("repository", "other/app", "pull")},
			nil, []policy.Scope{sc("repository", "other/app", "pull")}},
		{"another namespace gets nothing", id("other", "default"), svc,
			[]policy.Scope{sc("repository", "team/app", "pull")},
			nil, []policy.Scope{sc("repository", "team/app", "pull")}},
		{"an unknown service drops every scope", id("team", "default"), "unknown",
			[]policy.Scope{sc("repository", "team/app", "pull")},
			nil, []policy.Scope{sc("repository", "team/app", "pull")}},
		{"a hand-built scope with an invalid name is dropped", id("team", "default"), "mirror",
			[]policy.Scope{sc("repository", "../etc", "pull"), sc("repository", "Team/App", "pull")},
			nil, []policy.Scope{sc("repository", "../etc", "pull"), sc("repository", "Team/App", "pull")}},
		{"scopes for one repository are merged", id("team", "builder"), svc,
			[]policy.Scope{sc("repository", "team/app", "pull"), sc("repository", "team/app", "push", "pull"), sc("repository", "team/app", "delete")},
			[]registrytoken.Access{acc("team/app", "pull", "push")}, []policy.Scope{sc("repository", "team/app", "delete")}},
		{"grants and drops are sorted", id("team", "default"), svc,
			[]policy.Scope{sc("repository", "team/z", "pull"), sc("repository", "zz", "pull"), sc("repository", "shared/a", "pull"), sc("registry", "catalog", "*"), sc("repository", "aa", "pull")},
			[]registrytoken.Access{acc("shared/a", "pull"), acc("team/z", "pull")},
			[]policy.Scope{sc("registry", "catalog", "*"), sc("repository", "aa", "pull"), sc("repository", "zz", "pull")}},
		{"no scopes grant nothing", id("team", "default"), svc, nil, nil, nil},
	}
	p := newPolicy(t, rules...)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			granted, dropped := p.Grant(tc.who, tc.service, tc.scopes)
			if !reflect.DeepEqual(granted, tc.wantGranted) {
				t.Errorf("granted %+v, want %+v", granted, tc.wantGranted)
			}
			if !reflect.DeepEqual(dropped, tc.wantDropped) {
				t.Errorf("dropped %+v, want %+v", dropped, tc.wantDropped)
			}
			for _, g := range granted {
				for _, a := range g.Actions {
					if a == "*" {
						t.Errorf("granted %+v holds *", g)
					}
				}
			}
		})
	}
}

func TestServiceAndRegistryForHost(t *testing.T) {
	p := newPolicy(t, config.Rule{Namespaces: []string{"*"}, Repositories: []string{"**"}})
	cases := []struct {
		name        string
		host        string
		wantService string // "": not found
	}{
		{"hosts default to the service", "registry.example.com", svc},
		{"a listed host is found", "mirror.example.com:5000", "mirror"},
		{"hosts compare without case", "Mirror.Example.COM", "mirror"},
		{"a host with another port is not found", "mirror.example.com:5001", ""},
		{"a service name that is not a host is not found", "mirror", ""},
		{"an empty host is not found", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := p.RegistryForHost(tc.host)
			if ok != (tc.wantService != "") || r.Service != tc.wantService {
				t.Errorf("RegistryForHost(%q) = %+v, %v; want service %q", tc.host, r, ok, tc.wantService)
			}
		})
	}
	t.Run("Service finds a registry by service and defaults its hosts", func(t *testing.T) {
		r, ok := p.Service(svc)
		if !ok || !reflect.DeepEqual(r.Hosts, []string{svc}) {
			t.Fatalf("Service(%q) = %+v, %v", svc, r, ok)
		}
		r.Hosts[0] = "evil.example.com"
		if _, ok := p.RegistryForHost("evil.example.com"); ok {
			t.Error("a caller's change to a returned registry changed the policy")
		}
		if _, ok := p.Service("mirror.example.com"); ok {
			t.Error("Service matched a host, want only services")
		}
	})
}

func TestNewRefusesBadRules(t *testing.T) {
	cases := []struct {
		name        string
		rule        config.Rule
		wantPattern bool
	}{
		{"a rule without namespaces", config.Rule{Repositories: []string{"a"}}, false},
		{"a rule without repositories", config.Rule{Namespaces: []string{"*"}}, false},
		{"an unknown action", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"a"}, Actions: []string{"*"}}, false},
		{"an unknown registry", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"a"}, Registries: []string{"nope"}}, false},
		{"a double star in the middle", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"a/**/b"}}, true},
		{"a double star inside a component", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"a/b**"}}, true},
		{"an unknown placeholder", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"${pod}/a"}}, true},
		{"an uppercase pattern", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"Team/a"}}, true},
		{"a question mark", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"a?"}}, true},
		{"a character class", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"[a-z]"}}, true},
		{"a backslash", config.Rule{Namespaces: []string{"*"}, Repositories: []string{`a\*`}}, true},
		{"an empty pattern", config.Rule{Namespaces: []string{"*"}, Repositories: []string{""}}, true},
		{"a bare trailing double star", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"/**"}}, true},
		{"a dot-dot pattern", config.Rule{Namespaces: []string{"*"}, Repositories: []string{"team/../x"}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.New(&config.TokenServiceConfiguration{Registries: []config.Registry{{Service: svc}}, Rules: []config.Rule{tc.rule}})
			if !errors.Is(err, policy.ErrInvalidPolicy) {
				t.Fatalf("New = %v, want ErrInvalidPolicy", err)
			}
			if got := errors.Is(err, config.ErrInvalidPattern); got != tc.wantPattern {
				t.Errorf("errors.Is(%v, ErrInvalidPattern) = %v, want %v", err, got, tc.wantPattern)
			}
		})
	}
	t.Run("a nil configuration", func(t *testing.T) {
		if _, err := policy.New(nil); !errors.Is(err, policy.ErrInvalidPolicy) {
			t.Fatalf("New(nil) = %v", err)
		}
	})
}

// The example configuration's rules do what its comments say.
func TestTheExampleConfigurationsRules(t *testing.T) {
	cfg, err := config.Load("../../../docs/token-service-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	vendor := id("shop", "web")
	vendor.Annotations = map[string]string{"keyward.dev/vendor-images": ""}
	cases := []struct {
		name                  string
		who                   policy.Identity
		service, repo, action string
		want                  bool
	}{
		{"a pod pulls its namespace's images", id("shop", "default"), "registry.example.com", "shop/web", "pull", true},
		{"a pod pulls shared base images", id("shop", "default"), "build-cache", "base/debian", "pull", true},
		{"a pod does not pull another namespace's images", id("shop", "default"), "registry.example.com", "payments/api", "pull", false},
		{"a pod does not push its namespace's images", id("shop", "default"), "registry.example.com", "shop/web", "push", false},
		{"CI's builder pushes to the build cache", id("ci", "builder"), "build-cache", "ci/app/layer", "push", true},
		{"CI's builder does not push to the main registry", id("ci", "builder"), "registry.example.com", "ci/app", "push", false},
		{"another CI service account does not push", id("ci", "default"), "build-cache", "ci/app", "push", false},
		{"an opted-in service account pulls vendor images", vendor, "registry.example.com", "vendor/db", "pull", true},
		{"a service account without the annotation does not", id("shop", "web"), "registry.example.com", "vendor/db", "pull", false},
		{"vendor images are not on the build cache", vendor, "build-cache", "vendor/db", "pull", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Allows(tc.who, tc.service, tc.repo, tc.action); got != tc.want {
				t.Errorf("Allows = %v, want %v", got, tc.want)
			}
		})
	}
	if r, ok := p.RegistryForHost("cache.internal:5000"); !ok || r.Service != "build-cache" {
		t.Errorf("RegistryForHost(cache.internal:5000) = %+v, %v", r, ok)
	}
}
