package softhsmtests

import (
	"crypto/x509/pkix"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/signer/config"
)

// A CA certificate minted this very second (notBefore = now, as an
// intermediate fresh from an offline root often is) issues at once: the
// leaf's notBefore is moved up to the CA's instead of the request being
// Failed for a CA "not valid yet", and kube-apiserver accepts it.
func TestAFreshlyMintedCAIssuesAtOnce(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "fresh")
	name := "keyward.dev/fresh-" + suffix
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	keyPath := filepath.Join(t.TempDir(), "ca.key")
	key, err := reg.CreateKey(ctx, backends.CreateKeyRequest{URI: "file:" + keyPath, Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	// ca.SelfSign backdates by ca.Backdate: that far ahead, notBefore is now.
	root, err := ca.SelfSign(ctx, key, ca.Options{Subject: pkix.Name{CommonName: "fresh CA"}, Lifetime: 48 * time.Hour,
		Now: func() time.Time { return time.Now().Add(ca.Backdate) }})
	key.Close()
	if err != nil {
		t.Fatal(err)
	}
	if age := time.Since(root.NotBefore); age > 2*time.Second {
		t.Fatalf("the CA's notBefore is %s old, want a CA minted now", age)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: root.Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	runSigner(t, baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, "file:"+keyPath, caFile)), "replica-0")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	p, _ := createPCR(t, ctx, w, name, pcrOptions{})
	got := waitTerminal(t, ctx, p, 30*time.Second)
	if c := condition(got); c.Type != "Issued" {
		t.Fatalf("got %s/%s %q, want Issued", c.Type, c.Reason, c.Message)
	}
	leaf := parseChain(t, got.Status.CertificateChain, root)
	if leaf.NotBefore.Before(root.NotBefore) {
		t.Errorf("leaf notBefore %s is before its CA's %s", leaf.NotBefore, root.NotBefore)
	}
}
