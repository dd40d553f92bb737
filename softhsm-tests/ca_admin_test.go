package softhsmtests

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/cmd/keyward/app"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// keywardAs runs the keyward command tree in-process with kubeconfig.
func keywardAs(t *testing.T, kubeconfig string, args ...string) (string, error) {
	t.Helper()
	cmd := app.NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--kubeconfig", kubeconfig))
	cmd.SetContext(testContext(t))
	err := cmd.Execute()
	return out.String(), err
}

// keyAbsent fails the test unless the token has no key at uri.
func keyAbsent(t *testing.T, uri, why string) {
	t.Helper()
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	k, err := reg.Open(testContext(t), backends.OpenRequest{URI: uri})
	if err == nil {
		k.Close()
		t.Fatalf("%s: the token still holds a key at %s", why, uri)
	}
	if !errors.Is(err, backends.ErrNotFound) {
		t.Fatalf("%s: opening %s: got %v, want ErrNotFound", why, uri, err)
	}
}

// The production path for creating CAs (docs/production/ca-admin.md), with
// the shipped RBAC (deploy/kustomize/base/rbac.yaml) on a real apiserver:
//   - the signer's ServiceAccount (what the HSM guide once said to exec in
//     as) is refused before any key is made, with a message naming the
//     identity, the verb and the keyward-ca-admin role: no key is left;
//   - keyward-ca-admin creates the Authority with g1, then adds g2;
//   - a write the apiserver refuses after the key was made (here an
//     admission policy) destroys the key it made: nothing is left in the
//     HSM, and the message says so.
func TestCAAdminPathAndNoOrphanedKeys(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c := authorityClient(t)
	u := uniqueName(t, "caadmin")
	signer := "keyward.dev/" + u
	initArgs := func(gen string) []string {
		return []string{"ca", "init", "--signer", signer, "--generation", gen, "--key-uri", tokenKeyURI(u + "-" + gen), "--create-key"}
	}

	// 1. The signer's own identity may not create Authorities.
	out, err := keywardAs(t, serviceAccountKubeconfig(t, signerServiceAccount), initArgs("g1")...)
	if err == nil {
		t.Fatalf("ca init as the signer's ServiceAccount succeeded:\n%s", out)
	}
	for _, want := range []string{"system:serviceaccount:" + signerNamespace + ":" + signerServiceAccount, "may not create authorities.keyward.dev", "no key was made", "keyward-ca-admin"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal %q does not say %q", err, want)
		}
	}
	keyAbsent(t, tokenKeyURI(u+"-g1"), "refused before the key")
	if a := authorityFor(t, c, signer); a != nil {
		t.Fatalf("the refused run made Authority %s", a.Name)
	}

	// 2. keyward-ca-admin creates the Authority, then adds a generation.
	admin := serviceAccountKubeconfig(t, "keyward-ca-admin")
	if out, err := keywardAs(t, admin, initArgs("g1")...); err != nil {
		t.Fatalf("ca init g1 as keyward-ca-admin: %v\n%s", err, out)
	}
	if out, err := keywardAs(t, admin, initArgs("g2")...); err != nil {
		t.Fatalf("ca init g2 as keyward-ca-admin: %v\n%s", err, out)
	}
	a := authorityFor(t, c, signer)
	if a == nil || len(a.Spec.Generations) != 2 {
		t.Fatalf("Authority after g1 and g2: %+v", a)
	}

	// 3. A write refused after the key was made destroys that key.
	refuseGeneration(t, ctx, a.Name, "g3")
	out, err = keywardAs(t, admin, initArgs("g3")...)
	if err == nil {
		t.Fatalf("ca init g3 succeeded past the admission policy:\n%s", out)
	}
	for _, want := range []string{"g3 is frozen by policy", "the key created for it is gone", "destroyed the key pair"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the failure %q does not say %q", err, want)
		}
	}
	keyAbsent(t, tokenKeyURI(u+"-g3"), "the generation was refused after the key was made")
	if after := authorityFor(t, c, signer); after.ResourceVersion != a.ResourceVersion {
		t.Error("the refused run changed the Authority")
	}
	// The keys of g1 and g2 are untouched.
	for _, g := range a.Spec.Generations {
		openKeySPKI(t, all.Options{}, g.KeyURI)
	}
}

// refuseGeneration installs a ValidatingAdmissionPolicy that denies any
// write of Authority authority adding generation gen, until the test ends.
func refuseGeneration(t *testing.T, ctx context.Context, authority, gen string) {
	t.Helper()
	adm := cp.AdminClient().AdmissionregistrationV1()
	name := uniqueName(t, "freeze")
	fail := admissionregistrationv1.Fail
	if _, err := adm.ValidatingAdmissionPolicies().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
				ResourceNames: []string{authority},
				RuleWithOperations: admissionregistrationv1.RuleWithOperations{
					Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
					Rule:       admissionregistrationv1.Rule{APIGroups: []string{"keyward.dev"}, APIVersions: []string{"*"}, Resources: []string{"authorities"}},
				},
			}}},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "object.spec.generations.all(g, g.name != '" + gen + "')",
				Message:    "generation " + gen + " is frozen by policy",
			}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(ctx, &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	// The policy takes effect once the apiserver's policy informer has it:
	// a dry-run update adding gen is refused then.
	c := authorityClient(t)
	deadline := time.Now().Add(30 * time.Second)
	for {
		a, err := c.Get(ctx, authority)
		if err != nil {
			t.Fatal(err)
		}
		g := a.Spec.Generations[0]
		g.Name, g.Phase = gen, kwv1alpha1.PhaseStaged
		a.Spec.Generations = append(a.Spec.Generations, g)
		_, err = c.Update(ctx, a, metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil && strings.Contains(err.Error(), "frozen by policy") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the admission policy does not refuse %s after 30s (last answer: %v)", gen, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
