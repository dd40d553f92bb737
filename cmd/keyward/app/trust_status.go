package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/yaml"
)

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
