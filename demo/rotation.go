package demo

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/softhsm"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/keyward/keyward/trustpublisher/trustedit"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// The demo's Authority, its second CA generation and its compressed gates
// (the CRD's defaults are 1h and 5m).
const (
	demoAuthority         = "demo"
	demoNewGeneration     = "demo-2"
	demoCanarySoak        = 3 * time.Second
	demoPropagationWindow = 2 * time.Second
	demoForceReason       = "demo: compressed rotation"
	// demoWait bounds each wait of the rotation for a status or a bundle.
	demoWait = time.Minute
)

// demoKeyURI names a key object in the demo's token.
func demoKeyURI(t *softhsm.Token, object string) string {
	return "pkcs11:token=" + t.Label + ";object=" + object + "?module-path=" + t.ModulePath + "&pin-source=file:" + t.PINFile
}

// generationOf returns a's spec generation gen (zero if absent).
func generationOf(a *v1alpha1.Authority, gen string) v1alpha1.Generation {
	for _, g := range a.Spec.Generations {
		if g.Name == gen {
			return g
		}
	}
	return v1alpha1.Generation{}
}

// waitObserved waits until the demo Authority's status shows every
// generation of want in its phase, and returns it.
func waitObserved(ctx context.Context, ac *authclient.Client, want map[string]v1alpha1.Phase) (*v1alpha1.Authority, error) {
	var a *v1alpha1.Authority
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		got, err := ac.Get(ctx, demoAuthority)
		if err != nil {
			return false, nil // transient: poll again
		}
		a = got
		for g, p := range want {
			st, ok := statusOf(got, g)
			if !ok || st.Phase != p {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for Authority %s to show %v: %w", demoAuthority, want, err)
	}
	return a, nil
}

func statusOf(a *v1alpha1.Authority, gen string) (v1alpha1.GenerationStatus, bool) {
	for _, g := range a.Status.Generations {
		if g.Name == gen {
			return g, true
		}
	}
	return v1alpha1.GenerationStatus{}, false
}

// demoCLI runs keyward's own commands in-process, as an operator types
// them with KUBECONFIG set to the admin kubeconfig, and prints each command
// line and its output.
type demoCLI struct {
	out        io.Writer
	kubeconfig string
	module     string
	// execute runs `keyward ARGS` in-process (Options.CLI); exitCode maps
	// its error to the process exit code (Options.ExitCode).
	execute  func(ctx context.Context, out io.Writer, args []string) error
	exitCode func(error) int
}

// run prints `$ keyward ARGS`, runs it and prints its output (and its
// error, as cobra prints it) indented; a refusal also shows the exit code.
func (c demoCLI) run(ctx context.Context, args ...string) error {
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if strings.ContainsAny(a, " ;?&") {
			shown[i] = "'" + a + "'"
		}
	}
	fmt.Fprintf(c.out, "\n$ keyward %s\n", strings.Join(shown, " "))
	var buf bytes.Buffer
	err := c.execute(ctx, &buf, append(slices.Clone(args), "--kubeconfig", c.kubeconfig))
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		fmt.Fprintf(c.out, "  %s\n", line)
	}
	if err != nil {
		fmt.Fprintf(c.out, "  (exit code %d)\n", c.exitCode(err))
	}
	return err
}

// caInit is `keyward ca init` creating generation gen's key in the token.
func (c demoCLI) caInit(ctx context.Context, gen, keyURI string) error {
	return c.run(ctx, "ca", "init", "--signer", demoSigner, "--generation", gen,
		"--create-key", "--key-uri", keyURI, "--pkcs11-module", c.module,
		"--subject", "CN=keyward demo CA "+gen, "--lifetime", "8760h")
}

// demoRotation drives the canary-then-live rotation demo-1 → demo-2.
type demoRotation struct {
	out         io.Writer
	cli         demoCLI
	authorities *authclient.Client
	// node is the demo node's identity: it asks for pod certificates and
	// reads the trust bundles as its kubelet would.
	node     kubernetes.Interface
	events   kubernetes.Interface
	workload *controlplane.WorkloadObjects
	token    *softhsm.Token
	// trust are the nodes' trust files the node helper keeps.
	trust []*demoTrustFile

	began time.Time
	// leaves are the pod's certificates so far, oldest first.
	leaves []demoLeaf
}

type demoLeaf struct {
	name string
	cert *x509.Certificate
}

