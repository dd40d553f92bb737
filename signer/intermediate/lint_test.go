package intermediate_test

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/intermediate"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/testsupport/lintgate"
)

// The in-memory intermediate, and a leaf under it, pass the lint gate
// (docs/security.md §1) under every CA generation `ca init` makes that
// allows a CA below it; the others refuse it by name.
func TestLintGateInMemoryIntermediate(t *testing.T) {
	reg := lintgate.Registry(t)
	linted := 0
	for _, gen := range lintgate.Generations(t) {
		t.Run(gen.Name, func(t *testing.T) {
			iss, err := intermediate.New(issuer.Static{Authority: gen.Auth, Generation: "g"}, intermediate.Options{
				SignerName: "keyward.dev/lint", Replica: "keyward-signer-6c9d4-q2x7z",
				Validity: 7 * time.Hour, RenewBefore: time.Hour, MaxLifetime: time.Hour, Backdate: 2 * time.Minute,
			})
			if err != nil {
				t.Fatal(err)
			}
			auth, _, err := iss.Current()
			if errors.Is(err, authority.ErrNoPathForIntermediate) {
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			linted++
			lintgate.Clean(t, reg, auth.Certificate())
			leaf, err := auth.Sign(context.Background(), &x509.Certificate{
				Subject: pkix.Name{CommonName: "system:serviceaccount:ns:sa"}, KeyUsage: x509.KeyUsageDigitalSignature,
				ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
			}, leafKey(t), authority.Policy{Lifetime: time.Hour, Backdate: 2 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			lintgate.Clean(t, reg, leaf)
		})
	}
	if linted == 0 {
		t.Fatal("no generation allowed an intermediate: nothing was linted")
	}
}
