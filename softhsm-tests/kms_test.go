package softhsmtests

import (
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
)

// The same signer, with only the CA key URI changed, issues pod
// certificates from a CA key held in Cloud KMS or AWS KMS: the in-process
// fakes, reached through the real Google and AWS clients.
func TestKMSHeldCAKeysIssue(t *testing.T) {
	fakes := startKMSFakes(t)
	gcp, cryptoKey, awsKMS := fakes.gcp, fakes.cryptoKey, fakes.aws

	opts := fakes.opts
	signs := map[string]func() int{
		"gcpkms": func() int { return gcp.Calls(gcpkmsfake.AsymmetricSign) },
		"awskms": func() int { return awsKMS.Calls(awskmsfake.Sign) },
	}
	for _, tc := range []struct{ name, createURI string }{
		{"gcpkms", "gcpkms:" + cryptoKey},
		{"awskms", "awskms:region=eu-west-1?endpoint=" + awsKMS.URL()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testContext(t)
			keyURI, caFile, root := newCA(t, opts, tc.createURI, "ca-"+tc.name)
			if !strings.HasPrefix(keyURI, tc.name+":") {
				t.Fatalf("CA key URI %s is not a %s URI", keyURI, tc.name)
			}
			name := "keyward.dev/" + uniqueName(t, tc.name)
			runSignerWith(t, baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile)), "kms-"+tc.name, "", opts)
			before := signs[tc.name]()
			w := podOnNode(t, ctx, uniqueName(t, "node"), name)
			p, _ := createPCR(t, ctx, w, name, pcrOptions{})
			got := waitTerminal(t, ctx, p, 30*time.Second)
			if c := condition(got); c.Type != "Issued" {
				t.Fatalf("got %s/%s: %s", c.Type, c.Reason, c.Message)
			}
			parseChain(t, got.Status.CertificateChain, root)
			if n := signs[tc.name]() - before; n != 1 {
				t.Errorf("the KMS signed %d times for one certificate, want 1", n)
			}
		})
	}
}
