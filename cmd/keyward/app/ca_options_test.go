package app

import (
	"errors"
	"io"
	"testing"

	"github.com/keyward/keyward/ca"
)

// Weak --algorithm values are refused as weak, naming the numbers, before
// any key is made or the cluster is asked; RSA2048 is not "unknown".
func TestCAInitRefusesWeakAlgorithmsByName(t *testing.T) {
	for _, tc := range []struct {
		name, algorithm string
	}{
		{"the short name RSA2048 is refused as weak", "RSA2048"},
		{"the short name in lower case is refused as weak", "rsa2048"},
		{"a backend name for RSA 2048 is refused as weak", "rsa-2048-pkcs1-sha256"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := newCAInitCommand()
			cmd.SetOut(io.Discard)
			cmd.SetErr(io.Discard)
			cmd.SetArgs([]string{"--signer", "example.com/w", "--generation", "g1", "--create-key",
				"--key-uri", "file:/nonexistent/ca.key", "--kubeconfig", "/nonexistent/kubeconfig", "--algorithm", tc.algorithm})
			err := cmd.Execute()
			var weak *ca.WeakError
			if !errors.As(err, &weak) {
				t.Fatalf("ca init --algorithm %s = %v, want a *ca.WeakError", tc.algorithm, err)
			}
		})
	}
}
