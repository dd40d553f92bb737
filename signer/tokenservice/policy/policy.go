// Package policy decides which repositories and actions a service account
// is granted in a registry token, from the token service's rules
// (config.Rule). It is pure: no Kubernetes, no I/O; the caller has already
// authenticated the Identity.
package policy

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/signer/tokenservice/config"
)

// Identity is an authenticated caller: the service account a pod-bound
// token was issued to, the annotations of that ServiceAccount object (read
// from the apiserver, never from the request) and the pod it is bound to.
type Identity struct {
	Namespace, ServiceAccount string
	Annotations               map[string]string
	PodName, PodUID, NodeName string
}

// actions a token may carry, in the order Grant writes them.
var knownActions = []string{config.ActionPull, config.ActionPush, config.ActionDelete}

// Policy is a compiled rule set. It is immutable and safe for concurrent
// use.
type Policy struct {
	registries []config.Registry
	rules      []rule
}

type rule struct {
	namespaces      []string // "*": any
	serviceAccounts []string // "*": any
	annotations     map[string]string
	registries      []string // empty: any
	patterns        []pattern
	actions         []string
}

// pattern is a checked config.Rule repository pattern.
type pattern struct {
	all bool // "**"
	// prefix is the pattern without a trailing "/**"; anyDepth says
	// whether it had one.
	prefix   string
	anyDepth bool
	depth    int // path components in prefix
}

// ErrInvalidPolicy is wrapped by New for rules it cannot compile.
var ErrInvalidPolicy = errors.New("invalid token policy")

// New compiles the registries and rules of cfg. Fields left empty take the
// defaults config.Default gives them (hosts [service], serviceAccounts
// ["*"], actions [pull], registries all), so New does not depend on the
// caller having defaulted cfg; an invalid pattern, action or empty
// namespace list is an error.
func New(cfg *config.TokenServiceConfiguration) (*Policy, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: no configuration", ErrInvalidPolicy)
	}
	p := &Policy{}
	services := map[string]bool{}
	for _, r := range cfg.Registries {
		r.Hosts = slices.Clone(r.Hosts)
		if len(r.Hosts) == 0 {
			r.Hosts = []string{r.Service}
		}
		p.registries = append(p.registries, r)
		services[r.Service] = true
	}
	for i, cr := range cfg.Rules {
		r := rule{
			namespaces:      slices.Clone(cr.Namespaces),
			serviceAccounts: slices.Clone(cr.ServiceAccounts),
			annotations:     make(map[string]string, len(cr.ServiceAccountAnnotations)),
			registries:      slices.Clone(cr.Registries),
			actions:         slices.Clone(cr.Actions),
		}
		if len(r.namespaces) == 0 {
			return nil, fmt.Errorf("%w: rules[%d].namespaces: required", ErrInvalidPolicy, i)
		}
		if len(r.serviceAccounts) == 0 {
			r.serviceAccounts = []string{"*"}
		}
		if len(r.actions) == 0 {
			r.actions = []string{config.ActionPull}
		}
		for j, a := range r.actions {
			if !slices.Contains(knownActions, a) {
				return nil, fmt.Errorf("%w: rules[%d].actions[%d]: %q is none of %v", ErrInvalidPolicy, i, j, a, knownActions)
			}
		}
		for j, s := range r.registries {
			if !services[s] {
				return nil, fmt.Errorf("%w: rules[%d].registries[%d]: %q is no configured registry service", ErrInvalidPolicy, i, j, s)
			}
		}
		for k, v := range cr.ServiceAccountAnnotations {
			r.annotations[k] = v
		}
		if len(cr.Repositories) == 0 {
			return nil, fmt.Errorf("%w: rules[%d].repositories: required", ErrInvalidPolicy, i)
		}
		for j, pat := range cr.Repositories {
			if err := config.CheckRepositoryPattern(pat); err != nil {
				return nil, fmt.Errorf("%w: rules[%d].repositories[%d] %q: %w", ErrInvalidPolicy, i, j, pat, err)
			}
			r.patterns = append(r.patterns, compilePattern(pat))
		}
		p.rules = append(p.rules, r)
	}
	return p, nil
}

func compilePattern(p string) pattern {
	if p == config.AllRepositories {
		return pattern{all: true}
	}
	prefix, anyDepth := strings.CutSuffix(p, "/**")
	return pattern{prefix: prefix, anyDepth: anyDepth, depth: strings.Count(prefix, "/") + 1}
}

// match reports whether repository name (already known to be valid)
// matches the pattern for the caller ns/sa. Placeholders are replaced
// before matching, and only by a valid path component: a value that is
// not one (it cannot be, under Kubernetes' naming rules) matches nothing
// rather than smuggling '/', '*' or '..' into the pattern.
func (p pattern) match(name, ns, sa string) bool {
	if p.all {
		return true
	}
	pat := p.prefix
	if strings.Contains(pat, config.PlaceholderNamespace) {
		if !config.ValidPathComponent(ns) {
			return false
		}
		pat = strings.ReplaceAll(pat, config.PlaceholderNamespace, ns)
	}
	if strings.Contains(pat, config.PlaceholderServiceAccount) {
		if !config.ValidPathComponent(sa) {
			return false
		}
		pat = strings.ReplaceAll(pat, config.PlaceholderServiceAccount, sa)
	}
	// The pattern now holds only [a-z0-9._-/] and '*' (CheckRepositoryPattern
	// and the checks above), so path.Match's other syntax ('?', '[', '\')
	// cannot occur, and its '*' stays within one path component.
	subject := name
	if p.anyDepth {
		parts := strings.SplitN(name, "/", p.depth+1)
		if len(parts) <= p.depth {
			return false // "team/**" needs at least one component below team
		}
		subject = strings.Join(parts[:p.depth], "/")
	}
	ok, err := path.Match(pat, subject)
	return err == nil && ok
}

