package softhsmtests

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/cmd/keyward/app"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
	"github.com/keyward/keyward/trustpublisher"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// The compressed gates of the end-to-end rotations.
const (
	e2eSoak   = 2 * time.Second
	e2eWindow = time.Second
)

// e2eRotation drives one signer name's rotation end to end: keyward ca
// and keyward trust run in-process as an operator would run them, the
// real signer (with the real trust publisher under its Lease) does the
// rest.
type e2eRotation struct {
	t      *testing.T
	ctx    context.Context
	c      *authclient.Client
	signer string
	// obj is the Authority ca init made for signer.
	obj string
	// soak is the canary soak caInit sets (default e2eSoak).
	soak time.Duration
}

func newE2ERotation(t *testing.T, ctx context.Context, prefix string) *e2eRotation {
	t.Helper()
	authorities(t) // the CRD is served before any signer starts
	r := &e2eRotation{t: t, ctx: ctx, c: authorityClient(t), signer: "keyward.dev/" + uniqueName(t, prefix), soak: e2eSoak}
	t.Cleanup(func() {
		if r.obj != "" {
			_ = r.c.Delete(context.Background(), r.obj, metav1.DeleteOptions{})
		}
	})
	return r
}

// signerConfig is the policy of r's signer name with the trust publisher
// on, as `keyward signer` runs by default.
func (r *e2eRotation) signerConfig() *config.SignerConfiguration {
	r.t.Helper()
	cfg := baseConfig(r.t, config.Signer{Name: r.signer, Profile: config.ProfilePodIdentity})
	on := true
	cfg.TrustPublisher.Enabled = &on
	return cfg
}

// caInit runs `keyward ca init --create-key` for generation gen. The
// first one creates the Authority with the compressed gates beforehand,
// as make demo does (the CLI has no flag for them): set by an edit after
// ca init, a bundle change the trust publisher made before the edit
// would hold the default 5m window it recorded.
func (r *e2eRotation) caInit(gen, keyURI string, flags ...string) {
	r.t.Helper()
	if r.obj == "" {
		name := strings.ReplaceAll(r.signer, "/", ".")
		_, err := r.c.Create(r.ctx, &kwv1alpha1.Authority{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: kwv1alpha1.AuthoritySpec{SignerName: r.signer, Gates: kwv1alpha1.Gates{
				CanarySoak:        &metav1.Duration{Duration: r.soak},
				PropagationWindow: &metav1.Duration{Duration: e2eWindow},
			}},
		}, metav1.CreateOptions{FieldManager: kwv1alpha1.FieldManagerCLI})
		switch {
		case apierrors.IsAlreadyExists(err):
			r.obj = name
			r.edit(func(a *kwv1alpha1.Authority) {
				a.Spec.Gates.CanarySoak = &metav1.Duration{Duration: r.soak}
				a.Spec.Gates.PropagationWindow = &metav1.Duration{Duration: e2eWindow}
			})
		case err != nil:
			r.t.Fatalf("creating Authority %s with compressed gates: %v", name, err)
		default:
			r.obj = name
		}
	}
	args := append([]string{"ca", "init", "--signer", r.signer, "--generation", gen, "--key-uri", keyURI, "--create-key"}, flags...)
	out, err := keyward(r.t, args...)
	if err != nil {
		r.t.Fatalf("keyward ca init %s: %v\n%s", gen, err, out)
	}
}

func (r *e2eRotation) edit(mutate func(a *kwv1alpha1.Authority)) {
	r.t.Helper()
	// The trust publisher writes status often during a rotation: retry
	// a conflict for longer than retry.DefaultRetry's 50 ms.
	backoff := wait.Backoff{Steps: 20, Duration: 20 * time.Millisecond, Factor: 1.5, Jitter: 0.2, Cap: time.Second}
	err := retry.RetryOnConflict(backoff, func() error {
		a, err := r.c.Get(r.ctx, r.obj)
		if err != nil {
			return err
		}
		mutate(a)
		_, err = r.c.Update(r.ctx, a, metav1.UpdateOptions{FieldManager: kwv1alpha1.FieldManagerCLI})
		return err
	})
	if err != nil {
		r.t.Fatalf("editing Authority %s: %v", r.obj, err)
	}
}

