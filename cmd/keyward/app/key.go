package app

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/spf13/cobra"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func newKeyCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Create and inspect CA keys in any backend (file, pkcs11, gcpkms, awskms)",
	}
	cmd.AddCommand(newKeyCreateCommand(), newKeyInspectCommand())
	return cmd
}

type keyOptions struct {
	uri       string
	algorithm string
	timeout   time.Duration
	modules   []string
	// gcpEndpoint points the gcpkms backend at an emulator or test server:
	// plaintext gRPC, no credentials.
	gcpEndpoint string
}

func (o *keyOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&o.uri, "uri", "", "key URI, e.g. pkcs11:token=keyward;object=ca?module-path=…&pin-source=file:… (required)")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 2*time.Minute, "give up after this long")
	cmd.Flags().StringSliceVar(&o.modules, "pkcs11-module", nil, "allowed PKCS#11 module paths (default: SoftHSM2's usual paths)")
	cmd.Flags().StringVar(&o.gcpEndpoint, "gcpkms-emulator", "", "host:port of a Cloud KMS emulator or test server (plaintext, no credentials)")
	_ = cmd.MarkFlagRequired("uri")
}

// withKey builds the registry, gets a key from get within --timeout and
// prints it.
func (o *keyOptions) withKey(cmd *cobra.Command, get func(context.Context, *backends.Registry) (backends.Signer, error)) error {
	opts := all.Options{}
	opts.PKCS11.AllowedModules = o.modules
	if o.gcpEndpoint != "" {
		opts.GCPKMS.ClientOptions = []option.ClientOption{
			option.WithEndpoint(o.gcpEndpoint), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		}
	}
	reg, err := all.NewRegistry(opts)
	if err != nil {
		return err
	}
	defer reg.Close()
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	s, err := get(ctx, reg)
	if err != nil {
		return err
	}
	defer s.Close()
	return describeKey(cmd.OutOrStdout(), s)
}

func newKeyCreateCommand() *cobra.Command {
	o := &keyOptions{}
	cmd := &cobra.Command{
		Use:   "create --uri URI --algorithm ALG",
		Short: "Create a new non-exportable key and print its URI and public key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			alg, err := backends.ParseAlgorithm(o.algorithm)
			if err != nil {
				return fmt.Errorf("--algorithm: %w", err)
			}
			return o.withKey(cmd, func(ctx context.Context, reg *backends.Registry) (backends.Signer, error) {
				return reg.CreateKey(ctx, backends.CreateKeyRequest{URI: o.uri, Algorithm: alg})
			})
		},
	}
	o.addFlags(cmd)
	cmd.Flags().StringVar(&o.algorithm, "algorithm", string(backends.ECDSAP256SHA256), "key algorithm, e.g. ecdsa-p256-sha256, rsa-3072-pss-sha256, ed25519")
	return cmd
}

func newKeyInspectCommand() *cobra.Command {
	o := &keyOptions{}
	cmd := &cobra.Command{
		Use:   "inspect --uri URI",
		Short: "Print a key's algorithm, version, SPKI fingerprint and public key",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withKey(cmd, func(ctx context.Context, reg *backends.Registry) (backends.Signer, error) {
				return reg.Open(ctx, backends.OpenRequest{URI: o.uri})
			})
		},
	}
	o.addFlags(cmd)
	return cmd
}

func describeKey(w io.Writer, s backends.Signer) error {
	der, err := x509.MarshalPKIXPublicKey(s.Public())
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "uri:                 %s\nalgorithm:           %s\nsignature algorithm: %s\nkey version:         %s\nfingerprint:         sha256:%s\n%s",
		s.URI(), s.Algorithm(), s.SignatureAlgorithm(), s.KeyVersion(), s.Fingerprint(),
		pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
	return err
}
