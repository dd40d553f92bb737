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
	"time"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/keyward/keyward/trustpublisher/trustedit"
	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

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