func (r *e2eRotation) get() *kwv1alpha1.Authority {
	r.t.Helper()
	a, err := r.c.Get(r.ctx, r.obj)
	if err != nil {
		r.t.Fatal(err)
	}
	return a
}

// ca is generation gen as stored: its key URI, root and key fingerprint.
func (r *e2eRotation) ca(gen string) tokenCA {
	r.t.Helper()
	g := generation(r.t, r.get(), gen)
	certs, err := trustpublisher.ParseGeneration(g)
	if err != nil {
		r.t.Fatal(err)
	}
	root := certs[len(certs)-1]
	fp, err := backends.Fingerprint(root.PublicKey)
	if err != nil {
		r.t.Fatal(err)
	}
	return tokenCA{uri: g.KeyURI, pem: g.CertificatePEM, root: root, fp: fp}
}

// waitPhases waits until status shows every generation of want in its
// phase with the bundles published, and returns the Authority.
func (r *e2eRotation) waitPhases(what string, want map[string]kwv1alpha1.Phase) *kwv1alpha1.Authority {
	r.t.Helper()
	var last *kwv1alpha1.Authority
	err := wait.PollUntilContextTimeout(r.ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		a, err := r.c.Get(ctx, r.obj)
		if err != nil {
			return false, err
		}
		last = a
		return phasesAre(want)(a), nil
	})
	if err != nil {
		r.t.Fatalf("waiting for %s: %v; status: %s", what, err, statusSummary(last))
	}
	return last
}

// trust runs `keyward trust VERB SIGNER GEN` until a gate no longer holds
// it, and returns the first refusal (nil when the first run went through).
// Every refusal must be a GateError with exit code 3 that changed nothing.
func (r *e2eRotation) trust(verb, gen string) *app.GateError {
	r.t.Helper()
	var first *app.GateError
	for {
		before := r.get()
		out, err := keyward(r.t, "trust", verb, r.signer, gen)
		if err == nil {
			return first
		}
		var gate *app.GateError
		if !errors.As(err, &gate) {
			r.t.Fatalf("keyward trust %s %s: %v\n%s", verb, gen, err, out)
		}
		if code := app.ExitCode(err); code != app.ExitGateHolds {
			r.t.Fatalf("keyward trust %s %s refused with exit code %d, want %d", verb, gen, code, app.ExitGateHolds)
		}
		if after := r.get(); after.Generation != before.Generation {
			r.t.Fatalf("a refused trust %s changed the spec (generation %d → %d)", verb, before.Generation, after.Generation)
		}
		if first == nil {
			first = gate
			r.t.Logf("keyward trust %s %s %s (refused, exit 3):\n%s", verb, r.signer, gen, strings.TrimSpace(out))
		}
		wait := 100 * time.Millisecond
		if gate.Step.OpensAt != nil {
			wait = max(wait, time.Until(*gate.Step.OpensAt)+50*time.Millisecond)
		}
		select {
		case <-r.ctx.Done():
			r.t.Fatalf("keyward trust %s %s still refused when the test ran out of time: %v", verb, gen, err)
		case <-time.After(wait):
		}
	}
}

