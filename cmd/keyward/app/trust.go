package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/keyward/keyward/trustpublisher/trustedit"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/yaml"
)

// Exit codes beyond cobra's 1 (see ExitCode and docs/cli.md).
const (
	// ExitGateHolds: a gate holds the transition; nothing was changed.
	ExitGateHolds = 3
	// ExitWaitTimeout: the edit was made but --wait timed out before
	// status showed the phase.
	ExitWaitTimeout = 4
)

// ErrGateHolds is matched (errors.Is) by a *GateError.
var ErrGateHolds = trustedit.ErrGateHolds

// GateError is a refusal because the controller would hold the step
// (trustedit.GateError, which `keyward demo` matches too).
type GateError = trustedit.GateError

// ErrWaitTimeout: --wait ran out before status showed the phase.
var ErrWaitTimeout = errors.New("timed out waiting for the phase")

// ErrOverridePending means --force would replace an override the
// controller has not applied yet.
var ErrOverridePending = errors.New("another override is pending")

// checkNoPendingOverride refuses to replace a pending override: it would
// drop its generations silently (say, the Retired of a compromised key
// whose successor's key is not ready yet).
func checkNoPendingOverride(a *v1alpha1.Authority, now time.Time) error {
	plan := trustpublisher.Evaluate(a, now)
	o := plan.Override
	if o == nil {
		return nil // none, or unusable: the controller drops it; replacing it loses nothing
	}
	// An entry still waits when spec asks for its phase and status does
	// not show it yet; arrived or stale entries the controller drops
	// (reportOverride reads the same steps).
	waiting := false
	for gen, phase := range o.Generations {
		if s, ok := plan.Step(gen); ok && s.Desired == phase && s.Observed != phase {
			waiting = true
		}
	}
	if !waiting {
		return nil
	}
	return fmt.Errorf("%w on Authority %s: %s (reason %q, by %s), not yet applied by the controller (a gate no override skips holds it, or the trust publisher is not running: see keyward trust status); wait for it, or drop it with kubectl annotate authority %s %s-",
		ErrOverridePending, a.Name, phaseList(o.Generations), o.Reason, orDash(o.RequestedBy), a.Name, v1alpha1.OverrideAnnotation)
}

// ExitCode is the process exit code for err: 0, ExitGateHolds,
// ExitWaitTimeout, or 1.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrGateHolds):
		return ExitGateHolds
	case errors.Is(err, ErrWaitTimeout):
		return ExitWaitTimeout
	}
	return 1
}

func orNew(p v1alpha1.Phase) string {
	if p == "" {
		return "(new)"
	}
	return string(p)
}

func newTrustCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "trust",
		Short: "Drive a signer's canary-then-live CA rotation: status, stage, promote, activate, retire, finish, emergency",
	}
	cmd.AddCommand(newTrustStatusCommand())
	for _, v := range []struct {
		verb  string
		phase v1alpha1.Phase
		short string
	}{
		{"stage", v1alpha1.PhaseStaged, "Put a generation's root in the canary bundle only (Staged)"},
		{"promote", v1alpha1.PhasePromoted, "Put a generation's root in the live bundle too (Promoted)"},
		{"activate", v1alpha1.PhaseActive, "Make a generation's key issue (Active); the current Active one goes back to Promoted"},
		{"retire", v1alpha1.PhaseRetiring, "Take a generation's root out of the canary bundle (Retiring)"},
		{"finish", v1alpha1.PhaseRetired, "Take a generation's root out of the live bundle too (Retired)"},
	} {
		cmd.AddCommand(newTrustPhaseCommand(v.verb, v.phase, v.short))
	}
	cmd.AddCommand(newTrustEmergencyCommand())
	cmd.AddCommand(newTrustBundleCommand())
	return cmd
}

type trustStatusOptions struct {
	kube    kubeFlags
	output  string
	timeout time.Duration
}

