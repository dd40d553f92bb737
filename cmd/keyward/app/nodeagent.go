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
	var configFile, metricsAddress string
	cmd := &cobra.Command{
		Use:   "agent --config FILE",
		Short: "Keep node-daemon credentials (CSRs, crash-safe rotation) and trust files current on this node",
		Long: `Runs the node agent (a DaemonSet, or a systemd unit on the host): for each credential in the
NodeAgentConfiguration it keeps a key and certificate obtained by CertificateSigningRequest,
renewed at 70-90 % of the lifetime, written atomically to the credential's output directory; for
each trust entry it projects a signer's canary or live ClusterTrustBundles to a trust file.

It talks to the apiserver as the kubeconfig the configuration names (the node's own, e.g.
kubelet's), or with bootstrap first obtains a node identity with a bootstrap token (KEP-266),
or else uses its in-cluster service account. Its state (keys, pairs, pending CSRs, a lock:
one agent per directory) is in stateDir, default /var/lib/keyward-node.

Serves /metrics (default 127.0.0.1:9465, loopback: the DaemonSet shares the host network; --metrics-address or
metricsAddress widens it) and /healthz and /readyz (default 127.0.0.1:9466):
/healthz fails while a credential is expired or still missing after its first try, /readyz
until every credential's files are written. A configuration error, a kubeconfig that does not
load or a directory it cannot use or make stops it at start with exit status 1 and the field's name;
later errors are logged once, retried with backoff, and never touch the current files.

See docs/node-helper.md (files, metrics, what each message means) and docs/node-agent-config.yaml
(every field); the DaemonSet is deploy/kustomize/base/node-agent.yaml.`,
		Example: `  NODE_NAME=$(hostname) keyward node agent --config /etc/keyward/agent.yaml -v 4`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if configFile == "" {
				return fmt.Errorf("--config is required")
			}
			cfg, err := agent.Load(configFile)
			if err != nil {
				return err
			}
			if metricsAddress != "" {
				cfg.MetricsAddress = metricsAddress
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
	cmd.Flags().StringVar(&metricsAddress, "metrics-address", "", "overrides the configuration's metricsAddress (e.g. :9465 to let Prometheus scrape the node; unauthenticated)")
	return cmd
}