// refused runs `keyward trust VERB SIGNER GEN` once and returns its
// refusal, failing the test unless it was a GateError with exit code 3
// that changed nothing.
func (r *e2eRotation) refused(verb, gen string) *app.GateError {
	r.t.Helper()
	before := r.get()
	var out string
	var gate *app.GateError
	// Right after a phase move the bundles' confirming status write may
	// still be under way, and BundleNotPublished is named first: that
	// refusal is the moment, not the gate under test; look again.
	for deadline := time.Now().Add(10 * time.Second); ; {
		var err error
		out, err = keyward(r.t, "trust", verb, r.signer, gen)
		gate = nil
		if !errors.As(err, &gate) || app.ExitCode(err) != app.ExitGateHolds {
			r.t.Fatalf("keyward trust %s %s: got %v (exit code %d), want a refusal with exit code %d\n%s", verb, gen, err, app.ExitCode(err), app.ExitGateHolds, out)
		}
		if gate.Step.Gate != kwv1alpha1.GateBundleNotPublished || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if after := r.get(); after.Generation != before.Generation || !slices.EqualFunc(after.Spec.Generations, before.Spec.Generations,
		func(x, y kwv1alpha1.Generation) bool { return x.Name == y.Name && x.Phase == y.Phase }) {
		r.t.Fatalf("a refused trust %s changed the spec (generation %d → %d)", verb, before.Generation, after.Generation)
	}
	if !strings.Contains(out, gate.Step.Gate) {
		r.t.Errorf("the refusal does not name the gate %s:\n%s", gate.Step.Gate, out)
	}
	r.t.Logf("keyward trust %s %s %s (refused, exit 3):\n%s", verb, r.signer, gen, strings.TrimSpace(out))
	return gate
}

// trustView is what a workload on each label trusts: the roots kubelet
// would project for the canary and the live label.
type trustView struct {
	phase        string
	canary, live [][]byte
}

// waitBundles waits until kubelet's view of the canary and live bundles
// holds exactly the given roots, and returns it.
func (r *e2eRotation) waitBundles(phase string, canary, live []tokenCA) trustView {
	r.t.Helper()
	same := func(got [][]byte, want []tokenCA) bool {
		if len(got) != len(want) {
			return false
		}
		for _, w := range want {
			if !slices.ContainsFunc(got, func(d []byte) bool { return bytes.Equal(d, w.root.Raw) }) {
				return false
			}
		}
		return true
	}
	var v trustView
	// kubeletView reads with the test's context: the poll's ends with its
	// timeout, and a List cut short by it would hide the message below.
	err := wait.PollUntilContextTimeout(r.ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		v = trustView{phase: phase, canary: kubeletView(r.t, r.ctx, r.signer, "canary"), live: kubeletView(r.t, r.ctx, r.signer, "live")}
		return same(v.canary, canary) && same(v.live, live), nil
	})
	if err != nil {
		subjects := func(roots [][]byte) []string {
			var out []string
			for _, d := range roots {
				c, err := x509.ParseCertificate(d)
				if err != nil {
					out = append(out, err.Error())
					continue
				}
				out = append(out, c.Subject.CommonName)
			}
			return out
		}
		var wantC, wantL []string
		for _, c := range canary {
			wantC = append(wantC, c.root.Subject.CommonName)
		}
		for _, c := range live {
			wantL = append(wantL, c.root.Subject.CommonName)
		}
		r.t.Fatalf("%s: kubelet sees canary %q and live %q, want %q and %q; status: %s",
			phase, subjects(v.canary), subjects(v.live), wantC, wantL, statusSummary(r.get()))
	}
	return v
}

// issuedLeaf is the leaf of an issued PCR, ready for x509.Verify (the
// PodIdentity extension, critical by design, is cleared by parseChain).
func issuedLeaf(t *testing.T, p *certv1.PodCertificateRequest, ca tokenCA) *x509.Certificate {
	t.Helper()
	if !signedBy(t, p, ca) {
		t.Fatalf("PCR %s/%s was not signed by %s", p.Namespace, p.Name, ca.root.Subject)
	}
	return parseChain(t, p.Status.CertificateChain, ca.root)
}

// issue has the node request a pod certificate and waits for it.
func issue(t *testing.T, ctx context.Context, w *controlplane.WorkloadObjects, signer string) *certv1.PodCertificateRequest {
	t.Helper()
	p, _ := createPCR(t, ctx, w, signer, pcrOptions{})
	return waitTerminal(t, ctx, p, 30*time.Second)
}

