package helm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/deploy/rbac"
	signerconfig "github.com/keyward/keyward/signer/config"
	tokenconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// rbacInput builds deploy/rbac's Input from what a sample configures: the
// rendered configurations (the very files the pods read), the components
// it runs, and the softhsm bootstrap from its values.
func rbacInput(t *testing.T, valuesFile string, objs []*unstructured.Unstructured) rbac.Input {
	t.Helper()
	cfg, err := signerconfig.Parse(configMapData(t, objs, "keyward-signer-config", "config.yaml"))
	if err != nil {
		t.Fatalf("signer configuration: %v", err)
	}
	signer := rbac.FromSignerConfig(cfg)
	signer.BootstrapAuthorities = softhsmBootstrap(t, valuesFile)
	in := rbac.Input{Namespace: namespace, NodeAgentNamespace: nodeNamespace, Signer: &signer}
	if find(objs, "Deployment", "keyward-approver") != nil {
		a := rbac.ApproverFromSignerConfig(cfg)
		in.Approver = &a
	}
	if find(objs, "Deployment", "keyward-token-service") != nil {
		ts, err := tokenconfig.Parse(configMapData(t, objs, "keyward-token-service-config", "config.yaml"))
		if err != nil {
			t.Fatalf("token service configuration: %v", err)
		}
		tsIn := rbac.FromTokenServiceConfig(ts)
		in.TokenService = &tsIn
	}
	in.NodeAgent = find(objs, "DaemonSet", "keyward-node-agent") != nil
	in.CAAdmin = find(objs, "ServiceAccount", "keyward-ca-admin") != nil
	return in
}

// softhsmBootstrap reads signer.backend.type and
// .softhsm.bootstrapAuthorities from the sample over the chart's defaults.
func softhsmBootstrap(t *testing.T, valuesFile string) bool {
	t.Helper()
	type backend struct {
		Type    *string `json:"type"`
		SoftHSM struct {
			BootstrapAuthorities *bool `json:"bootstrapAuthorities"`
		} `json:"softhsm"`
	}
	var typ string
	bootstrap := false
	for _, f := range []string{chartDir(t) + "/values.yaml", valuesFile} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var v struct {
			Signer struct {
				Backend backend `json:"backend"`
			} `json:"signer"`
		}
		if err := yaml.Unmarshal(data, &v); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if p := v.Signer.Backend.Type; p != nil {
			typ = *p
		}
		if p := v.Signer.Backend.SoftHSM.BootstrapAuthorities; p != nil {
			bootstrap = *p
		}
	}
	return typ == "softhsm" && bootstrap
}

// rbacKinds are the kinds deploy/rbac renders.
var rbacKinds = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}