func newTrustStatusCommand() *cobra.Command {
	o := &trustStatusOptions{}
	cmd := &cobra.Command{
		Use:   "status SIGNER",
		Short: "Show where each CA generation stands, what holds it and when that opens; the bundles and conditions",
		Long: `Show a signer's Authority (SIGNER is a signer name, or an Authority name).

Per generation: NAME, DESIRED (spec) and PHASE (observed) phase, SINCE when,
ISSUES UNTIL (lastIssuedNotAfter: no leaf signed with its key is valid
longer), KEY (the signer's key check), GATE (what holds the next step, as the
controller evaluates it now) and OPENS IN. Then the published bundles and
the conditions. -o yaml|json prints the Authority itself.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch o.output {
			case "", "table", "yaml", "json":
			default:
				return fmt.Errorf("-o %q: want table, yaml or json", o.output)
			}
			ac, _, err := o.kube.clients()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			a, err := findAuthority(ctx, ac, args[0])
			if err != nil {
				return err
			}
			return printAuthority(cmd.OutOrStdout(), a, o.output, time.Now())
		},
	}
	o.kube.addFlags(cmd)
	cmd.Flags().StringVarP(&o.output, "output", "o", "table", "table, yaml or json")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

func printAuthority(w io.Writer, a *v1alpha1.Authority, output string, now time.Time) error {
	a = a.DeepCopy()
	a.TypeMeta = metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "Authority"}
	a.ManagedFields = nil
	switch output {
	case "json":
		b, err := json.MarshalIndent(a, "", "  ")
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "yaml":
		b, err := yaml.Marshal(a)
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	observed := map[string]v1alpha1.GenerationStatus{}
	for _, g := range a.Status.Generations {
		observed[g.Name] = g
	}
	plan := trustpublisher.Evaluate(a, now)
	fmt.Fprintf(w, "Authority %s, signer %s\n\n", a.Name, a.Spec.SignerName)
	tw := tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAME\tDESIRED\tPHASE\tSINCE\tISSUES UNTIL\tKEY\tGATE\tOPENS IN")
	var notes []string
	for _, g := range a.Spec.Generations {
		st := observed[g.Name]
		step, _ := plan.Step(g.Name)
		since, until, key, opens := "-", "-", "-", "-"
		if st.Since != nil {
			since = duration.HumanDuration(now.Sub(st.Since.Time)) + " ago"
		}
		if st.LastIssuedNotAfter != nil {
			until = st.LastIssuedNotAfter.UTC().Format(time.RFC3339)
		}
		if kc := st.KeyCheck; kc != nil {
			key = "ready"
			if !kc.Ready {
				key = "NOT READY"
				notes = append(notes, fmt.Sprintf("%s key: %s", g.Name, kc.Message))
			}
		}
		gate := step.Gate
		if gate == "" {
			gate = "-"
			switch {
			case step.Forced:
				gate = "(forced to " + string(step.Next) + ")"
			case step.Moves():
				gate = "(moves to " + string(step.Next) + ")"
			}
		} else {
			notes = append(notes, fmt.Sprintf("%s: %s", g.Name, step.Message))
		}
		if step.OpensAt != nil {
			opens = duration.HumanDuration(step.OpensAt.Sub(now))
			if !step.OpensAt.After(now) {
				opens = "now"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", g.Name, orDash(string(g.Phase)), orDash(string(st.Phase)), since, until, key, gate, opens)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	if plan.OverrideErr != nil {
		fmt.Fprintf(w, "  override annotation unusable: %v\n", plan.OverrideErr)
	} else if plan.Override != nil {
		fmt.Fprintf(w, "  override pending: %v (reason %q, by %s)\n", plan.Override.Generations, plan.Override.Reason, orDash(plan.Override.RequestedBy))
	}
	if c := meta.FindStatusCondition(a.Status.Conditions, v1alpha1.ConditionPropagationWindowSafe); c != nil && c.Status == metav1.ConditionFalse {
		fmt.Fprintf(w, "  WARNING: %s\n", c.Message)
	}
	fmt.Fprintln(w, "\nBUNDLES")
	tw = tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tNAME\tGENERATIONS\tPUBLISHED\tCHANGED")
	for _, b := range a.Status.Bundles {
		changed := "-"
		if b.LastChangeTime != nil {
			changed = duration.HumanDuration(now.Sub(b.LastChangeTime.Time)) + " ago"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", b.Version, orDash(b.Name), orDash(strings.Join(b.Generations, ",")), b.Published, changed)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nCONDITIONS")
	tw = tabwriter.NewWriter(w, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "TYPE\tSTATUS\tREASON\tAGE\tMESSAGE")
	for _, c := range a.Status.Conditions {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", c.Type, c.Status, c.Reason, duration.HumanDuration(now.Sub(c.LastTransitionTime.Time)), c.Message)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// trustEditOptions are shared by the phase commands and emergency.
type trustEditOptions struct {
	kube    kubeFlags
	force   bool
	reason  string
	wait    bool
	timeout time.Duration
	// now is the clock; nil means time.Now.
	now func() time.Time
}

func (o *trustEditOptions) addFlags(cmd *cobra.Command) {
	o.kube.addFlags(cmd)
	cmd.Flags().BoolVar(&o.force, "force", false, "make the edit although a gate holds, and ask the controller to skip the gates once (needs --reason; recorded in an Event)")
	cmd.Flags().StringVar(&o.reason, "reason", "", "why the gates are skipped (with --force)")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until status shows the phase")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long (with --wait: the wait included)")
}

func (o *trustEditOptions) clock() time.Time {
	if o.now != nil {
		return o.now()
	}
	return time.Now()
}

func (o *trustEditOptions) validate() error {
	if o.force != (strings.TrimSpace(o.reason) != "") {
		return errors.New("--force and --reason go together: --force --reason TEXT")
	}
	return nil
}

// setOverride puts the override annotation on a for the changed
// generations.
func setOverride(a *v1alpha1.Authority, changed map[string]v1alpha1.Phase, reason, by string) error {
	b, err := json.Marshal(v1alpha1.Override{Reason: reason, Generations: changed, RequestedBy: by})
	if err != nil {
		return fmt.Errorf("encoding the override: %w", err)
	}
	if a.Annotations == nil {
		a.Annotations = map[string]string{}
	}
	a.Annotations[v1alpha1.OverrideAnnotation] = string(b)
	return nil
}

// unforceable are the gates no override skips (NotYetValid is met only on
// the way to Active, where the override does not skip it either).
func unforceable(gate string) bool {
	return gate == v1alpha1.GateInvalidCertificate || gate == v1alpha1.GateKeyNotReady || gate == v1alpha1.GateNotYetValid
}

func newTrustPhaseCommand(verb string, phase v1alpha1.Phase, short string) *cobra.Command {
	o := &trustEditOptions{}
	cmd := &cobra.Command{
		Use:   verb + " SIGNER GENERATION",
		Short: short,
		Long: short + `.

SIGNER is a signer name or an Authority name. The desired phase is set only
if the controller would move the generation now (the command evaluates the
gates exactly as the controller does); if a gate holds, the command exits 3,
names the gate, why and when it opens, and changes nothing. --force --reason
makes the edit anyway and sets the keyward.dev/override annotation, which
makes the controller skip the gates once (except InvalidCertificate and
KeyNotReady) and record an Event.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return o.runPhase(ctx, cmd.OutOrStdout(), args[0], args[1], phase)
		},
	}
	o.addFlags(cmd)
	return cmd
}