func (r *demoRotation) phase(title string) {
	fmt.Fprintf(r.out, "\n=== [%s] %s\n", time.Since(r.began).Round(100*time.Millisecond), title)
}

func (r *demoRotation) run(ctx context.Context, first *x509.Certificate) error {
	old, next := demoGeneration, demoNewGeneration
	r.leaves = []demoLeaf{{name: "leaf #1 (issued before activation)", cert: first}}
	fmt.Fprintf(r.out, `=== canary-then-live rotation %s → %s, gates compressed: canarySoak %s, propagationWindow %s
A workload's trust bundles are read as kubelet selects them, with the node's identity: ClusterTrustBundles with
  fieldSelector spec.signerName=%s, labelSelector %s=canary|live, merged, deduplicated by DER.
`, old, next, demoCanarySoak, demoPropagationWindow, demoSigner, v1alpha1.BundleVersionLabel("keyward.dev"))
	r.began = time.Now()

	r.phase("start: " + old + " Active")
	if err := r.show(ctx, nil); err != nil {
		return err
	}

	r.phase("stage: keyward ca init adds " + next + " (a new key in the token), Staged: its root goes to the canary bundle only")
	if err := r.cli.caInit(ctx, next, demoKeyURI(r.token, "demo-ca-2")); err != nil {
		return err
	}
	if err := r.settle(ctx, map[string]v1alpha1.Phase{next: v1alpha1.PhaseStaged}); err != nil {
		return err
	}

	r.phase("promote " + next + ": its root goes to the live bundle too")
	switch err := r.cli.run(ctx, "trust", "promote", demoSigner, next); {
	case errors.Is(err, trustedit.ErrGateHolds):
		fmt.Fprintln(r.out, "(refused, as it should be: the root has not soaked in the canary bundle yet; the demo waits and retries)")
	case err != nil:
		return err
	default:
		// A machine so slow that the soak passed before the command ran.
		fmt.Fprintf(r.out, "(accepted at once: the %s canary soak had passed already)\n", demoCanarySoak)
	}
	if err := r.transition(ctx, "promote", next, v1alpha1.PhasePromoted, map[string]v1alpha1.Phase{next: v1alpha1.PhasePromoted}); err != nil {
		return err
	}

	r.phase("activate " + next + ": its key issues from now on; " + old + " goes back to Promoted (in both bundles, issuing nothing)")
	if err := r.transition(ctx, "activate", next, v1alpha1.PhaseActive, map[string]v1alpha1.Phase{next: v1alpha1.PhaseActive, old: v1alpha1.PhasePromoted}); err != nil {
		return err
	}

	r.phase("issue again: the pod's next certificate is signed by " + next)
	var (
		chain []*x509.Certificate
		err   error
	)
	for attempt := 1; ; attempt++ {
		if chain, err = requestPodCertificate(ctx, r.out, r.node, r.workload); err != nil {
			return err
		}
		fmt.Fprintf(r.out, "  subject %s, issuer %s\n", chain[0].Subject, chain[0].Issuer)
		want := "keyward demo CA " + next
		if chain[0].Issuer.CommonName == want {
			break
		}
		// The signer follows status through its informer, moments behind
		// the status write that --wait saw.
		if attempt == 5 {
			return fmt.Errorf("the leaf issued after activation is signed by %q, not %q", chain[0].Issuer.CommonName, want)
		}
		fmt.Fprintf(r.out, "  (the signer had not seen %s Active yet: asking again)\n", next)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	r.leaves = append(r.leaves, demoLeaf{name: "leaf #2 (issued after activation)", cert: chain[0]})
	if err := r.show(ctx, nil); err != nil {
		return err
	}

	r.phase("retire " + old + ": its root leaves the canary bundle")
	if err := r.waitForGates(ctx, old, v1alpha1.PhaseRetiring, true); err != nil {
		return err
	}
	err = r.cli.run(ctx, "trust", "retire", demoSigner, old)
	var gate *trustedit.GateError
	if !errors.As(err, &gate) || gate.Step.Gate != v1alpha1.GateLeavesValid {
		return fmt.Errorf("retiring %s: want a refusal by %s, got %v", old, v1alpha1.GateLeavesValid, err)
	}
	opens := "later"
	if gate.Step.OpensAt != nil {
		opens = gate.Step.OpensAt.UTC().Format(time.RFC3339) + " (in " + time.Until(*gate.Step.OpensAt).Round(time.Minute).String() + ")"
	}
	fmt.Fprintf(r.out, `(refused by %s: leaves signed with %s's key may be valid until %s.
 In production you would wait until then — the gate keeps every workload able to verify every leaf %s signed.
 A demo cannot compress it: the apiserver's shortest pod certificate lives 1h, and lastIssuedNotAfter reserves
 the signer's maxLifetime + 10m before each signature. So the demo overrides this one gate, on the record.)
`, v1alpha1.GateLeavesValid, old, opens, old)
	if err := r.cli.run(ctx, "trust", "retire", demoSigner, old, "--force", "--reason", demoForceReason, "--wait", "--timeout", demoWait.String()); err != nil {
		return err
	}
	if err := r.showOverrideEvent(ctx); err != nil {
		return err
	}
	if err := r.settle(ctx, map[string]v1alpha1.Phase{old: v1alpha1.PhaseRetiring}); err != nil {
		return err
	}

	r.phase("finish " + old + ": its root leaves the live bundle too")
	// The canary soak and propagation window are waited out; LeavesValid
	// holds finish too (a forced retire does not carry over), so the demo
	// overrides it once more, on the record.
	if err := r.waitForGates(ctx, old, v1alpha1.PhaseRetired, true); err != nil {
		return err
	}
	fmt.Fprintf(r.out, "(%s holds finish as well: an override covers one step only. Overriding it again.)\n", v1alpha1.GateLeavesValid)
	if err := r.cli.run(ctx, "trust", "finish", demoSigner, old, "--force", "--reason", demoForceReason, "--wait", "--timeout", demoWait.String()); err != nil {
		return err
	}
	if err := r.settle(ctx, map[string]v1alpha1.Phase{old: v1alpha1.PhaseRetired}); err != nil {
		return err
	}
	total := time.Since(r.began)
	fmt.Fprintf(r.out, `  %s no longer verifies, and that is correct: %s's root is in no bundle, so nothing %s signed is trusted any more.
  In production the LeavesValid gate would have held retire and finish until every leaf %s signed had expired, and kubelet
  replaces a pod's certificate at its beginRefreshAt, long before that: no workload would still hold leaf #1.
`, r.leaves[0].name, old, old, old)

	if err := r.cli.run(ctx, "trust", "status", demoSigner); err != nil {
		return err
	}
	fmt.Fprintf(r.out, "\nrotation %s → %s complete: total wall time %s (gates canarySoak %s, propagationWindow %s; LeavesValid overridden)\n\n",
		old, next, total.Round(100*time.Millisecond), demoCanarySoak, demoPropagationWindow)
	return nil
}

// transition waits until `keyward trust VERB` would be accepted, runs it
// with --wait and shows the bundles once they hold what status says.
func (r *demoRotation) transition(ctx context.Context, verb, gen string, p v1alpha1.Phase, want map[string]v1alpha1.Phase) error {
	for {
		if err := r.waitForGates(ctx, gen, p, false); err != nil {
			return err
		}
		err := r.cli.run(ctx, "trust", verb, demoSigner, gen, "--wait", "--timeout", demoWait.String())
		if err == nil {
			return r.settle(ctx, want)
		}
		if !errors.Is(err, trustedit.ErrGateHolds) {
			return err
		}
		// A gate closed again between the check and the command (a bundle
		// changed): wait for it and retry.
	}
}

// settle waits for the phases in status and for the bundles to match
// them, then shows the bundles and verifies the leaves.
func (r *demoRotation) settle(ctx context.Context, want map[string]v1alpha1.Phase) error {
	a, err := waitObserved(ctx, r.authorities, want)
	if err != nil {
		return err
	}
	return r.show(ctx, a)
}

// waitForGates waits until the command setting gen's desired phase to p
// would pass the gates: the command's own check (setPhase on a copy, then
// trustpublisher.Evaluate), polled. With ignoreLeaves the LeavesValid gate
// is left out (the demo's retire is refused by it alone, then forced).
func (r *demoRotation) waitForGates(ctx context.Context, gen string, p v1alpha1.Phase, ignoreLeaves bool) error {
	shown := ""
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		a, err := r.authorities.Get(ctx, demoAuthority)
		if err != nil {
			return false, nil // transient: poll again
		}
		edited := a.DeepCopy()
		if _, err := trustedit.SetPhase(edited, gen, p); err != nil {
			return false, err
		}
		if ignoreLeaves {
			for i := range edited.Status.Generations {
				if edited.Status.Generations[i].Name == gen {
					edited.Status.Generations[i].LastIssuedNotAfter = nil
				}
			}
		}
		step, _ := trustpublisher.Evaluate(edited, time.Now()).Step(gen)
		if step.Gate == "" {
			return true, nil
		}
		if step.Gate != shown {
			shown = step.Gate
			in := ""
			if step.OpensAt != nil {
				in = fmt.Sprintf(", opens in %s", time.Until(*step.OpensAt).Round(100*time.Millisecond))
			}
			fmt.Fprintf(r.out, "... waiting for gate %s%s\n", step.Gate, in)
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the gates of %s → %s: %w", gen, p, err)
	}
	return nil
}

// show waits until kubelet's view of both bundles holds the roots that
// status's observed phases put there (a is read anew when nil), prints
// the subjects, verifies every leaf against the live bundle, and shows the
// nodes' trust files once they hold the same.
func (r *demoRotation) show(ctx context.Context, a *v1alpha1.Authority) error {
	var canary, live []*x509.Certificate
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		if a == nil {
			got, err := r.authorities.Get(ctx, demoAuthority)
			if err != nil {
				return false, nil
			}
			a = got
		}
		wantCanary, wantLive := trustpublisher.BundleContents(a)
		var err error
		if canary, err = trustedit.KubeletView(ctx, r.node, demoSigner, v1alpha1.BundleCanary); err != nil {
			return false, err
		}
		if live, err = trustedit.KubeletView(ctx, r.node, demoSigner, v1alpha1.BundleLive); err != nil {
			return false, err
		}
		return sameRoots(canary, wantCanary) && sameRoots(live, wantLive), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the bundles to hold what Authority %s's status says: %w", demoAuthority, err)
	}
	var phases []string
	for _, g := range a.Status.Generations {
		phases = append(phases, g.Name+" "+string(g.Phase))
	}
	fmt.Fprintf(r.out, "status:  %s\n", strings.Join(phases, ", "))
	fmt.Fprintf(r.out, "canary:  %s\n", subjects(canary))
	fmt.Fprintf(r.out, "live:    %s\n", subjects(live))
	pool := x509.NewCertPool()
	for _, c := range live {
		pool.AddCert(c)
	}
	for _, l := range r.leaves {
		_, err := l.cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		if err != nil {
			fmt.Fprintf(r.out, "%s, signed by %s: does NOT verify against live (%v)\n", l.name, l.cert.Issuer.CommonName, err)
			continue
		}
		fmt.Fprintf(r.out, "%s, signed by %s: verifies against live\n", l.name, l.cert.Issuer.CommonName)
	}
	return showTrustFiles(ctx, r.out, r.trust, a)
}

