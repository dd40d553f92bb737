package app

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/keyward/keyward/demo"
	"github.com/spf13/cobra"
)

func newDemoCommand() *cobra.Command {
	o := &demo.Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run keyward's whole life cycle locally: kube-apiserver + etcd, SoftHSM2, signer, a pod certificate, a CA rotation",
		Long: `demo starts a kube-apiserver and etcd on loopback (Node,RBAC authorization,
NodeRestriction admission) and applies keyward's RBAC; makes a SoftHSM2 token;
creates the CA generation demo-1 with keyward ca init (its key in the token);
runs the signer and its trust publisher under its own service account;
creates a pod with a podCertificate volume and, playing its node, requests
the pod's certificate; prints the issued chain and how long it took. A node
daemon then asks keyward.dev/node-daemons (a custom CSR signer name with its
own CA in the token) for a client certificate with a CertificateSigningRequest;
keyward approver, running beside the signer under its own service account,
approves it, and the demo prints its decision and the issued chain.

Then it rotates the CA canary-then-live to demo-2 with gates compressed to
seconds, running keyward ca init and keyward trust promote, activate, retire
and finish as an operator would, and prints at each phase the canary and
live ClusterTrustBundles as kubelet selects them, whether the pod's
certificates from before and after activation verify against live, and the
trust files the node helper's projection (keyward node trust) keeps on two
nodes, one labelled keyward.dev/trust-bundle=canary, the other live: the
canary node's file gains the new root first. The
LeavesValid gate cannot be compressed (a pod certificate lives at least 1h):
the demo shows retire refused by it, then forces it with a reason.

Everything keeps running until Ctrl-C (with --once it stops after the
rotation), then everything it made is removed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			return demo.Run(ctx, cmd.OutOrStdout(), withCommandLayer(*o))
		},
	}
	cmd.Flags().StringVar(&o.Dir, "dir", "", "directory for kubeconfigs and the SoftHSM token (default: a new temp dir, removed on exit)")
	cmd.Flags().StringVar(&o.RegistryBinary, "registry-binary", "", "CNCF Distribution registry binary (default: registry beside keyward, else on PATH; make registry builds bin/registry)")
	cmd.Flags().BoolVar(&o.Once, "once", false, "stop after the rotation instead of waiting for Ctrl-C (for CI smoke runs)")
	return cmd
}

// withCommandLayer gives the demo what it needs from this package, which it
// cannot import: keyward's own commands run in-process, their exit codes,
// and the trust publisher wired beside the signer and the token service.
func withCommandLayer(o demo.Options) demo.Options {
	o.CLI = runInProcess
	o.ExitCode = ExitCode
	o.SignerCompanions = TrustPublisherCompanion
	o.TokenServiceCompanions = TokenServiceCompanions
	return o
}

// runInProcess runs `keyward ARGS` in this process, its output and errors
// written to out.
func runInProcess(ctx context.Context, out io.Writer, args []string) error {
	cmd := NewCommand()
	cmd.SetOut(out)
	cmd.SetErr(out)
	cmd.SetArgs(args)
	return cmd.ExecuteContext(ctx)
}
