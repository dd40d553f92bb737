package app

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/keyward/keyward/internal/version"
)

// errUnknownOutput is returned for an --output format keyward cannot print.
var errUnknownOutput = errors.New("unknown output format")

func newVersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print keyward's version, git commit, build date, Go version and platform",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return printVersion(cmd.OutOrStdout(), version.Get(), output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	return cmd
}

func printVersion(w io.Writer, v version.Info, output string) error {
	switch output {
	case "json":
		b, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			return fmt.Errorf("encoding the version as JSON: %w", err)
		}
		_, err = fmt.Fprintf(w, "%s\n", b)
		return err
	case "", "text":
		_, err := fmt.Fprintf(w, "keyward %s\ngit commit: %s\nbuild date: %s\ngo version: %s\nplatform:   %s\n",
			v.Version, orUnknown(v.GitCommit), orUnknown(v.BuildDate), v.GoVersion, v.Platform)
		return err
	default:
		return fmt.Errorf("--output %q: want text or json: %w", output, errUnknownOutput)
	}
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}
