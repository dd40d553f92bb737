package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/keyward/keyward/trustpublisher/trustedit"
	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
)

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
