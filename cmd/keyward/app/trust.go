package app

import (
	"errors"
	"fmt"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	"github.com/keyward/keyward/trustpublisher/trustedit"
	"github.com/spf13/cobra"
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