func (o *trustEditOptions) runPhase(ctx context.Context, out io.Writer, ref, gen string, phase v1alpha1.Phase) error {
	ac, cs, err := o.kube.clients()
	if err != nil {
		return err
	}
	by := ""
	if o.force {
		by = requester(ctx, cs)
	}
	var (
		written *v1alpha1.Authority
		step    trustpublisher.Step
		changed map[string]v1alpha1.Phase
	)
	name := ref
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a, err := findAuthority(ctx, ac, name)
		if err != nil {
			return err
		}
		name = a.Name
		edited := a.DeepCopy()
		if changed, err = trustedit.SetPhase(edited, gen, phase); err != nil {
			return err
		}
		if len(changed) == 0 {
			written = a
			return nil
		}
		if o.force {
			if err := checkNoPendingOverride(a, o.clock()); err != nil {
				return err
			}
			if err := setOverride(edited, changed, o.reason, by); err != nil {
				return err
			}
		}
		plan := trustpublisher.Evaluate(edited, o.clock())
		step, _ = plan.Step(gen)
		if step.Gate != "" && (!o.force || unforceable(step.Gate)) {
			return &GateError{Step: step, Unforceable: o.force}
		}
		written, err = ac.Update(ctx, edited, metav1.UpdateOptions{FieldManager: v1alpha1.FieldManagerCLI})
		return err
	})
	if err != nil {
		return err
	}
	switch {
	case len(changed) == 0:
		fmt.Fprintf(out, "authority/%s: generation %s already desired %s (nothing changed)\n", written.Name, gen, phase)
	default:
		fmt.Fprintf(out, "authority/%s: generation %s desired %s", written.Name, gen, phase)
		for g, p := range changed {
			if g != gen {
				fmt.Fprintf(out, "; %s desired %s", g, p)
			}
		}
		switch {
		case step.Gate != "":
			fmt.Fprintf(out, "\nforced past %s (%s): the controller skips the gates once and records an Event\n", step.Gate, step.Message)
		case step.Moves() && step.Next != phase:
			fmt.Fprintf(out, "\nthe controller moves it to %s now; %s follows when its gates open\n", step.Next, phase)
		default:
			fmt.Fprintln(out, "\nthe controller moves it now")
		}
	}
	if !o.wait {
		return nil
	}
	return o.waitFor(ctx, out, ac, written.Name, map[string]v1alpha1.Phase{gen: phase})
}

