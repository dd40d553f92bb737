package app

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/keyward/keyward/backends/uri"
	"github.com/keyward/keyward/nodehelper/credprovider"
	"github.com/spf13/cobra"
	credentialproviderv1 "k8s.io/kubelet/pkg/apis/credentialprovider/v1"
)

type credentialProviderOptions struct {
	tokenServiceURL  string
	caFile           string
	timeout          time.Duration
	cacheKeyType     string
	maxCacheDuration time.Duration
}

// credentialProviderErrPrefix starts the one stderr line kubelet quotes in
// its log when the plugin fails.
const credentialProviderErrPrefix = "keyward credential-provider: "

// newCredentialProviderCommand is `keyward credential-provider`, run by
// kubelet (its CredentialProviderConfig names the binary and passes
// "credential-provider" and the flags as args).
func newCredentialProviderCommand() *cobra.Command {
	o := &credentialProviderOptions{}
	cmd := &cobra.Command{
		Use:   "credential-provider --token-service-url URL [--ca-file FILE]",
		Short: "Kubelet image credential provider: turns a pod's service-account token into registry credentials",
		Long: `Run by kubelet (KEP-4412 exec API credentialprovider.kubelet.k8s.io/v1) with a
CredentialProviderRequest on stdin that carries a pod-bound service-account token for the
token service's audience. Asks the token service (POST URL/v1/credential) whether the
pod's service account may pull the image and answers on stdout with that token as the
password for the image's registry host; the registry's token realm checks it again on
every pull. On any error nothing is written to stdout, one line goes to stderr and the
exit code is 1. Needs tokenAttributes.cacheType: Token in the kubelet config
(deploy/examples/registry-credentials/kubelet-credential-provider-config.yaml).

Setup, and what each error line means: docs/registry-credentials.md (sections 3 and 9).`,
		// Every error, flag errors included, is reported as the one line
		// kubelet expects, by the command itself.
		SilenceErrors: true,
		SilenceUsage:  true,
		RunE: func(cmd *cobra.Command, args []string) error {
			err := o.run(cmd.Context(), args, cmd.InOrStdin(), cmd.OutOrStdout())
			if err != nil {
				reportCredentialProviderError(cmd.ErrOrStderr(), err)
			}
			return err
		},
	}
	cmd.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		err = fmt.Errorf("parsing flags: %w", err)
		reportCredentialProviderError(cmd.ErrOrStderr(), err)
		return err
	})
	f := cmd.Flags()
	f.StringVar(&o.tokenServiceURL, "token-service-url", "", "the token service's https base URL (required)")
	f.StringVar(&o.caFile, "ca-file", "", "PEM file of the CAs that verify the token service (default: system roots)")
	f.DurationVar(&o.timeout, "timeout", credprovider.DefaultTimeout, "limit for the whole call to the token service")
	f.StringVar(&o.cacheKeyType, "cache-key-type", string(credentialproviderv1.ImagePluginCacheKeyType), "how kubelet caches the answer: Image or Registry")
	f.DurationVar(&o.maxCacheDuration, "max-cache-duration", credprovider.DefaultMaxCacheDuration, "upper bound of the cacheDuration answered (it also ends 30s before the token does)")
	return cmd
}

func (o *credentialProviderOptions) run(ctx context.Context, args []string, in io.Reader, out io.Writer) error {
	if len(args) > 0 {
		return fmt.Errorf("unexpected arguments %q: all settings are flags", args)
	}
	opts := credprovider.Options{
		TokenServiceURL:  o.tokenServiceURL,
		Timeout:          o.timeout,
		CacheKeyType:     credentialproviderv1.PluginCacheKeyType(o.cacheKeyType),
		MaxCacheDuration: o.maxCacheDuration,
	}
	if o.caFile != "" {
		pool, err := credprovider.LoadCAFile(o.caFile)
		if err != nil {
			return err
		}
		opts.RootCAs = pool
	}
	p, err := credprovider.New(opts)
	if err != nil {
		return err
	}
	return p.Run(ctx, in, out)
}

// reportCredentialProviderError writes err as the plugin's one stderr line.
func reportCredentialProviderError(w io.Writer, err error) {
	msg := strings.Join(strings.Fields(uri.Redact(err.Error())), " ")
	_, _ = fmt.Fprintln(w, credentialProviderErrPrefix+msg)
}
