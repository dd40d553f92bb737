package softhsmtests

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/record"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/pcr"
	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
)

// An identity that may write an Authority and its status (the token
// service's grant before issue 25; here a test-only ClusterRole) adds a
// generation with its own root and writes its status phase Promoted, under
// the trust publisher's own field manager name. The apiserver records that
// name in managedFields as given: it proves nothing. The trust publisher
// must not put the rogue root in the live bundle, must say so on the
// Authority (condition and Warning Event), and must keep the honest root
// published.
func TestRoguePhaseInStatusPublishesNothing(t *testing.T) {
	honest, rogue := newTestCA(t), newTestCA(t)
	gates := kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: time.Hour}, PropagationWindow: &metav1.Duration{Duration: time.Second}}
	f := newRotationFixture(t, gates, genSpec("old", honest, kwv1alpha1.PhaseActive))
	startTrustPublisher(t, cp.AdminConfig(), f.signer)
	f.keyReady("old")
	f.waitFor("old Active", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive}))
	f.checkBundles("bootstrap", []*testCA{honest}, []*testCA{honest})

	user := uniqueName(t, "rogue-writer")
	grant(t, f.ctx, user, user, []rbacv1.PolicyRule{{
		APIGroups: []string{"keyward.dev"}, Resources: []string{"authorities", "authorities/status"},
		Verbs: []string{"get", "patch", "update"},
	}})
	cfg, err := cp.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	waitAllowed(t, f.ctx, cfg, authzv1.ResourceAttributes{Group: "keyward.dev", Resource: "authorities", Subresource: "status", Verb: "patch", Name: f.name})
	rc, err := authclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	force := true
	spec := `{"spec":{"generations":[{"name":"rogue","keyURI":"pkcs11:token=keyward;object=rogue","certificatePEM":` + string(mustJSON(t, rogue.pem)) + `,"phase":"Retired"}]}}`
	if _, err := rc.Patch(f.ctx, f.name, types.ApplyPatchType, []byte(`{"apiVersion":"keyward.dev/v1alpha1","kind":"Authority","metadata":{"name":"`+f.name+`"},`+spec[1:]),
		metav1.PatchOptions{FieldManager: "rogue-spec", Force: &force}); err != nil {
		t.Fatalf("adding the rogue generation as %s: %v", user, err)
	}
	// Let the trust publisher settle on the spec edit first: a status
	// write of its own in flight would overwrite the rogue phase (same
	// field manager name) before it is ever seen.
	f.waitFor("rogue Retired", phasesAre(map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "rogue": kwv1alpha1.PhaseRetired}))
	f.steady()
	since := metav1.NewTime(time.Now().Add(-24 * time.Hour).Truncate(time.Second))
	written, err := rc.ApplyStatus(f.ctx, f.name, map[string]any{"generations": []map[string]any{{"name": "rogue", "phase": "Promoted", "since": since}}},
		kwv1alpha1.FieldManagerTrustPublisher)
	if err != nil {
		t.Fatalf("writing the rogue phase as %s: %v", user, err)
	}
	t.Logf("status as written by %s: %s", user, statusSummary(written))

	// What the apiserver did with the forged field manager name.
	admin, err := authclient.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	if a, err := admin.Get(f.ctx, f.name); err == nil {
		if w, _ := record.PhaseWriter(a, "rogue"); w != "" {
			t.Logf("managedFields name %q as the writer of the rogue phase (written by user %s)", w, user)
		}
	}

	// The live bundle never holds the rogue root, for longer than the
	// propagation window the rogue since would have satisfied.
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, v := range []string{"live", "canary"} {
			for _, der := range kubeletView(t, f.ctx, f.signer, v) {
				if string(der) == string(rogue.cert.Raw) {
					t.Fatalf("the rogue root is in the %s ClusterTrustBundle", v)
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	a := f.waitFor("condition "+"PhasesTrusted"+" False", func(a *kwv1alpha1.Authority) bool {
		c := meta.FindStatusCondition(a.Status.Conditions, "PhasesTrusted")
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == "PhaseNotOurs"
	})
	c := meta.FindStatusCondition(a.Status.Conditions, "PhasesTrusted")
	if !strings.Contains(c.Message, "generation rogue") || !strings.Contains(c.Message, kwv1alpha1.FieldManagerTrustPublisher) {
		t.Errorf("condition message %q: want it to name generation rogue and the field manager that claimed it", c.Message)
	}
	if p := observed(a, "rogue").Phase; p == kwv1alpha1.PhasePromoted {
		t.Errorf("status still shows rogue %s: the trust publisher did not restore its own phase", p)
	}
	f.checkBundles("after the rogue write", []*testCA{honest}, []*testCA{honest})

	err = wait.PollUntilContextTimeout(f.ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := cp.AdminClient().CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: fields.Set{"involvedObject.name": f.name, "reason": "PhaseNotOurs"}.String()})
		return err == nil && len(evs.Items) > 0 && evs.Items[0].Type == "Warning", nil
	})
	if err != nil {
		t.Fatalf("no Warning Event %s on Authority %s: %v", "PhaseNotOurs", f.name, err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A forger that may write the Authority's status (a test-only grant, the
// token service's own before issue 25) keeps writing status "B Active, A
// Promoted" under the trust publisher's field manager name while B's root
// is only in the canary bundle. The running signer, trust publisher on,
// never signs with B's key: it signs with what the trust publisher's record
// on the bundles calls Active (A), counted per key on the backend side.
// Before the record was read, the signer switched to B at each forged write.
func TestForgedActiveIsNeverSignedWith(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r := newE2ERotation(t, ctx, "forged")
	r.soak = time.Hour // B stays Staged: only a forger could make it Active
	keyPrefix := strings.TrimPrefix(r.signer, "keyward.dev/")
	var counts signCounts
	rs := startSignerRegistry(t, r.signerConfig(), "replica-0", pcr.V1, countingRegistry(t, &counts), 0)

	r.caInit("a", tokenKeyURI(keyPrefix+"-a"))
	r.waitPhases("A Active by bootstrap", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive})
	issuingWith(t, ctx, rs, "a")
	caA := r.ca("a")
	r.caInit("b", tokenKeyURI(keyPrefix+"-b"))
	r.waitPhases("B Staged", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhaseStaged})
	caB := r.ca("b")
	w := podOnNode(t, ctx, uniqueName(t, "node"), r.signer)
	issuedLeaf(t, issue(t, ctx, w, r.signer), caA)

	user := uniqueName(t, "forger")
	grant(t, ctx, user, user, []rbacv1.PolicyRule{{APIGroups: []string{"keyward.dev"}, Resources: []string{"authorities/status"}, Verbs: []string{"get", "patch"}}})
	cfg, err := cp.UserConfig(user)
	if err != nil {
		t.Fatal(err)
	}
	waitAllowed(t, ctx, cfg, authzv1.ResourceAttributes{Group: "keyward.dev", Resource: "authorities", Subresource: "status", Verb: "patch", Name: r.obj})
	fc, err := authclient.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	forge := func() error {
		now := metav1.NewTime(time.Now().Add(-24 * time.Hour).Truncate(time.Second))
		_, err := fc.ApplyStatus(ctx, r.obj, map[string]any{"generations": []map[string]any{
			{"name": "a", "phase": "Promoted", "since": now}, {"name": "b", "phase": "Active", "since": now},
		}}, kwv1alpha1.FieldManagerTrustPublisher)
		return err
	}
	if err := forge(); err != nil {
		t.Fatalf("the forged status write as %s: %v", user, err)
	}
	bBefore := counts.of(caB.fp).Load()
	forging, stopForging := context.WithCancel(ctx)
	forged := make(chan int)
	go func() {
		n := 0
		for forging.Err() == nil {
			if forge() == nil {
				n++
			}
			time.Sleep(20 * time.Millisecond)
		}
		forged <- n
	}()
	for i := range 8 {
		leaf := issuedLeaf(t, issue(t, ctx, w, r.signer), caA)
		if leaf == nil {
			t.Fatalf("leaf %d not signed by A", i)
		}
	}
	stopForging()
	n := <-forged
	if n < 5 {
		t.Fatalf("only %d forged status writes landed: the attack was not made", n)
	}
	if got := counts.of(caB.fp).Load() - bBefore; got != 0 {
		t.Fatalf("B's key signed %d times while only a forged status called B Active", got)
	}
	b, err := os.ReadFile(rs.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"Issuing with CA generation"`) && strings.Contains(string(b), `generation="b"`) {
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"Issuing with CA generation"`) && strings.Contains(line, `generation="b"`) {
				t.Fatalf("the signer switched to the forged Active generation: %s", line)
			}
		}
	}
	t.Logf("%d forged status writes; 8 leaves, all signed by A; B's key signed nothing", n)
}
