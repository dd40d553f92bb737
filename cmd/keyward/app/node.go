package app

import (
	"crypto/sha256"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/keyward/keyward/nodehelper"
	"github.com/spf13/cobra"
)

func newNodeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "node",
		Short: "Node side: subject keys and credential files for node daemons",
	}
	cmd.AddCommand(newNodeKeygenCommand(), newNodeTrustCommand(), newNodeAgentCommand(), newNodeVerifyCommand())
	return cmd
}

type nodeKeygenOptions struct {
	keyType     string
	out         string
	stubRequest string
	force       bool
}

func (o *nodeKeygenOptions) validate() error {
	if o.out == "" {
		return fmt.Errorf("--out is required")
	}
	if o.stubRequest != "" && o.stubRequest == o.out {
		return fmt.Errorf("--stub-request and --out name the same file %s", o.out)
	}
	// Without --force, refuse before writing anything, so that a refused
	// stub request does not leave a new key behind.
	if !o.force {
		for _, p := range []string{o.out, o.stubRequest} {
			if p == "" {
				continue
			}
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("writing %s (pass --force to replace it): %w", p, os.ErrExist)
			}
		}
	}
	return nil
}

func newNodeKeygenCommand() *cobra.Command {
	o := &nodeKeygenOptions{}
	cmd := &cobra.Command{
		Use:   "keygen --out FILE [--key-type TYPE] [--stub-request FILE]",
		Short: "Generate a subject key as a PKCS#8 PRIVATE KEY PEM file (mode 0600), optionally with a stub PKCS#10 request",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.validate(); err != nil {
				return err
			}
			key, err := nodehelper.GenerateKey(o.keyType)
			if err != nil {
				return err
			}
			keyPEM, err := nodehelper.MarshalPrivateKeyPEM(key)
			if err != nil {
				return err
			}
			var reqPEM []byte
			if o.stubRequest != "" {
				der, err := nodehelper.NewStubPKCS10Request(key)
				if err != nil {
					return err
				}
				reqPEM = nodehelper.MarshalStubRequestPEM(der)
			}
			if err := nodehelper.WriteFileAtomic(o.out, keyPEM, 0o600, o.force); err != nil {
				return fmt.Errorf("writing key: %w", err)
			}
			if reqPEM != nil {
				if err := nodehelper.WriteFileAtomic(o.stubRequest, reqPEM, 0o644, o.force); err != nil {
					return fmt.Errorf("writing stub request: %w", err)
				}
			}
			pub, err := x509.MarshalPKIXPublicKey(key.Public())
			if err != nil {
				return fmt.Errorf("encoding public key: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s key to %s (public key SHA-256 %x)\n", o.keyType, o.out, sha256.Sum256(pub))
			if reqPEM != nil {
				fmt.Fprintf(cmd.OutOrStdout(), "wrote stub PKCS#10 request to %s\n", o.stubRequest)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&o.keyType, "key-type", nodehelper.KeyTypeECDSAP256, "RSA3072, RSA4096, ECDSAP256, ECDSAP384, ECDSAP521 or ED25519")
	cmd.Flags().StringVar(&o.out, "out", "", "private key file to write (required)")
	cmd.Flags().StringVar(&o.stubRequest, "stub-request", "", "also write the stub PKCS#10 request (PEM CERTIFICATE REQUEST, empty subject, signed by the key) to this file")
	cmd.Flags().BoolVar(&o.force, "force", false, "replace existing files (atomically) instead of refusing")
	return cmd
}