func (r *rule) matches(id Identity, service string) bool {
	if len(r.registries) > 0 && !slices.Contains(r.registries, service) {
		return false
	}
	if !selects(r.namespaces, id.Namespace) || !selects(r.serviceAccounts, id.ServiceAccount) {
		return false
	}
	for k, want := range r.annotations {
		got, ok := id.Annotations[k]
		if !ok || (want != "*" && got != want) {
			return false
		}
	}
	return true
}

// selects reports whether a name list ("*" for any) selects name; an
// empty name is never selected.
func selects(list []string, name string) bool {
	return name != "" && (slices.Contains(list, "*") || slices.Contains(list, name))
}

// Service returns the registry whose auth.token.service is service.
func (p *Policy) Service(service string) (config.Registry, bool) {
	for _, r := range p.registries {
		if r.Service == service {
			r.Hosts = slices.Clone(r.Hosts)
			return r, true
		}
	}
	return config.Registry{}, false
}

// RegistryForHost returns the registry an image host (host or host:port,
// compared without regard to case) belongs to.
func (p *Policy) RegistryForHost(host string) (config.Registry, bool) {
	for _, r := range p.registries {
		for _, h := range r.Hosts {
			if strings.EqualFold(h, host) {
				r.Hosts = slices.Clone(r.Hosts)
				return r, true
			}
		}
	}
	return config.Registry{}, false
}

// allowed returns the actions the rules grant id on repository name of
// service.
func (p *Policy) allowed(id Identity, service, name string) map[string]bool {
	set := map[string]bool{}
	for i := range p.rules {
		r := &p.rules[i]
		if !r.matches(id, service) {
			continue
		}
		for _, pat := range r.patterns {
			if pat.match(name, id.Namespace, id.ServiceAccount) {
				for _, a := range r.actions {
					set[a] = true
				}
				break
			}
		}
	}
	return set
}

// Allows reports whether the rules grant id action (pull, push or
// delete; not "*") on repository of service.
func (p *Policy) Allows(id Identity, service, repository, action string) bool {
	if _, ok := p.Service(service); !ok || !config.ValidRepository(repository) || !slices.Contains(knownActions, action) {
		return false
	}
	return p.allowed(id, service, repository)[action]
}

// Grant answers a token request of id for service: per requested
// repository, the requested actions that the union of the matching rules'
// actions holds. Scopes naming the same resource are merged first.
//
// A requested "*" stands for pull, push and delete, and is granted only as
// the explicit actions the rules allow, never as "*": Distribution's token
// access controller (registry/auth/token, v3.1.2: actionSet.contains
// returns true for any action when the set holds "*") reads "*" in a
// token's access as every action, including ones keyward's rules do not
// know.
//
// granted is sorted by name, its actions in the order pull, push, delete.
// dropped holds what was asked for and not granted: whole scopes (other
// resource types, an unknown service, invalid names, nothing allowed) with
// their requested actions, and for a scope granted in part the actions
// refused (a "*" expanded). It is sorted by type, then name.
func (p *Policy) Grant(id Identity, service string, scopes []Scope) (granted []registrytoken.Access, dropped []Scope) {
	type resource struct{ typ, name string }
	requested := map[resource][]string{}
	for _, sc := range scopes {
		k := resource{sc.Type, sc.Name}
		acts := requested[k]
		for _, a := range sc.Actions {
			if !slices.Contains(acts, a) {
				acts = append(acts, a)
			}
		}
		requested[k] = acts
	}
	_, knownService := p.Service(service)
	for k, acts := range requested {
		if k.typ != TypeRepository || !knownService || !config.ValidRepository(k.name) {
			dropped = append(dropped, Scope{Type: k.typ, Name: k.name, Actions: sortActions(acts)})
			continue
		}
		want := map[string]bool{}
		var refused []string
		for _, a := range acts {
			switch {
			case a == "*":
				for _, ka := range knownActions {
					want[ka] = true
				}
			case slices.Contains(knownActions, a):
				want[a] = true
			default:
				refused = append(refused, a)
			}
		}
		allowed := p.allowed(id, service, k.name)
		var got []string
		for _, a := range knownActions {
			switch {
			case !want[a]:
			case allowed[a]:
				got = append(got, a)
			default:
				refused = append(refused, a)
			}
		}
		if len(got) == 0 {
			dropped = append(dropped, Scope{Type: k.typ, Name: k.name, Actions: sortActions(acts)})
			continue
		}
		granted = append(granted, registrytoken.Access{Type: TypeRepository, Name: k.name, Actions: got})
		if len(refused) > 0 {
			dropped = append(dropped, Scope{Type: k.typ, Name: k.name, Actions: sortActions(refused)})
		}
	}
	slices.SortFunc(granted, func(a, b registrytoken.Access) int { return strings.Compare(a.Name, b.Name) })
	slices.SortFunc(dropped, func(a, b Scope) int {
		return cmp.Or(strings.Compare(a.Type, b.Type), strings.Compare(a.Name, b.Name))
	})
	return granted, dropped
}

// sortActions orders actions as Grant writes them: pull, push, delete,
// then any others alphabetically ("*" first among them).
func sortActions(acts []string) []string {
	out := slices.Clone(acts)
	rank := func(a string) int {
		if i := slices.Index(knownActions, a); i >= 0 {
			return i
		}
		return len(knownActions)
	}
	slices.SortFunc(out, func(a, b string) int { return cmp.Or(cmp.Compare(rank(a), rank(b)), strings.Compare(a, b)) })
	return out
}