// permissions reduces the RBAC objects to comparable lines: one per
// (object, group, resource, name, verb) and (object, verb, non-resource
// URL) a role grants, one per binding's
// roleRef and subject, one per ServiceAccount (with its automount).
func permissions(t *testing.T, objs []*unstructured.Unstructured) []string {
	t.Helper()
	var out []string
	rules := func(id string, rs []rbacv1.PolicyRule) {
		for _, r := range rs {
			for _, u := range r.NonResourceURLs {
				for _, v := range r.Verbs {
					out = append(out, fmt.Sprintf("%s grants %s on non-resource URL %s", id, v, u))
				}
			}
			names := r.ResourceNames
			if len(names) == 0 {
				names = []string{"*"}
			}
			for _, g := range r.APIGroups {
				for _, res := range r.Resources {
					for _, n := range names {
						for _, v := range r.Verbs {
							out = append(out, fmt.Sprintf("%s grants %s %s/%s %s", id, v, g, res, n))
						}
					}
				}
			}
		}
	}
	for _, o := range objs {
		if _, hook := o.GetAnnotations()["helm.sh/hook"]; hook {
			// helm test's ServiceAccount: no token, no bindings
			// (TestHelmTestNeedsNoAPIAccess), not the generator's.
			continue
		}
		id := o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
		switch o.GetKind() {
		case "ServiceAccount":
			automount, found, _ := unstructured.NestedBool(o.Object, "automountServiceAccountToken")
			out = append(out, fmt.Sprintf("%s automount=%v", id, !found || automount))
		case "ClusterRole":
			rules(id, convert[rbacv1.ClusterRole](t, o).Rules)
		case "Role":
			rules(id, convert[rbacv1.Role](t, o).Rules)
		case "ClusterRoleBinding":
			b := convert[rbacv1.ClusterRoleBinding](t, o)
			for _, s := range b.Subjects {
				out = append(out, fmt.Sprintf("%s binds %s %s to %s %s/%s", id, b.RoleRef.Kind, b.RoleRef.Name, s.Kind, s.Namespace, s.Name))
			}
		case "RoleBinding":
			b := convert[rbacv1.RoleBinding](t, o)
			for _, s := range b.Subjects {
				out = append(out, fmt.Sprintf("%s binds %s %s to %s %s/%s", id, b.RoleRef.Kind, b.RoleRef.Name, s.Kind, s.Namespace, s.Name))
			}
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

func onlyRBAC(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if slices.Contains(rbacKinds, o.GetKind()) {
			out = append(out, o)
		}
	}
	return out
}

// The chart's RBAC grants exactly what deploy/rbac's generator grants for
// the same configuration (same rules per role, same bindings and accounts),
// and on the real apiserver, with the chart's RBAC applied, every one of
// the generator's SubjectAccessReview checks — what each component must be
// able to do, and what it must not: Secrets, other names, other verbs —
// comes out as it should, including rbac.IsolationChecks: no component
// writes another's Authority, Authority status or ClusterTrustBundle, nor
// signs, attests or approves for a name not its own. Every check is logged.
func TestChartRBACIsTheGenerators(t *testing.T) {
	names := []string{}
	all := samples(t)
	for n := range all {
		names = append(names, n)
	}
	sort.Strings(names) // one at a time: they share the cluster-scoped names
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			manifest := mustTemplate(t, all[name])
			objs := objects(t, manifest)
			in := rbacInput(t, all[name], objs)
			want, err := rbac.RenderYAML(in)
			if err != nil {
				t.Fatalf("rbac.RenderYAML: %v", err)
			}
			got := permissions(t, onlyRBAC(objs))
			exp := permissions(t, objects(t, want))
			if !slices.Equal(got, exp) {
				t.Errorf("the chart's RBAC differs from the generator's\nonly the chart: %s\nonly the generator: %s",
					strings.Join(minus(got, exp), "\n  "), strings.Join(minus(exp, got), "\n  "))
			}

			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			var rbacManifest bytes.Buffer
			for _, o := range onlyRBAC(objs) {
				data, err := yaml.Marshal(o.Object)
				if err != nil {
					t.Fatal(err)
				}
				rbacManifest.WriteString("---\n")
				rbacManifest.Write(data)
			}
			if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), rbacManifest.Bytes()); err != nil {
				t.Fatalf("applying the chart's RBAC: %v", err)
			}
			checks := append(rbac.Expectations(in), wildcardChecks(in)...)
			if len(checks) == 0 {
				t.Fatal("no checks")
			}
			for _, c := range checks {
				t.Log(c)
			}
			// ProveApplied asks until the authorizer's cache has caught up
			// (a wrong grant never becomes right by waiting), then leaves
			// nothing for the next sample: it deletes the RBAC and waits
			// until every grant is gone from the authorizer's view too.
			if err := rbac.ProveApplied(ctx, cp.AdminClient(), checks, onlyRBAC(objs)); err != nil {
				t.Error(err)
			}
		})
	}
}

// minus is a's lines that b lacks (both sorted).
func minus(a, b []string) []string {
	var out []string
	for _, s := range a {
		if _, found := slices.BinarySearch(b, s); !found {
			out = append(out, s)
		}
	}
	return out
}

// wildcardChecks add what a SubjectAccessReview for another exact name
// cannot see: kube-apiserver also accepts sign, attest and approve granted
// on "<domain>/*" (it asks the authorizer for that literal name too), so a
// grant on it must be refused for every domain of the configured names.
func wildcardChecks(in rbac.Input) []rbac.Check {
	var out []rbac.Check
	add := func(sa, verb string, names []string) {
		seen := map[string]bool{}
		for _, n := range names {
			domain, _, _ := strings.Cut(n, "/")
			if seen[domain] {
				continue
			}
			seen[domain] = true
			out = append(out, rbac.Check{
				User:   "system:serviceaccount:" + in.Namespace + ":" + sa,
				Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + in.Namespace, "system:authenticated"},
				Verb:   verb, Group: "certificates.k8s.io", Resource: "signers", Name: domain + "/*",
				Why: "exact signer names only, never a domain wildcard",
			})
		}
	}
	if s := in.Signer; s != nil {
		names := append(slices.Clone(s.PCRSigners), s.CSRSigners...)
		add("keyward-signer", "sign", names)
		add("keyward-signer", "attest", names)
	}
	if a := in.Approver; a != nil {
		add("keyward-approver", "approve", a.Signers)
	}
	if ts := in.TokenService; ts != nil {
		add("keyward-token-service", "attest", []string{ts.SignerName})
	}
	return out
}

// No sample ships RBAC for a component it does not run (the token
// service off, the approver off, the node agent off): every
// ServiceAccount is some pod's, every binding binds only those, every role
// is bound.
func TestSamplesShipNoRBACForAbsentComponents(t *testing.T) {
	for name, file := range samples(t) {
		t.Run(name, func(t *testing.T) {
			for _, p := range rbac.Orphans(objects(t, mustTemplate(t, file))) {
				t.Error(p)
			}
		})
	}
}
