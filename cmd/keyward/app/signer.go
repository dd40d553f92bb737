package app

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"github.com/spf13/cobra"
	"google.golang.org/api/option"
	"k8s.io/klog/v2"
)

type signerOptions struct {
	configFile  string
	checkConfig string
	identity    string
	modules     []string
}

func newSignerCommand() *cobra.Command {
	o := &signerOptions{}
	cmd := &cobra.Command{
		Use:   "signer --config FILE",
		Short: "Run the signer: issue PodCertificateRequests for the configured signer names and publish their trust bundles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.checkConfig != "" {
				if _, err := config.Load(o.checkConfig); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: valid %s %s (CA certificate files and keys are opened only when the signer starts)\n", o.checkConfig, config.APIVersion, config.Kind)
				return nil
			}
			if o.configFile == "" {
				return fmt.Errorf("--config is required (or --check-config FILE)")
			}
			cfg, err := config.Load(o.configFile)
			if err != nil {
				return err
			}
			reg, err := all.NewRegistry(backendOptions(cfg.Backends, o.modules))
			if err != nil {
				return err
			}
			defer reg.Close()
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			ctx = klog.NewContext(ctx, klog.Background())
			return signer.Run(ctx, signer.Options{Config: cfg, Backends: reg, Identity: o.identity, AlsoLead: TrustPublisherCompanion(cfg)})
		},
	}
	cmd.Flags().StringVar(&o.configFile, "config", "", "SignerConfiguration file")
	cmd.Flags().StringVar(&o.checkConfig, "check-config", "", "validate this SignerConfiguration file and exit")
	cmd.Flags().StringVar(&o.identity, "identity", "", "this replica's name in the leader Lease (default: hostname)")
	cmd.Flags().StringSliceVar(&o.modules, "pkcs11-module", nil, "allowed PKCS#11 module paths (default: SoftHSM2's usual paths)")
	return cmd
}

// backendOptions turns the configuration's backends section into registry
// options; modules, the --pkcs11-module flag, replaces its allowedModules.
func backendOptions(b config.Backends, modules []string) all.Options {
	var opts all.Options
	opts.PKCS11.AllowedModules = b.PKCS11.AllowedModules
	if len(modules) > 0 {
		opts.PKCS11.AllowedModules = modules
	}
	opts.PKCS11.MaxSessions = b.PKCS11.MaxSessions
	opts.PKCS11.PoolWaitTimeout = b.PKCS11.PoolWaitTimeout.Duration
	if b.GCPKMS.Endpoint != "" {
		opts.GCPKMS.ClientOptions = []option.ClientOption{option.WithEndpoint(b.GCPKMS.Endpoint)}
	}
	opts.GCPKMS.CallTimeout = b.GCPKMS.CallTimeout.Duration
	opts.GCPKMS.Retry.MaxAttempts = b.GCPKMS.MaxAttempts
	opts.AWSKMS.CallTimeout = b.AWSKMS.CallTimeout.Duration
	opts.AWSKMS.Retry.MaxAttempts = b.AWSKMS.MaxAttempts
	return opts
}
