package pcr

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// gateAgainst answers SelfSubjectAccessReviews from a set of granted
// "verb resource[/sub] name" strings.
func gateAgainst(t *testing.T, granted map[string]bool, names ...string) *PermissionGate {
	t.Helper()
	client := fake.NewClientset()
	client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		ra := r.Spec.ResourceAttributes
		res := ra.Resource
		if ra.Subresource != "" {
			res += "/" + ra.Subresource
		}
		key := strings.TrimSpace(ra.Verb + " " + res + " " + ra.Name)
		r.Status.Allowed = granted[key]
		return true, r, nil
	})
	return NewPermissionGate(client, names, nil, nil)
}

var pcrGrants = map[string]bool{
	"get podcertificaterequests": true, "list podcertificaterequests": true, "watch podcertificaterequests": true, "update podcertificaterequests/status": true,
}

func withGrants(extra ...string) map[string]bool {
	m := map[string]bool{}
	for k, v := range pcrGrants {
		m[k] = v
	}
	for _, e := range extra {
		m[e] = true
	}
	return m
}

func TestPermissionGateChecksAsTheApiserverDoes(t *testing.T) {
	both := []string{"keyward.dev/a", "example.com/b"}
	cases := []struct {
		name        string
		names       []string
		granted     map[string]bool
		wantMissing []string // signer names blocked
		wantGeneral bool
	}{
		{name: "sign on the exact name is enough", names: []string{"keyward.dev/a"}, granted: withGrants("sign signers keyward.dev/a")},
		{name: "sign on the domain wildcard is enough", names: []string{"keyward.dev/a"}, granted: withGrants("sign signers keyward.dev/*")},
		{name: "the wildcard covers only its own domain", names: both, granted: withGrants("sign signers keyward.dev/*"), wantMissing: []string{"example.com/b"}},
		{name: "no sign grant blocks only that name", names: both, granted: withGrants("sign signers keyward.dev/a"), wantMissing: []string{"example.com/b"}},
		{name: "no status update blocks every name", names: both, granted: map[string]bool{"get podcertificaterequests": true, "list podcertificaterequests": true, "watch podcertificaterequests": true,
			"sign signers keyward.dev/*": true, "sign signers example.com/b": true}, wantGeneral: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			names := tc.names
			g := gateAgainst(t, tc.granted, names...)
			err := g.Check(context.Background())
			var missing *MissingPermissionError
			if (err != nil) != (len(tc.wantMissing) > 0 || tc.wantGeneral) || (err != nil && !errors.As(err, &missing)) {
				t.Fatalf("Check = %v", err)
			}
			for _, n := range names {
				blocked := g.Blocked(n) != nil
				want := tc.wantGeneral
				for _, m := range tc.wantMissing {
					want = want || m == n
				}
				if blocked != want {
					t.Errorf("Blocked(%s) = %v, want %v", n, g.Blocked(n), want)
				}
			}
		})
	}
}

// The message says which verb, resource and name are missing and the rule
// to add.
func TestMissingPermissionNamesTheRule(t *testing.T) {
	g := gateAgainst(t, withGrants(), "example.com/b")
	err := g.Check(context.Background())
	var missing *MissingPermissionError
	if !errors.As(err, &missing) || missing.Verb != "sign" || missing.Name != "example.com/b" {
		t.Fatalf("Check = %v, want a missing sign on example.com/b", err)
	}
	for _, want := range []string{`verb "sign"`, `"example.com/b"`, `resources: ["signers"]`, `resourceNames: ["example.com/b"]`, `verbs: ["sign"]`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %s: %s", want, err)
		}
	}
	// A refusal at run time blocks a name the check found granted, until
	// the next check.
	g2 := gateAgainst(t, withGrants("sign signers keyward.dev/*"), "keyward.dev/a")
	if err := g2.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	g2.Refused(context.Background(), "keyward.dev/a", "422")
	if g2.Blocked("keyward.dev/a") == nil {
		t.Fatal("not blocked after a refusal")
	}
	if err := g2.Check(context.Background()); err != nil || g2.Blocked("keyward.dev/a") != nil {
		t.Fatalf("after a passing check: %v, blocked %v", err, g2.Blocked("keyward.dev/a"))
	}
}

