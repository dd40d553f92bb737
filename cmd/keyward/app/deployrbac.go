package app

import (
	"fmt"

	"github.com/keyward/keyward/deploy/rbac"
	"github.com/keyward/keyward/signer/config"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	"github.com/spf13/cobra"
)

type deployRBACOptions struct {
	namespace            string
	signerConfig         string
	approver             bool
	tokenServiceConfig   string
	nodeAgent            bool
	caAdmin              bool
	nodeAgentNamespace   string
	bootstrapAuthorities bool
	authorities          map[string]string
}

func newDeployCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "deploy",
		Short: "Generate deployment manifests",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newDeployRBACCommand())
	return cmd
}

func newDeployRBACCommand() *cobra.Command {
	o := &deployRBACOptions{}
	cmd := &cobra.Command{
		Use:   "rbac --namespace NS [--signer-config FILE] [--approver] [--token-service-config FILE] [--node-agent [--node-agent-namespace NS]] [--bootstrap-authorities] [--authority SIGNER=NAME]...",
		Short: "Write the RBAC (ServiceAccounts, roles, bindings) keyward's components need for their configuration, as YAML",
		Long: "Derives every permission from the configuration files: `sign` (and `attest`, for the trust publisher) on exactly\n" +
			"the configured signer names, CSR verbs only with CSR signer names, `approve` only for the approver's names,\n" +
			"and nothing on Secrets. Writes on Authorities and ClusterTrustBundles are granted on each component's own\n" +
			"objects only: the Authority `keyward ca init` names (example.com/x → example.com.x, or --authority) and\n" +
			"the bundles <signer with / as :>:canary and :live. See \"Permissions\" in docs/signer.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			in, err := o.input()
			if err != nil {
				return err
			}
			out, err := rbac.RenderYAML(in)
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(out)
			return err
		},
	}
	cmd.Flags().StringVar(&o.namespace, "namespace", rbac.DefaultNamespace, "namespace of the ServiceAccounts and Leases")
	cmd.Flags().StringVar(&o.signerConfig, "signer-config", "", "the signer's SignerConfiguration: renders the signer's RBAC")
	cmd.Flags().BoolVar(&o.approver, "approver", false, "render `keyward approver`'s RBAC for the names it decides in --signer-config")
	cmd.Flags().StringVar(&o.tokenServiceConfig, "token-service-config", "", "the token service's TokenServiceConfiguration: renders its RBAC")
	cmd.Flags().BoolVar(&o.nodeAgent, "node-agent", false, "render the node agent's ServiceAccount (no bindings: it acts as its node)")
	cmd.Flags().BoolVar(&o.caAdmin, "ca-admin", false, "render the keyward-ca-admin ServiceAccount and ClusterRole: what keyward ca and keyward trust need (docs/production/ca-admin.md)")
	cmd.Flags().StringVar(&o.nodeAgentNamespace, "node-agent-namespace", rbac.DefaultNodeAgentNamespace, "namespace of the node agent's ServiceAccount: its own, labelled Pod Security privileged (hostPath, hostNetwork), so that --namespace can be restricted")
	cmd.Flags().BoolVar(&o.bootstrapAuthorities, "bootstrap-authorities", false, "let the signer create Authorities (its init container runs `keyward ca init`)")
	cmd.Flags().StringToStringVar(&o.authorities, "authority", nil, "SIGNER=NAME: the Authority of signer name SIGNER is NAME, not the derived one (as with `keyward ca init --authority`); repeatable")
	return cmd
}

func (o *deployRBACOptions) input() (rbac.Input, error) {
	in := rbac.Input{Namespace: o.namespace, NodeAgent: o.nodeAgent, NodeAgentNamespace: o.nodeAgentNamespace, CAAdmin: o.caAdmin, AuthorityNames: o.authorities}
	if o.signerConfig == "" && o.tokenServiceConfig == "" && !o.nodeAgent && !o.caAdmin {
		return in, fmt.Errorf("nothing to render: give --signer-config, --token-service-config, --node-agent or --ca-admin")
	}
	if o.approver && o.signerConfig == "" {
		return in, fmt.Errorf("--approver needs --signer-config (the approver reads the signer's configuration)")
	}
	if o.bootstrapAuthorities && o.signerConfig == "" {
		return in, fmt.Errorf("--bootstrap-authorities needs --signer-config")
	}
	if o.signerConfig != "" {
		cfg, err := config.Load(o.signerConfig)
		if err != nil {
			return in, fmt.Errorf("reading --signer-config: %w", err)
		}
		s := rbac.FromSignerConfig(cfg)
		s.BootstrapAuthorities = o.bootstrapAuthorities
		in.Signer = &s
		if o.approver {
			a := rbac.ApproverFromSignerConfig(cfg)
			in.Approver = &a
		}
	}
	if o.tokenServiceConfig != "" {
		cfg, err := tsconfig.Load(o.tokenServiceConfig)
		if err != nil {
			return in, fmt.Errorf("reading --token-service-config: %w", err)
		}
		t := rbac.FromTokenServiceConfig(cfg)
		in.TokenService = &t
	}
	return in, nil
}