// issueUntilSignedBy requests certificates until one is signed by ca (a
// replica applies an activation it reads through its informer, a moment
// after status shows it) and returns that leaf.
func issueUntilSignedBy(t *testing.T, ctx context.Context, w *controlplane.WorkloadObjects, signer string, ca tokenCA) *x509.Certificate {
	t.Helper()
	var p *certv1.PodCertificateRequest
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		p = issue(t, ctx, w, signer)
		return signedBy(t, p, ca), nil
	})
	if err != nil {
		t.Fatalf("no leaf signed by %s: %v", ca.root.Subject, err)
	}
	return issuedLeaf(t, p, ca)
}

// gateOverriddenEvent waits for the trust publisher's GateOverridden Event
// on Authority obj and returns it.
func gateOverriddenEvent(t *testing.T, ctx context.Context, obj string) *corev1.Event {
	t.Helper()
	var event *corev1.Event
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := cp.AdminClient().CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{
			FieldSelector: fields.Set{"involvedObject.name": obj, "reason": trustpublisher.EventGateOverridden}.String(),
		})
		if err != nil || len(list.Items) == 0 {
			return false, err
		}
		event = &list.Items[0]
		return true, nil
	})
	if err != nil {
		t.Fatalf("no %s Event on Authority %s: %v", trustpublisher.EventGateOverridden, obj, err)
	}
	return event
}

