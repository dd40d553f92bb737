package app

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/keyward/keyward/nodehelper/agent"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

// newNodeAgentCommand is `keyward node agent --config FILE`.
func newNodeAgentCommand() *cobra.Command {
	var configFile string
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Keep node-daemon credentials (CSRs, crash-safe rotation) and trust files current on this node",
		Long: `Runs the node agent (a DaemonSet, or a systemd unit on the host): for each credential in the
NodeAgentConfiguration it keeps a key and certificate obtained by CertificateSigningRequest,
renewed at 70-90 % of the lifetime, written atomically to the credential's directory; for each
trust entry it projects ClusterTrustBundles to a trust file. With bootstrap it first obtains the
node identity with a bootstrap token (KEP-266). Serves /metrics and /healthz. See
docs/node-helper.md and docs/node-agent-config.yaml.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return fmt.Errorf("--config is required")
			}
			cfg, err := agent.Load(configFile)
			if err != nil {
				return err
			}
			a, err := agent.New(agent.Options{Config: cfg})
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			ctx = klog.NewContext(ctx, klog.Background())
			return a.Run(ctx)
		},
	}
	cmd.Flags().StringVar(&configFile, "config", "", "NodeAgentConfiguration file (required)")
	return cmd
}
