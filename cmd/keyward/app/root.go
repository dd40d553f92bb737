// Package app builds keyward's cobra command tree.
package app

import (
	"flag"

	"github.com/keyward/keyward/backends/uri"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// NewCommand returns the root `keyward` command with every subcommand.
func NewCommand() *cobra.Command {
	root := &cobra.Command{
		Use:           "keyward",
		Short:         "An external Kubernetes certificate signer whose CA keys stay in an HSM or KMS",
		SilenceUsage:  true,
		SilenceErrors: false,
	}
	// klog's verbosity flags on every command, so that per-request detail
	// (V(2)) can be turned on; logs go to stderr.
	logFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(logFlags)
	for _, name := range []string{"v", "vmodule"} {
		root.PersistentFlags().AddGoFlag(logFlags.Lookup(name))
	}
	root.AddCommand(newVersionCommand(), newDemoCommand(), newKeyCommand(), newSignerCommand(), newApproverCommand(), newTokenServiceCommand(), newCACommand(), newTrustCommand(), newNodeCommand(), newCredentialProviderCommand(), newDeployCommand())
	redactErrors(root)
	return root
}

// redactErrors makes every command's error, which cobra prints and main
// returns, pass through uri.Redact: a key URI or endpoint quoted by a
// configuration or flag error shows no PIN or credential. The original
// error stays reachable through errors.Is and errors.As.
func redactErrors(cmd *cobra.Command) {
	if run := cmd.RunE; run != nil {
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			if err := run(cmd, args); err != nil {
				return &redactedError{err: err}
			}
			return nil
		}
	}
	for _, c := range cmd.Commands() {
		redactErrors(c)
	}
}

// redactedError shows err's message without secrets.
type redactedError struct{ err error }

func (e *redactedError) Error() string { return uri.Redact(e.err.Error()) }
func (e *redactedError) Unwrap() error { return e.err }