// A signer that cannot ask kube-apiserver about its grants signs nothing
// until a check answers (fail closed), then goes on.
func TestPermissionGateBlocksUntilACheckAnswers(t *testing.T) {
	client := fake.NewClientset()
	var down bool = true
	client.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if down {
			return true, nil, errors.New("connection refused")
		}
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	g := NewPermissionGate(client, []string{"keyward.dev/a"}, nil, nil)
	if err := g.Check(context.Background()); err == nil {
		t.Fatal("Check succeeded while the reviews fail")
	}
	if g.Blocked("keyward.dev/a") == nil {
		t.Fatal("not blocked before any check answered")
	}
	down = false
	if err := g.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := g.Blocked("keyward.dev/a"); err != nil {
		t.Fatalf("blocked after a passing check: %v", err)
	}
}

// A grant every name needs (update on the status), missing across many
// rechecks, is one error line, and every signer name reports it (the
// keyward_signer_permission_missing gauge); it coming back is reported too.
func TestAMissingGeneralGrantIsReportedOncePerChange(t *testing.T) {
	granted := map[string]bool{"get podcertificaterequests": true, "list podcertificaterequests": true, "watch podcertificaterequests": true, "sign signers keyward.dev/*": true}
	g := gateAgainst(t, granted, "keyward.dev/a", "keyward.dev/b")
	state := map[string]bool{}
	g.onState = func(n string, missing bool) { state[n] = missing }
	var buf bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&buf))))
	for range 3 {
		_ = g.Check(ctx)
	}
	if n := strings.Count(buf.String(), "Not issuing for any signer name"); n != 1 {
		t.Fatalf("%d error lines for one missing grant over 3 checks, want 1:\n%s", n, buf.String())
	}
	if !state["keyward.dev/a"] || !state["keyward.dev/b"] {
		t.Fatalf("names reported missing: %v, want both", state)
	}
	granted["update podcertificaterequests/status"] = true
	if err := g.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if state["keyward.dev/a"] || state["keyward.dev/b"] {
		t.Fatalf("names still reported missing after the grant: %v", state)
	}
}

// A signer serving CertificateSigningRequests needs their grants (and,
// serving only them, not the PodCertificateRequest ones).
func TestPermissionGateChecksTheGrantsOfTheKindsServed(t *testing.T) {
	csrGrants := []string{"get certificatesigningrequests", "list certificatesigningrequests", "watch certificatesigningrequests", "update certificatesigningrequests/status", "sign signers kubernetes.io/kubelet-serving"}
	only := func(gs ...string) map[string]bool {
		m := map[string]bool{}
		for _, g := range gs {
			m[g] = true
		}
		return m
	}
	cases := []struct {
		name       string
		pcrs, csrs bool
		granted    map[string]bool
		wantErr    bool
	}{
		{"a CSR-only signer with the CSR grants is not blocked", false, true, only(csrGrants...), false},
		{"a CSR-only signer without status update on CSRs is blocked", false, true, only(csrGrants[0], csrGrants[1], csrGrants[3]), true},
		{"a signer serving both without the CSR grants is blocked", true, true, withGrants("sign signers kubernetes.io/kubelet-serving"), true},
		{"a signer serving both with every grant is not blocked", true, true, withGrants(csrGrants...), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := gateAgainst(t, tc.granted, "kubernetes.io/kubelet-serving")
			g.Required = RequiredPermissions(tc.pcrs, tc.csrs)
			err := g.Check(context.Background())
			var missing *MissingPermissionError
			if (err != nil) != tc.wantErr || (err != nil && !errors.As(err, &missing)) {
				t.Fatalf("Check = %v, want blocked %v", err, tc.wantErr)
			}
			if blocked := g.Blocked("kubernetes.io/kubelet-serving") != nil; blocked != tc.wantErr {
				t.Fatalf("Blocked = %v, want %v", blocked, tc.wantErr)
			}
		})
	}
}
