package app

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"time"

	"github.com/keyward/keyward/trustpublisher/trustedit"
	"github.com/spf13/cobra"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/registrytoken"
)

type trustBundleOptions struct {
	kube    kubeFlags
	version string
	format  string
	output  string
	timeout time.Duration
}

func newTrustBundleCommand() *cobra.Command {
	o := &trustBundleOptions{}
	cmd := &cobra.Command{
		Use:   "bundle SIGNER_NAME [--version live|canary] [--format pem|jwks] [--output FILE]",
		Short: "Print a signer name's canary or live trust bundle as PEM, or its keys as a JWKS (for registries)",
		Long: `Print the roots of SIGNER_NAME's canary or live ClusterTrustBundles, as
kubelet selects them (merged, duplicates removed), for consumers outside the
cluster: a container registry's auth.token.rootcertbundle (--format pem) or
auth.token.jwks (--format jwks: each key named by the kid the token service
writes with keyIdentifier: kid). With --output the file is replaced
atomically and only when its content changes. An empty bundle is an error:
a registry given no keys would refuse every token.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			switch o.version {
			case "live", "canary":
			default:
				return fmt.Errorf("--version %q: want live or canary", o.version)
			}
			switch o.format {
			case "pem", "jwks":
			default:
				return fmt.Errorf("--format %q: want pem or jwks", o.format)
			}
			_, client, err := o.kube.clients()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			certs, err := trustedit.KubeletView(ctx, client, args[0], o.version)
			if err != nil {
				return err
			}
			if len(certs) == 0 {
				return fmt.Errorf("no %s ClusterTrustBundle of signer name %s holds a certificate (is the trust publisher running for it?)", o.version, args[0])
			}
			out, err := registrytoken.RenderTrust(certs, o.format)
			if err != nil {
				return err
			}
			if o.output == "" {
				_, err := cmd.OutOrStdout().Write(out)
				return err
			}
			changed, err := replaceFile(o.output, out)
			if err != nil {
				return err
			}
			state := "unchanged"
			if changed {
				state = "written"
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: %d keys of the %s bundle of %s (%s)\n", o.output, len(certs), o.version, args[0], state)
			return nil
		},
	}
	o.kube.addFlags(cmd)
	cmd.Flags().StringVar(&o.version, "version", "live", "which bundle: live or canary")
	cmd.Flags().StringVar(&o.format, "format", "pem", "pem (rootcertbundle) or jwks")
	cmd.Flags().StringVar(&o.output, "output", "", "write to this file (atomically, only on change) instead of stdout")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Second, "give up after this long")
	return cmd
}

// replaceFile makes path hold data (mode 0644), through a temporary file
// renamed over it, unless it already does; it reports whether it wrote.
func replaceFile(path string, data []byte) (bool, error) {
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return false, nil
	}
	if err := nodehelper.WriteFileAtomic(path, data, 0o644, true); err != nil {
		return false, fmt.Errorf("--output: %w", err)
	}
	return true, nil
}
