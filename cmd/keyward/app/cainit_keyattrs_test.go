//go:build cgo

package app

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/keyward/keyward/testsupport/softhsm"
)

// The key `keyward ca init --create-key` makes in a PKCS#11 token (here
// with --csr-out, which needs no cluster and takes the same key path as a
// self-signed root) signs and does nothing else, and cannot be read or
// wrapped out of the token: for each --algorithm ca init offers.
func TestCAInitKeyIsSignOnlyInTheToken(t *testing.T) {
	hsm, err := softhsm.NewEnv(filepath.Join(t.TempDir(), "softhsm"))
	if err != nil {
		t.Fatal(err)
	}
	tok, err := hsm.NewToken("ca-init")
	if err != nil {
		t.Fatal(err)
	}
	for _, alg := range []string{"ECDSAP256", "ECDSAP384", "RSA3072", "RSA4096"} {
		t.Run(alg, func(t *testing.T) {
			label := "ca-" + strings.ToLower(alg)
			csrOut := filepath.Join(t.TempDir(), "ca.csr")
			out, err := runKeyward(t, "ca", "init", "--signer", "keyward.dev/attrs", "--generation", "g1",
				"--key-uri", "pkcs11:token="+tok.Label+";object="+label+"?module-path="+tok.ModulePath+"&pin-source=file:"+tok.PINFile,
				"--create-key", "--algorithm", alg, "--csr-out", csrOut)
			if err != nil {
				t.Fatalf("keyward ca init: %v\n%s", err, out)
			}
			if strings.Contains(out, tok.PIN()) {
				t.Errorf("ca init printed the token's PIN:\n%s", out)
			}
			data, err := os.ReadFile(csrOut)
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(data)
			if block == nil {
				t.Fatalf("%s holds no PEM block", csrOut)
			}
			if _, err := x509.ParseCertificateRequest(block.Bytes); err != nil {
				t.Fatalf("the request ca init wrote: %v", err)
			}
			facts, err := tok.KeyFacts(label)
			if err != nil {
				t.Fatal(err)
			}
			if problems := facts.SignOnlyProblems(); len(problems) > 0 {
				t.Errorf("the key ca init created:\n  %s", strings.Join(problems, "\n  "))
			}
		})
	}
}
