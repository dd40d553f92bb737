package policy_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/tokenservice/policy"
)

func TestParseScope(t *testing.T) {
	long255 := strings.Repeat("a", 255)
	cases := []struct {
		name string
		in   string
		want policy.Scope // zero: want ErrInvalidScope
	}{
		{"a repository scope with two actions parses", "repository:team/app:pull,push",
			policy.Scope{Type: "repository", Name: "team/app", Actions: []string{"pull", "push"}}},
		{"a nested repository name parses", "repository:a/b/c.d_e__f--g:pull",
			policy.Scope{Type: "repository", Name: "a/b/c.d_e__f--g", Actions: []string{"pull"}}},
		{"duplicate actions are merged", "repository:app:pull,push,pull",
			policy.Scope{Type: "repository", Name: "app", Actions: []string{"pull", "push"}}},
		{"a star action parses as itself", "repository:app:*",
			policy.Scope{Type: "repository", Name: "app", Actions: []string{"*"}}},
		{"the catalog scope parses (Grant drops it)", "registry:catalog:*",
			policy.Scope{Type: "registry", Name: "catalog", Actions: []string{"*"}}},
		{"a resource class parses (Grant drops it)", "repository(plugin):app:pull",
			policy.Scope{Type: "repository(plugin)", Name: "app", Actions: []string{"pull"}}},
		{"an unknown action parses (Grant drops it)", "repository:app:pull,frobnicate",
			policy.Scope{Type: "repository", Name: "app", Actions: []string{"pull", "frobnicate"}}},
		{"a 255-character name parses", "repository:" + long255 + ":pull",
			policy.Scope{Type: "repository", Name: long255, Actions: []string{"pull"}}},

		{"an empty scope is refused", "", policy.Scope{}},
		{"a scope without colons is refused", "repository", policy.Scope{}},
		{"a scope with one colon is refused", "repository:app", policy.Scope{}},
		{"only colons are refused", ":::", policy.Scope{}},
		{"an empty type is refused", ":app:pull", policy.Scope{}},
		{"an empty name is refused", "repository::pull", policy.Scope{}},
		{"empty actions are refused", "repository:app:", policy.Scope{}},
		{"an empty action in the list is refused", "repository:app:pull,,push", policy.Scope{}},
		{"an extra colon puts it into the name, which is refused", "repository:a:pull:extra", policy.Scope{}},
		{"a host:port in the name is refused", "repository:localhost:5000/app:pull", policy.Scope{}},
		{"an uppercase repository name is refused", "repository:Team/app:pull", policy.Scope{}},
		{"an uppercase type is refused", "Repository:app:pull", policy.Scope{}},
		{"an uppercase action is refused", "repository:app:PULL", policy.Scope{}},
		{"a dot-dot component is refused", "repository:team/../other:pull", policy.Scope{}},
		{"a dot-dot name is refused", "repository:..:pull", policy.Scope{}},
		{"a leading slash is refused", "repository:/app:pull", policy.Scope{}},
		{"a trailing slash is refused", "repository:app/:pull", policy.Scope{}},
		{"an empty component is refused", "repository:team//app:pull", policy.Scope{}},
		{"a wildcard name is refused", "repository:team/*:pull", policy.Scope{}},
		{"a component starting with a separator is refused", "repository:-app:pull", policy.Scope{}},
		{"a NUL in the name is refused", "repository:app\x00:pull", policy.Scope{}},
		{"a NUL in a catalog-like name is refused", "registry:cat\x00alog:*", policy.Scope{}},
		{"a non-ASCII name is refused", "repository:äpp:pull", policy.Scope{}},
		{"a 256-character name is refused", "repository:" + long255 + "a:pull", policy.Scope{}},
		{"a very long scope is refused", "repository:app:" + strings.Repeat("pull,", 10000) + "pull", policy.Scope{}},
		{"a space inside the actions is refused", "repository:app:pull, push", policy.Scope{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := policy.ParseScope(tc.in)
			if tc.want.Type == "" {
				if !errors.Is(err, policy.ErrInvalidScope) {
					t.Fatalf("ParseScope = %+v, %v; want ErrInvalidScope", got, err)
				}
				if len(err.Error()) > 400 {
					t.Errorf("error is %d bytes long; hostile input must be cut", len(err.Error()))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("ParseScope = %+v, want %+v", got, tc.want)
			}
			if got.String() != strings.Join([]string{tc.want.Type, tc.want.Name, strings.Join(tc.want.Actions, ",")}, ":") {
				t.Errorf("String() = %q", got.String())
			}
		})
	}
}

func TestParseScopes(t *testing.T) {
	t.Run("space-separated scopes in several values are all read, bad ones reported", func(t *testing.T) {
		scopes, errs := policy.ParseScopes([]string{
			"repository:a:pull  repository:b:push",
			"repository:B:pull",
			"",
			" registry:catalog:* ",
		})
		var names []string
		for _, s := range scopes {
			names = append(names, s.Name)
		}
		if !reflect.DeepEqual(names, []string{"a", "b", "catalog"}) {
			t.Errorf("scopes %v, want a, b, catalog", names)
		}
		if len(errs) != 1 || !errors.Is(errs[0], policy.ErrInvalidScope) {
			t.Errorf("errors %v, want one ErrInvalidScope", errs)
		}
	})
	t.Run("no values give nothing", func(t *testing.T) {
		scopes, errs := policy.ParseScopes(nil)
		if len(scopes) != 0 || len(errs) != 0 {
			t.Errorf("ParseScopes(nil) = %v, %v", scopes, errs)
		}
	})
	t.Run("scopes beyond MaxScopes are refused with one error", func(t *testing.T) {
		many := strings.Repeat("repository:a:pull ", policy.MaxScopes+1000)
		scopes, errs := policy.ParseScopes([]string{many})
		if len(scopes) != policy.MaxScopes {
			t.Errorf("read %d scopes, want %d", len(scopes), policy.MaxScopes)
		}
		if len(errs) != 1 || !errors.Is(errs[0], policy.ErrInvalidScope) {
			t.Errorf("errors %v, want one ErrInvalidScope", errs)
		}
	})
}
