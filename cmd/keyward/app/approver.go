package app

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
)

type approverOptions struct {
	configFile     string
	identity       string
	leaseName      string
	metricsAddress string
	healthAddress  string
	nodeWait       time.Duration
}

func newApproverCommand() *cobra.Command {
	o := &approverOptions{}
	cmd := &cobra.Command{
		Use:   "approver --config FILE",
		Short: "Run the CSR approver: approve or deny kubelet and configured CertificateSigningRequests (opens no keys)",
		Long: "Approves kubelet client CSRs as kube-controller-manager does (SubjectAccessReview), kubelet serving CSRs whose\n" +
			"SANs are among the Node's addresses, and CSRs for csr signer names with an approval section; reads the same\n" +
			"SignerConfiguration as the signer, under its own Lease. See docs/approver.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.configFile == "" {
				return fmt.Errorf("--config is required")
			}
			cfg, err := config.Load(o.configFile)
			if err != nil {
				return err
			}
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			ctx = klog.NewContext(ctx, klog.Background())
			return approver.Run(ctx, approver.RunOptions{Config: cfg, Identity: o.identity, LeaseName: o.leaseName,
				MetricsAddress: o.metricsAddress, HealthAddress: o.healthAddress, NodeWait: o.nodeWait})
		},
	}
	cmd.Flags().StringVar(&o.configFile, "config", "", "SignerConfiguration file (the signer's)")
	cmd.Flags().StringVar(&o.identity, "identity", "", "this replica's name in the leader Lease (default: hostname)")
	cmd.Flags().StringVar(&o.leaseName, "lease-name", approver.DefaultLeaseName, "the approver's Lease, in leaderElection.namespace (never the signer's)")
	cmd.Flags().StringVar(&o.metricsAddress, "metrics-address", "", "serve /metrics here (default: the configuration's metricsAddress)")
	cmd.Flags().StringVar(&o.healthAddress, "health-address", "", "serve /healthz and /readyz here (default: the configuration's healthAddress)")
	cmd.Flags().DurationVar(&o.nodeWait, "node-wait", approver.DefaultNodeWait, "how long a kubelet serving CSR waits for its Node object before it is Denied")
	return cmd
}
