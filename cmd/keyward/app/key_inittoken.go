package app

import (
	"fmt"
	"os"
	"strings"

	"github.com/keyward/keyward/internal/pkcs11token"
	"github.com/spf13/cobra"
)

type initTokenOptions struct {
	module, label, pinFile, soPINFile string
}

// newKeyInitTokenCommand initialises a SoftHSM2 token through PKCS#11,
// reading both PINs from files: softhsm2-util --init-token takes them as
// arguments, where /proc/<pid>/cmdline shows them to every process.
func newKeyInitTokenCommand() *cobra.Command {
	o := &initTokenOptions{}
	cmd := &cobra.Command{
		Use:   "init-token --module PATH --label LABEL --pin-file FILE --so-pin-file FILE",
		Short: "Initialise a SoftHSM2 token (C_InitToken, C_InitPIN) with PINs read from files; does nothing if the token exists",
		Long: "Initialises the token LABEL in the SoftHSM2 module's free slot through the PKCS#11 API, with the security\n" +
			"officer PIN from --so-pin-file and the user PIN from --pin-file (a trailing newline is ignored). No PIN is\n" +
			"passed on a command line. A token labelled LABEL that is already initialised is left as it is.\n" +
			"SoftHSM2 reads its configuration from SOFTHSM2_CONF.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			present, err := pkcs11token.TokenPresent(o.module, o.label)
			if err != nil {
				return fmt.Errorf("looking for token %s in %s: %w", o.label, o.module, err)
			}
			if present {
				fmt.Fprintf(cmd.OutOrStdout(), "softhsm: token %s present\n", o.label)
				return nil
			}
			pin, err := readPINFile("--pin-file", o.pinFile)
			if err != nil {
				return err
			}
			soPIN, err := readPINFile("--so-pin-file", o.soPINFile)
			if err != nil {
				return err
			}
			serial, err := pkcs11token.InitToken(o.module, o.label, soPIN, pin)
			if err != nil {
				return fmt.Errorf("initialising token %s in %s: %w", o.label, o.module, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "softhsm: token %s initialised (serial %s)\n", o.label, serial)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.module, "module", "/usr/lib/softhsm/libsofthsm2.so", "the SoftHSM2 PKCS#11 module")
	cmd.Flags().StringVar(&o.label, "label", "", "the token's label (required)")
	cmd.Flags().StringVar(&o.pinFile, "pin-file", "", "file holding the user PIN (required)")
	cmd.Flags().StringVar(&o.soPINFile, "so-pin-file", "", "file holding the security officer PIN (required)")
	for _, f := range []string{"label", "pin-file", "so-pin-file"} {
		_ = cmd.MarkFlagRequired(f)
	}
	return cmd
}

// readPINFile reads a PIN file as the shell's $(cat FILE) did: trailing
// newlines are not part of the PIN. The error names the flag, never the PIN.
func readPINFile(flag, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	pin := strings.TrimRight(string(b), "\r\n")
	if pin == "" {
		return "", fmt.Errorf("%s: %s is empty", flag, path)
	}
	return pin, nil
}