// waitFor polls until status shows every generation of want in its phase.
func (o *trustEditOptions) waitFor(ctx context.Context, out io.Writer, ac *authclient.Client, name string, want map[string]v1alpha1.Phase) error {
	err := wait.PollUntilContextCancel(ctx, time.Second, true, func(ctx context.Context) (bool, error) {
		a, err := ac.Get(ctx, name)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return false, err
			}
			return false, nil // transient: poll again
		}
		n := 0
		for _, g := range a.Status.Generations {
			if p, ok := want[g.Name]; ok && g.Phase == p {
				n++
			}
		}
		return n == len(want), nil
	})
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("%w: status of Authority %s does not show %s after %s", ErrWaitTimeout, name, phaseList(want), o.timeout)
		}
		return err
	}
	fmt.Fprintf(out, "status shows %s\n", phaseList(want))
	return nil
}

// phaseList reads "a Active, b Promoted", sorted by generation.
func phaseList(m map[string]v1alpha1.Phase) string {
	names := slices.Sorted(maps.Keys(m))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + " " + string(m[n])
	}
	return strings.Join(parts, ", ")
}

type trustEmergencyOptions struct {
	trustEditOptions
	compromised, activate string
	yes                   bool
}

func newTrustEmergencyCommand() *cobra.Command {
	o := &trustEmergencyOptions{}
	cmd := &cobra.Command{
		Use:   "emergency SIGNER --compromised GEN --activate GEN --reason TEXT --yes",
		Short: "A CA key is compromised: make another generation Active and pull the compromised root from both bundles at once",
		Long: `A CA key is compromised: in one step, generation --activate becomes Active
(it issues every new certificate) and generation --compromised becomes
Retired (its root leaves the canary and the live bundle), skipping every gate
but InvalidCertificate (and KeyNotReady for the new key) through the
keyward.dev/override annotation. The blast radius is printed first; nothing
changes without --yes.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.force = true
			if strings.TrimSpace(o.reason) == "" {
				return errors.New("--reason is required: say why (it is recorded in an Event)")
			}
			if o.compromised == "" || o.activate == "" || o.compromised == o.activate {
				return errors.New("--compromised and --activate name two different generations")
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			return o.run(ctx, cmd.OutOrStdout(), args[0])
		},
	}
	o.kube.addFlags(cmd)
	cmd.Flags().StringVar(&o.compromised, "compromised", "", "the generation whose key is compromised (required)")
	cmd.Flags().StringVar(&o.activate, "activate", "", "the generation to make Active (required)")
	cmd.Flags().StringVar(&o.reason, "reason", "", "why (required; recorded in an Event)")
	cmd.Flags().BoolVar(&o.yes, "yes", false, "act: without it, only the blast radius is printed")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "wait until status shows both phases")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 5*time.Minute, "give up after this long")
	return cmd
}

// ErrNotConfirmed: emergency without --yes.
var ErrNotConfirmed = errors.New("nothing changed: re-run with --yes to act")

func (o *trustEmergencyOptions) run(ctx context.Context, out io.Writer, ref string) error {
	ac, cs, err := o.kube.clients()
	if err != nil {
		return err
	}
	by := requester(ctx, cs)
	want := map[string]v1alpha1.Phase{o.activate: v1alpha1.PhaseActive, o.compromised: v1alpha1.PhaseRetired}
	name := ref
	printed := false
	var written *v1alpha1.Authority
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		a, err := findAuthority(ctx, ac, name)
		if err != nil {
			return err
		}
		name = a.Name
		edited := a.DeepCopy()
		if _, err := trustedit.SetPhase(edited, o.activate, v1alpha1.PhaseActive); err != nil {
			return err
		}
		if _, err := trustedit.SetPhase(edited, o.compromised, v1alpha1.PhaseRetired); err != nil {
			return err
		}
		if err := setOverride(edited, want, o.reason, by); err != nil {
			return err
		}
		now := o.clock()
		plan := trustpublisher.Evaluate(edited, now)
		next, _ := plan.Step(o.activate)
		if next.Gate == v1alpha1.GateInvalidCertificate {
			return &GateError{Step: next, Unforceable: true}
		}
		if !printed {
			printBlastRadius(out, a, o.compromised, o.activate, next, now)
			printed = true
		}
		if !o.yes {
			return ErrNotConfirmed
		}
		written, err = ac.Update(ctx, edited, metav1.UpdateOptions{FieldManager: v1alpha1.FieldManagerCLI})
		return err
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "authority/%s: %s desired Active, %s desired Retired, override set (reason %q, by %s)\n", written.Name, o.activate, o.compromised, o.reason, orDash(by))
	if !o.wait {
		return nil
	}
	return o.waitFor(ctx, out, ac, written.Name, want)
}

func printBlastRadius(w io.Writer, a *v1alpha1.Authority, bad, good string, goodStep trustpublisher.Step, now time.Time) {
	_, window := trustpublisher.GateDurations(a)
	var badSt, goodSt v1alpha1.GenerationStatus
	for _, g := range a.Status.Generations {
		switch g.Name {
		case bad:
			badSt = g
		case good:
			goodSt = g
		}
	}
	fmt.Fprintf(w, "EMERGENCY for signer %s (Authority %s): %s is treated as compromised.\n", a.Spec.SignerName, a.Name, bad)
	fmt.Fprintf(w, "- %s becomes Active at once: every new certificate is signed with its key; %s's key signs nothing more.\n", good, bad)
	if badSt.LastIssuedNotAfter != nil && badSt.LastIssuedNotAfter.After(now) {
		fmt.Fprintf(w, "- Every leaf signed with %s's key — valid until %s at the latest (in %s) — stops verifying once the bundles without its root\n  reach the workloads, within about the propagation window (%s).\n",
			bad, badSt.LastIssuedNotAfter.UTC().Format(time.RFC3339), badSt.LastIssuedNotAfter.Sub(now).Round(time.Second), window)
	} else {
		fmt.Fprintf(w, "- No leaf signed with %s's key is still valid as far as status knows (lastIssuedNotAfter %s).\n", bad, orDash(timeString(badSt.LastIssuedNotAfter)))
	}
	fmt.Fprintf(w, "- kubelet re-requests a pod certificate only at its beginRefreshAt: restart (roll) the workloads that hold %s's\n  certificates to make them request one from %s now.\n", bad, good)
	if !trustpublisher.InLive(goodSt.Phase) {
		fmt.Fprintf(w, "- %s is observed %s: its root is not in the live bundle yet, so workloads on the live bundle reject its\n  certificates until the bundle propagates (about %s).\n", good, orNew(goodSt.Phase), window)
	}
	if goodStep.Gate != "" {
		fmt.Fprintf(w, "- %s cannot become Active yet (%s: %s): until it does, the signer issues NOTHING.\n", good, goodStep.Gate, goodStep.Message)
	}
}

func timeString(t *metav1.Time) string {
	if t == nil {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}