// A whole rotation A → B, end to end: `keyward ca init` bootstraps A and
// stages B (keys made in SoftHSM), `keyward trust` drives it, the real
// signer issues and reports keyCheck and lastIssuedNotAfter, and the real
// trust publisher under its Lease moves phases and publishes. Early
// promotion is refused naming CanarySoak; retiring A is refused naming
// LeavesValid (A's leaves live 24h) and forced with a reason, which leaves
// a GateOverridden Event. At every phase the canary and live bundles are
// read as kubelet selects them; the leaves issued before and after
// activation verify against exactly the bundles they should.
func TestRotationEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r := newE2ERotation(t, ctx, "rot")
	// Status times are whole seconds, so up to a second of the soak has
	// passed when status shows B Staged; 3s leaves the refusal below a
	// margin of 2s on a busy machine.
	r.soak = 3 * time.Second
	rs := startSigner(t, r.signerConfig(), "replica-0", pcr.V1, all.Options{})
	keyPrefix := strings.TrimPrefix(r.signer, "keyward.dev/")
	start := time.Now()
	var times []string
	mark := func(phase string) {
		times = append(times, fmt.Sprintf("%s +%s", phase, time.Since(start).Round(10*time.Millisecond)))
	}

	// Bootstrap: A desired Active, Active once the signer reports its key.
	r.caInit("a", tokenKeyURI(keyPrefix+"-a"), "--subject", "CN=rotation root A")
	a := r.waitPhases("A Active by bootstrap", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive})
	if kc := observed(a, "a").KeyCheck; kc == nil || !kc.Ready {
		t.Fatalf("A Active without a ready keyCheck: %+v", kc)
	}
	mark("A Active")
	caA := r.ca("a")
	var views []trustView
	views = append(views, r.waitBundles("A Active", []tokenCA{caA}, []tokenCA{caA}))
	if err := waitReady(rs.HealthAddr); err != nil {
		t.Fatalf("signer not ready with A Active: %v", err)
	}
	w := podOnNode(t, ctx, uniqueName(t, "node"), r.signer)
	leaves := map[string]*x509.Certificate{"A-leaf": issuedLeaf(t, issue(t, ctx, w, r.signer), caA)}

	// B staged: canary only; A still issues.
	mark("ca init B")
	rotationStart := time.Now()
	r.caInit("b", tokenKeyURI(keyPrefix+"-b"), "--subject", "CN=rotation root B")
	if g := generation(t, r.get(), "b"); g.Phase != kwv1alpha1.PhaseStaged {
		t.Fatalf("ca init of a second generation: desired %s, want Staged", g.Phase)
	}
	r.waitPhases("B Staged", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhaseStaged})
	mark("B Staged")
	// Promote at once: refused during the soak, naming the gate.
	if gate := r.refused("promote", "b"); gate.Step.Gate != kwv1alpha1.GateCanarySoak || gate.Step.OpensAt == nil {
		t.Fatalf("promote during the canary soak: refused by %s (opens at %v), want CanarySoak with when it opens", gate.Step.Gate, gate.Step.OpensAt)
	}
	caB := r.ca("b")
	views = append(views, r.waitBundles("B Staged", []tokenCA{caA, caB}, []tokenCA{caA}))
	if g := generationStatus(t, ctx, r.obj, "b", func(g kwv1alpha1.GenerationStatus) bool { return g.KeyCheck != nil }); !g.KeyCheck.Ready {
		t.Fatalf("B's keyCheck while Staged: %+v", *g.KeyCheck)
	}
	leaves["A-leaf while B Staged"] = issuedLeaf(t, issue(t, ctx, w, r.signer), caA)

	// Promote once the soak is over.
	r.trust("promote", "b")
	r.waitPhases("B Promoted", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhasePromoted})
	mark("B Promoted")
	views = append(views, r.waitBundles("B Promoted", []tokenCA{caA, caB}, []tokenCA{caA, caB}))
	leaves["A-leaf while B Promoted"] = issuedLeaf(t, issue(t, ctx, w, r.signer), caA)

	// Activate: B issues, A back to Promoted in the same status write.
	r.trust("activate", "b")
	a = r.waitPhases("B Active, A Promoted", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhasePromoted, "b": kwv1alpha1.PhaseActive})
	mark("B Active")
	if !observed(a, "b").Since.Equal(observed(a, "a").Since) {
		t.Errorf("B became Active at %v and A left Active at %v: not one status write", observed(a, "b").Since, observed(a, "a").Since)
	}
	views = append(views, r.waitBundles("B Active", []tokenCA{caA, caB}, []tokenCA{caA, caB}))
	leaves["B-leaf"] = issueUntilSignedBy(t, ctx, w, r.signer, caB)

	// Retire A: A's leaves (24h) are still valid, so LeavesValid holds;
	// forced with a reason, which the trust publisher records in an Event.
	lastA := observed(r.get(), "a").LastIssuedNotAfter
	if lastA == nil || lastA.Time.Before(leaves["A-leaf while B Promoted"].NotAfter) {
		t.Fatalf("A's lastIssuedNotAfter %v does not cover its last leaf (notAfter %s)", lastA, leaves["A-leaf while B Promoted"].NotAfter)
	}
	var held *app.GateError
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		before := r.get()
		out, err := keyward(t, "trust", "retire", r.signer, "a")
		if !errors.As(err, &held) || app.ExitCode(err) != app.ExitGateHolds {
			return false, fmt.Errorf("retire with A's leaves valid: got %v (exit %d), want a refusal with exit 3\n%s", err, app.ExitCode(err), out)
		}
		if after := r.get(); after.Generation != before.Generation {
			return false, fmt.Errorf("a refused retire changed the spec")
		}
		if held.Step.Gate == kwv1alpha1.GateLeavesValid {
			t.Logf("keyward trust retire %s a (refused, exit 3):\n%s", r.signer, strings.TrimSpace(out))
		}
		return held.Step.Gate == kwv1alpha1.GateLeavesValid, nil
	})
	if err != nil {
		t.Fatalf("retiring A: %v (last refusal %+v)", err, held)
	}
	if held.Step.OpensAt == nil || !held.Step.OpensAt.Equal(lastA.Time) {
		t.Errorf("LeavesValid opens at %v, want A's lastIssuedNotAfter %s", held.Step.OpensAt, lastA.UTC())
	}
	const reason = "CHG-7 e2e: A's leaves trusted via live until they expire"
	if out, err := keyward(t, "trust", "retire", r.signer, "a", "--force", "--reason", reason); err != nil {
		t.Fatalf("retire --force: %v\n%s", err, out)
	}
	r.waitPhases("A Retiring", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseRetiring, "b": kwv1alpha1.PhaseActive})
	mark("A Retiring")
	views = append(views, r.waitBundles("A Retiring", []tokenCA{caB}, []tokenCA{caA, caB}))
	event := gateOverriddenEvent(t, ctx, r.obj)
	for _, want := range []string{"a", string(kwv1alpha1.PhaseRetiring), kwv1alpha1.GateLeavesValid, reason} {
		if !strings.Contains(event.Message, want) {
			t.Errorf("GateOverridden Event %q does not name %q", event.Message, want)
		}
	}
	t.Logf("GateOverridden Event: %s", event.Message)

	// Finish: LeavesValid holds it too (an override covers one step), so
	// it is refused by that gate and forced again.
	// The Retiring bundles' confirming status write may still be under
	// way (BundleNotPublished comes first then): refused by that, look
	// again.
	var out string
	var gate *app.GateError
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		var err error
		out, err = keyward(t, "trust", "finish", r.signer, "a")
		gate = nil
		if !errors.As(err, &gate) {
			return false, fmt.Errorf("finish with A's leaves valid: got %v, want a refusal\n%s", err, out)
		}
		return gate.Step.Gate == kwv1alpha1.GateLeavesValid, nil
	})
	if err != nil {
		t.Fatalf("finish with A's leaves valid: %v (last refusal %+v)\n%s", err, gate, out)
	}
	if out, err := keyward(t, "trust", "finish", r.signer, "a", "--force", "--reason", reason); err != nil {
		t.Fatalf("finish --force: %v\n%s", err, out)
	}
	a = r.waitPhases("A Retired", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseRetired, "b": kwv1alpha1.PhaseActive})
	mark("A Retired")
	elapsed, rotation := time.Since(start), time.Since(rotationStart)
	views = append(views, r.waitBundles("A Retired", []tokenCA{caB}, []tokenCA{caB}))
	if !meta.IsStatusConditionTrue(a.Status.Conditions, kwv1alpha1.ConditionReady) {
		t.Errorf("at the end: %s; want Ready", statusSummary(a))
	}
	leaves["B-leaf after finish"] = issuedLeaf(t, issue(t, ctx, w, r.signer), caB)
	t.Logf("compressed rotation (soak %s, propagation window %s): ca init B to A Retired %s; ca init A to A Retired %s (%s)",
		r.soak, e2eWindow, rotation.Round(100*time.Millisecond), elapsed.Round(100*time.Millisecond), strings.Join(times, ", "))
	if out, err := keyward(t, "trust", "status", r.signer); err != nil {
		t.Errorf("trust status: %v\n%s", err, out)
	} else {
		t.Logf("keyward trust status %s:\n%s", r.signer, out)
	}

	// What a workload on each label trusted at each phase.
	type want struct{ canary, live bool }
	truth := map[string][]want{ // per phase in views' order
		"A": {{true, true}, {true, true}, {true, true}, {true, true}, {false, true}, {false, false}},
		"B": {{false, false}, {true, false}, {true, true}, {true, true}, {true, true}, {true, true}},
	}
	for name, leaf := range leaves {
		gen := "A"
		if strings.HasPrefix(name, "B") {
			gen = "B"
		}
		for i, v := range views {
			got := want{verifiesAgainst(leaf, v.canary), verifiesAgainst(leaf, v.live)}
			if got != truth[gen][i] {
				t.Errorf("%s (notAfter %s) at %s: verifies against canary %v, live %v; want %v, %v",
					name, leaf.NotAfter.UTC().Format(time.RFC3339), v.phase, got.canary, got.live, truth[gen][i].canary, truth[gen][i].live)
			}
		}
	}
}

