package app

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/tokenservice"
	"github.com/keyward/keyward/signer/tokenservice/config"
)

type tokenServiceOptions struct {
	configFile  string
	checkConfig string
	kubeconfig  string
	identity    string
	modules     []string
}

func newTokenServiceCommand() *cobra.Command {
	o := &tokenServiceOptions{}
	cmd := &cobra.Command{
		Use:   "token-service --config FILE",
		Short: "Run the registry token service: registry tokens for pod service-account tokens, signed by an Authority's key",
		Long: `Run the registry token service (KEP-4412 image pulls without pull secrets). It serves,
over HTTPS on listen.address, the token realm of CNCF Distribution registries (GET/POST
/token) and the credential endpoint of ` + "`keyward credential-provider`" + ` (POST /v1/credential).
Each request carries a pod-bound service-account token for the configured audience; it
is checked with a TokenReview and the pod and ServiceAccount are read, and the registry
token granted holds only the scopes the configuration's rules allow, signed by the key
of the Active generation of the Authority for signerName (create it with keyward ca init).
Every replica serves; one leads (Lease) to keep the key's reservation and publish the
trust bundles registries are configured from. /metrics on metricsAddress, /healthz and
/readyz on healthAddress.

Setup, end to end: docs/registry-credentials.md. Every configuration field:
docs/token-service-config.yaml. Manifests: deploy/examples/registry-credentials/.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.checkConfig != "" {
				if _, err := config.Load(o.checkConfig); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: valid %s %s (TLS files and keys are opened only when the token service starts)\n", o.checkConfig, config.APIVersion, config.Kind)
				return nil
			}
			if o.configFile == "" {
				return fmt.Errorf("--config is required (or --check-config FILE)")
			}
			cfg, err := config.Load(o.configFile)
			if err != nil {
				return err
			}
			if o.kubeconfig != "" {
				cfg.KubeClient.Kubeconfig = o.kubeconfig
			}
			reg, err := all.NewRegistry(backendOptions(cfg.Backends, o.modules))
			if err != nil {
				return err
			}
			defer reg.Close()
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			ctx = klog.NewContext(ctx, klog.Background())
			return tokenservice.Run(ctx, tokenservice.Options{Config: cfg, Backends: reg, Identity: o.identity, AlsoLead: TokenServiceCompanions(cfg)})
		},
	}
	cmd.Flags().StringVar(&o.configFile, "config", "", "TokenServiceConfiguration file")
	cmd.Flags().StringVar(&o.checkConfig, "check-config", "", "validate this TokenServiceConfiguration file and exit")
	cmd.Flags().StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig file (default: the file's kubeClient.kubeconfig, else in-cluster)")
	cmd.Flags().StringVar(&o.identity, "identity", "", "this replica's name in the leader Lease (default: hostname)")
	cmd.Flags().StringSliceVar(&o.modules, "pkcs11-module", nil, "allowed PKCS#11 module paths; replaces the file's backends.pkcs11.allowedModules (default: those, else SoftHSM2's usual paths)")
	return cmd
}

// TokenServiceCompanions runs the trust publisher for the token service's
// signer name while it leads, unless cfg disables it: what
// `keyward token-service` passes as tokenservice.Options.AlsoLead.
func TokenServiceCompanions(cfg *config.TokenServiceConfiguration) []signer.Companion {
	return trustPublisherCompanions(cfg.TrustPublisher)
}
