package app

import (
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyward/keyward/signer/registrytoken"
	"github.com/keyward/keyward/testsupport/testca"
)

// --output writes only on change: the same bundle again leaves the file
// (and its readers) alone.
func TestTrustBundleOutputIsReplacedOnlyOnChange(t *testing.T) {
	trusted, _ := testca.New(t)
	out, err := registrytoken.RenderTrust([]*x509.Certificate{trusted.Certificate()}, "pem")
	if err != nil {
		t.Fatal(err)
	}
	trustFile := filepath.Join(t.TempDir(), "trust.pem")
	if changed, err := replaceFile(trustFile, out); err != nil || !changed {
		t.Fatalf("replaceFile: %v, %v", changed, err)
	}
	if changed, err := replaceFile(trustFile, out); err != nil || changed {
		t.Fatalf("replaceFile with the same content: changed %v, %v; want unchanged", changed, err)
	}
}

// Bad flags are refused naming them, before any cluster is asked.
func TestTrustBundleRefusesBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"trust", "bundle", "example.com/x", "--version", "next"},
		{"trust", "bundle", "example.com/x", "--format", "der"},
	} {
		cmd := NewCommand()
		cmd.SetArgs(append(args, "--kubeconfig", filepath.Join(t.TempDir(), "none")))
		cmd.SetOut(os.Stderr)
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), args[3]) {
			t.Errorf("%v: %v; want an error naming %s", args, err, args[3])
		}
	}
}