// showOverrideEvent waits for the trust publisher's GateOverridden Event
// on the Authority and prints it.
func (r *demoRotation) showOverrideEvent(ctx context.Context) error {
	sel := fields.Set{"involvedObject.name": demoAuthority, "reason": trustpublisher.EventGateOverridden}.String()
	var found string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, demoWait, true, func(ctx context.Context) (bool, error) {
		list, err := r.events.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil || len(list.Items) == 0 {
			return false, nil
		}
		e := list.Items[len(list.Items)-1]
		found = fmt.Sprintf("%s %s %s/%s (from %s): %s", e.Type, e.Reason, strings.ToLower(e.InvolvedObject.Kind), e.InvolvedObject.Name, e.Source.Component, e.Message)
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for the %s Event on Authority %s: %w", trustpublisher.EventGateOverridden, demoAuthority, err)
	}
	fmt.Fprintf(r.out, "\n$ kubectl get events --field-selector %s\n  %s\n", sel, found)
	return nil
}

func sameRoots(got []*x509.Certificate, want []trustpublisher.Member) bool {
	if len(got) != len(want) {
		return false
	}
	for _, m := range want {
		if !slices.ContainsFunc(got, func(c *x509.Certificate) bool { return bytes.Equal(c.Raw, m.Root.Raw) }) {
			return false
		}
	}
	return true
}

func subjects(certs []*x509.Certificate) string {
	if len(certs) == 0 {
		return "(no bundle)"
	}
	var s []string
	for _, c := range certs {
		s = append(s, c.Subject.String())
	}
	return strings.Join(s, ", ")
}
