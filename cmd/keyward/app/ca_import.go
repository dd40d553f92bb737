package app

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/spf13/cobra"
)

type caImportOptions struct {
	caOptions
	certificate, chain string
}

func newCAImportCommand() *cobra.Command {
	o := &caImportOptions{}
	cmd := &cobra.Command{
		Use:   "import --signer NAME --generation GEN --key-uri URI --certificate FILE [--chain FILE]",
		Short: "Add a CA certificate signed by an external root (after ca init --csr-out) as a generation",
		Long: `Add a CA certificate signed elsewhere as generation GEN of the signer's
Authority (created if missing).

The key at --key-uri is opened and must be the certificate's key. The
certificate must be a CA (basicConstraints CA:TRUE, keyUsage keyCertSign,
path length 0 or 1). The issuers, from --chain and any certificates after the
first in --certificate, must link it up to a self-signed root, which must be
given too: the generation's chainPEM holds them nearest first, and the root
is what the trust bundles publish. Weak keys or signatures and a chain that
ends sooner than the leaf maximum plus the rotation windows are refused.`,
		Args: cobra.NoArgs,
		RunE: runCA(o),
	}
	o.addFlags(cmd)
	cmd.Flags().StringVar(&o.certificate, "certificate", "", "PEM file: the CA certificate, optionally followed by its issuers (required)")
	cmd.Flags().StringVar(&o.chain, "chain", "", "PEM file: the issuers up to and including the self-signed root")
	_ = cmd.MarkFlagRequired("certificate")
	return cmd
}

func (o *caImportOptions) Run(ctx context.Context, out io.Writer) error {
	var certs []*x509.Certificate
	for _, f := range []string{o.certificate, o.chain} {
		if f == "" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading certificates: %w", err)
		}
		parsed, err := pemcert.Parse(data)
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if len(parsed) == 0 {
			return fmt.Errorf("%s: no certificate", f)
		}
		certs = append(certs, parsed...)
	}
	ac, cs, err := o.kube.clients()
	if err != nil {
		return err
	}
	tgt, err := o.resolve(ctx, ac)
	if err != nil {
		return err
	}
	if err := checkWriteAccess(ctx, cs, tgt); err != nil {
		return err
	}
	return o.withKey(ctx, func(ctx context.Context, reg *backends.Registry) (backends.Signer, error) {
		return reg.Open(ctx, backends.OpenRequest{URI: o.keyURI})
	}, func(key backends.Signer) error {
		im, err := ca.CheckImport(certs, key.Public())
		if err != nil {
			return err
		}
		from := time.Now()
		if nb := im.NotBefore(); nb.After(from) {
			from = nb
		}
		if err := ca.CheckLifetime(im.NotAfter().Sub(from).Truncate(time.Second), o.leafMax, tgt.windows()); err != nil {
			return fmt.Errorf("the chain ends %s: %w", im.NotAfter().UTC().Format(time.RFC3339), err)
		}
		a, err := o.addGeneration(ctx, ac, tgt.name, v1alpha1.Generation{
			Name: o.generation, KeyURI: key.URI(), CertificatePEM: im.CertificatePEM(), ChainPEM: im.ChainPEM(),
		})
		if err != nil {
			return err
		}
		if err := printAdded(out, a, o.generation, key); err != nil {
			return err
		}
		root := im.Certificate
		if len(im.Issuers) > 0 {
			root = im.Issuers[len(im.Issuers)-1]
		}
		_, err = fmt.Fprintf(out, "certificate: %q, valid until %s; root %q\n", im.Certificate.Subject, im.NotAfter().UTC().Format(time.RFC3339), root.Subject)
		return err
	})
}
