package tokenservice

import (
	"bytes"
	"crypto/x509"
	"encoding/base64"
	"testing"

	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/testsupport/lintgate"
)

// The certificate chain a registry token carries in its x5c header, as the
// token endpoint mints it under every CA generation keyward makes (the
// registry verifies it up to a root of its bundle), passes zlint's RFC
// 5280/5480/8813 lints: each certificate of it, and it is exactly the
// generation's chain.
func TestLintGateRegistryTokenChain(t *testing.T) {
	reg := lintgate.Registry(t)
	for _, gen := range lintgate.Generations(t) {
		t.Run(gen.Name, func(t *testing.T) {
			f := newFixture(t, nil)
			f.issuer.Static = issuer.Static{Authority: gen.Auth, Generation: "g1"}
			_, h, _ := granted(t, f.do(tokenGET(testService, []string{"repository:keyward/hello:pull"}, basic(pullerToken))))
			want := gen.Auth.Chain()
			if len(h.X5c) != len(want) {
				t.Fatalf("x5c holds %d certificates, want the generation's %d", len(h.X5c), len(want))
			}
			for i, b64 := range h.X5c {
				der, err := base64.StdEncoding.DecodeString(b64)
				if err != nil {
					t.Fatalf("x5c[%d]: %v", i, err)
				}
				if !bytes.Equal(der, want[i].Raw) {
					t.Fatalf("x5c[%d] is not certificate %d of the generation's chain (%q)", i, i, want[i].Subject)
				}
				c, err := x509.ParseCertificate(der)
				if err != nil {
					t.Fatalf("x5c[%d]: %v", i, err)
				}
				lintgate.Clean(t, reg, c)
			}
		})
	}
}