// issuingWith waits until the replica's log says it issues with gen: the
// replica has applied the activation it read from the Authority.
func issuingWith(t *testing.T, ctx context.Context, rs *runningSigner, gen string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		b, err := os.ReadFile(rs.LogPath)
		if err != nil {
			return false, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"Issuing with CA generation"`) && strings.Contains(line, `generation="`+gen+`"`) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("replica log %s never says it issues with generation %s: %v", rs.LogPath, gen, err)
	}
}

// Two signer replicas under one Lease, both with the trust publisher on,
// rotate A → B through keyward trust. Once status shows B Active and each
// replica says it issues with B, no leaf is signed with A's key —
// signatures counted per key on the backend side — neither by the leader
// nor by the standby after the leader stops and it takes over.
func TestRotationSwitchesBothReplicasOffTheOldKey(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r := newE2ERotation(t, ctx, "ha")
	keyPrefix := strings.TrimPrefix(r.signer, "keyward.dev/")
	var counts signCounts
	lease := uniqueName(t, "lease")
	replicas := map[string]*runningSigner{}
	for _, id := range []string{"replica-a", "replica-b"} {
		cfg := r.signerConfig()
		on := true
		cfg.LeaderElection = config.LeaderElection{Enabled: &on, Namespace: signerNamespace, LeaseName: lease,
			LeaseDuration: metav1.Duration{Duration: 6 * time.Second}, RenewDeadline: metav1.Duration{Duration: 4 * time.Second},
			RetryPeriod: metav1.Duration{Duration: 500 * time.Millisecond}}
		replicas[id] = startSignerRegistry(t, cfg, id, pcr.V1, countingRegistry(t, &counts), 0)
	}

	r.caInit("a", tokenKeyURI(keyPrefix+"-a"))
	r.waitPhases("A Active by bootstrap", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive})
	caA := r.ca("a")
	for id, rs := range replicas {
		issuingWith(t, ctx, rs, "a")
		if err := waitReady(rs.HealthAddr); err != nil {
			t.Fatalf("%s not ready: %v", id, err)
		}
	}
	w := podOnNode(t, ctx, uniqueName(t, "node"), r.signer)
	issuedLeaf(t, issue(t, ctx, w, r.signer), caA)

	r.caInit("b", tokenKeyURI(keyPrefix+"-b"))
	r.waitPhases("B Staged", map[string]kwv1alpha1.Phase{"b": kwv1alpha1.PhaseStaged})
	caB := r.ca("b")
	r.trust("promote", "b")
	r.waitPhases("B Promoted", map[string]kwv1alpha1.Phase{"b": kwv1alpha1.PhasePromoted})
	r.trust("activate", "b")
	r.waitPhases("B Active, A Promoted", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhasePromoted, "b": kwv1alpha1.PhaseActive})
	for _, rs := range replicas {
		issuingWith(t, ctx, rs, "b")
	}
	oldSignatures, newBefore := counts.of(caA.fp).Load(), counts.of(caB.fp).Load()
	if oldSignatures == 0 {
		t.Fatal("no signature counted for A's key before activation: the count does not see the backend")
	}
	for range 5 {
		issuedLeaf(t, issue(t, ctx, w, r.signer), caB)
	}

	l, err := cp.AdminClient().CoordinationV1().Leases(signerNamespace).Get(ctx, lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || replicas[*l.Spec.HolderIdentity] == nil {
		t.Fatalf("lease %s: %v (%+v)", lease, err, l.Spec)
	}
	leader := *l.Spec.HolderIdentity
	replicas[leader].Stop()
	for range 5 {
		issuedLeaf(t, issue(t, ctx, w, r.signer), caB)
	}
	l, err = cp.AdminClient().CoordinationV1().Leases(signerNamespace).Get(ctx, lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == leader {
		t.Fatalf("after stopping %s the lease is held by %v (%v)", leader, l.Spec.HolderIdentity, err)
	}
	if n := counts.of(caA.fp).Load(); n != oldSignatures {
		t.Fatalf("A's key signed %d times after both replicas switched to B, want 0", n-oldSignatures)
	}
	if n := counts.of(caB.fp).Load() - newBefore; n < 10 {
		t.Fatalf("B's key signed %d times for 10 leaves", n)
	}
	t.Logf("signatures: A %d (none after the switch), B %d; leader %s stopped, %s took over", oldSignatures, counts.of(caB.fp).Load(), leader, *l.Spec.HolderIdentity)
}

// A generation whose key is in Cloud KMS or AWS KMS (the wire-level fakes
// through the real SDKs, key made by keyward ca init) rotates like a
// SoftHSM one: staged, promoted, activated, and the signer then issues
// with the KMS key a leaf that verifies to the new root in the live
// bundle kubelet selects.
func TestRotationToAKMSKey(t *testing.T) {
	fakes := startKMSFakes(t)
	gcp, cryptoKey, awsKMS := fakes.gcp, fakes.cryptoKey, fakes.aws
	// ca init reads AWS credentials the SDK's default way: the environment.
	kmstest.AWSEnv(t, awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey)
	opts := fakes.opts

	for _, tc := range []struct {
		name, uri string
		flags     []string
		signs     func() int
	}{
		{"gcpkms", "gcpkms:" + cryptoKey, []string{"--algorithm", "ECDSAP256", "--gcpkms-emulator", gcp.Addr()},
			func() int { return gcp.Calls(gcpkmsfake.AsymmetricSign) }},
		{"awskms", "awskms:region=eu-west-1?endpoint=" + awsKMS.URL(), []string{"--algorithm", "RSA3072"},
			func() int { return awsKMS.Calls(awskmsfake.Sign) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			r := newE2ERotation(t, ctx, tc.name)
			startSigner(t, r.signerConfig(), "kms-"+tc.name, pcr.V1, opts)
			r.caInit("a", tokenKeyURI(strings.TrimPrefix(r.signer, "keyward.dev/")+"-a"))
			r.waitPhases("A Active by bootstrap", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive})
			caA := r.ca("a")
			w := podOnNode(t, ctx, uniqueName(t, "node"), r.signer)
			leafA := issuedLeaf(t, issue(t, ctx, w, r.signer), caA)

			r.caInit("b", tc.uri, tc.flags...)
			caB := r.ca("b")
			if !strings.HasPrefix(caB.uri, tc.name+":") {
				t.Fatalf("B's key URI %s is not a %s URI", caB.uri, tc.name)
			}
			r.waitPhases("B Staged", map[string]kwv1alpha1.Phase{"b": kwv1alpha1.PhaseStaged})
			if g := generationStatus(t, ctx, r.obj, "b", func(g kwv1alpha1.GenerationStatus) bool { return g.KeyCheck != nil }); !g.KeyCheck.Ready || g.KeyCheck.KeyVersion == "" {
				t.Fatalf("the signer's keyCheck of the %s key: %+v", tc.name, *g.KeyCheck)
			}
			r.waitBundles("B Staged", []tokenCA{caA, caB}, []tokenCA{caA})
			r.trust("promote", "b")
			r.waitPhases("B Promoted", map[string]kwv1alpha1.Phase{"b": kwv1alpha1.PhasePromoted})
			r.trust("activate", "b")
			r.waitPhases("B Active", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhasePromoted, "b": kwv1alpha1.PhaseActive})
			before := tc.signs()
			leafB := issueUntilSignedBy(t, ctx, w, r.signer, caB)
			if tc.signs() == before {
				t.Errorf("a leaf signed by B but the %s fake served no signature", tc.name)
			}
			v := r.waitBundles("B Active", []tokenCA{caA, caB}, []tokenCA{caA, caB})
			if !verifiesAgainst(leafB, v.live) || !verifiesAgainst(leafA, v.live) {
				t.Fatalf("after activation the leaves from before (%v) and after (%v) do not both verify against live", verifiesAgainst(leafA, v.live), verifiesAgainst(leafB, v.live))
			}
			only := x509.NewCertPool()
			only.AddCert(caB.root)
			if _, err := leafB.Verify(x509.VerifyOptions{Roots: only, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
				t.Fatalf("the %s-signed leaf does not verify to B's root: %v", tc.name, err)
			}
			if b, _ := pem.Decode([]byte(caB.pem)); b == nil || !bytes.Equal(b.Bytes, caB.root.Raw) {
				t.Error("B's stored certificate is not its root")
			}
		})
	}
}
