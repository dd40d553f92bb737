package softhsmtests

import (
	"strings"
	"testing"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

// A user who may update only an Authority's spec replaces the key and
// root of a generation whose root already soaked in a bundle (status
// Staged, then Promoted) and never signed: the new root would inherit the
// soak. The apiserver must refuse the edit; a new root is a new generation.
func TestRootSwapOfAPublishedGenerationIsRefused(t *testing.T) {
	oldCA, newCA, swapCA := newTestCA(t), newTestCA(t), newTestCA(t)
	gates := kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: 2 * time.Second}, PropagationWindow: &metav1.Duration{Duration: time.Second}}
	f := newRotationFixture(t, gates, genSpec("old", oldCA, kwv1alpha1.PhaseActive))
	startTrustPublisher(t, cp.AdminConfig(), f.signer)
	f.keyReady("old")
	f.waitFor("old Active", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive}))

	user := uniqueName(t, "spec-editor")
	grant(t, f.ctx, user, user, []rbacv1.PolicyRule{{APIGroups: []string{"keyward.dev"}, Resources: []string{"authorities"}, Verbs: []string{"get", "update", "patch"}}})
	cfg, err := cp.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	waitAllowed(t, f.ctx, cfg, authzv1.ResourceAttributes{Group: "keyward.dev", Resource: "authorities", Verb: "update", Name: f.name})
	uc, err := authclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	swap := func(phase kwv1alpha1.Phase) {
		t.Helper()
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			a, err := uc.Get(f.ctx, f.name)
			if err != nil {
				return err
			}
			for i := range a.Spec.Generations {
				if a.Spec.Generations[i].Name == "new" {
					a.Spec.Generations[i].KeyURI = "pkcs11:token=keyward;object=swapped"
					a.Spec.Generations[i].CertificatePEM = swapCA.pem
				}
			}
			_, err = uc.Update(f.ctx, a, metav1.UpdateOptions{})
			return err
		})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "a new root is a new generation") {
			t.Fatalf("swapping the root of generation new (status %s) as %s: err = %v, want Invalid (a new root is a new generation)", phase, user, err)
		}
	}

	f.edit(func(a *kwv1alpha1.Authority) {
		a.Spec.Generations = append(a.Spec.Generations, genSpec("new", newCA, kwv1alpha1.PhaseStaged))
	})
	f.waitFor("new Staged", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "new": kwv1alpha1.PhaseStaged}))
	swap(kwv1alpha1.PhaseStaged)

	f.keyReady("new")
	f.setPhases(map[string]kwv1alpha1.Phase{"new": kwv1alpha1.PhasePromoted})
	f.waitFor("new Promoted", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "new": kwv1alpha1.PhasePromoted}))
	swap(kwv1alpha1.PhasePromoted)
	f.checkBundles("after the refused swaps", []*testCA{oldCA, newCA}, []*testCA{oldCA, newCA})
}
