package app

import (
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/keyward/keyward/nodehelper/credbundle"
	"github.com/spf13/cobra"
)

// ErrNotValidNow is matched by a verify error for a leaf outside its
// validity period.
var ErrNotValidNow = errors.New("certificate not valid now")

type nodeVerifyOptions struct {
	bundle string
	trust  string
	now    func() time.Time
}

func newNodeVerifyCommand() *cobra.Command {
	o := &nodeVerifyOptions{now: time.Now}
	cmd := &cobra.Command{
		Use:   "verify --credential-bundle FILE [--trust-bundle FILE]",
		Short: "Check a credential bundle: its key is the leaf's, the leaf is valid now and chains to the trust bundle",
		Long: `Reads a credential bundle (a PRIVATE KEY PEM block, then the chain, leaf
first: what kubelet writes for a podCertificate projection and the node agent
for a credential) and checks that the key is the leaf's and the leaf is valid
now; with --trust-bundle, that the leaf chains (through the bundle's other
certificates) to one of the trust bundle's certificates, for any key usage.
Prints the leaf's subject, issuer and notAfter; exits 1 on the first check
that fails. The chart's helm test runs it in a pod with a keyward certificate.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.run(cmd)
		},
	}
	cmd.Flags().StringVar(&o.bundle, "credential-bundle", "", "the credential bundle file (required)")
	cmd.Flags().StringVar(&o.trust, "trust-bundle", "", "PEM certificates the leaf must chain to (e.g. a projected ClusterTrustBundle)")
	return cmd
}

func (o *nodeVerifyOptions) run(cmd *cobra.Command) error {
	if o.bundle == "" {
		return errors.New("--credential-bundle is required")
	}
	cred, err := credbundle.New(credbundle.Options{BundleFile: o.bundle})
	if err != nil {
		return err
	}
	if err := cred.Reload(); err != nil {
		return err
	}
	cert := cred.Current()
	leaf := cert.Leaf
	now := o.now()
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return fmt.Errorf("checking leaf %q: %w (valid %s to %s)", leaf.Subject, ErrNotValidNow,
			leaf.NotBefore.UTC().Format(time.RFC3339), leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "%s: key matches leaf %q, issuer %q, valid until %s\n", o.bundle, leaf.Subject, leaf.Issuer, leaf.NotAfter.UTC().Format(time.RFC3339))
	if o.trust == "" {
		return nil
	}
	pool, err := credbundle.NewTrustPool(credbundle.TrustOptions{File: o.trust})
	if err != nil {
		return err
	}
	if err := pool.Reload(); err != nil {
		return err
	}
	intermediates := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("parsing the chain of %s: %w", o.bundle, err)
		}
		intermediates.AddCert(c)
	}
	chains, err := leaf.Verify(x509.VerifyOptions{
		Roots:         pool.Pool(),
		Intermediates: intermediates,
		CurrentTime:   now,
		KeyUsages:     []x509.ExtKeyUsage{x509.ExtKeyUsageAny},
	})
	if err != nil {
		return fmt.Errorf("verifying leaf %q against %s: %w", leaf.Subject, o.trust, err)
	}
	root := chains[0][len(chains[0])-1]
	fmt.Fprintf(w, "%s: chains to %q in %s\n", o.bundle, root.Subject, o.trust)
	return nil
}
