package softhsmtests

import (
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
)

// A request whose annotation carries 200 KiB (the apiserver admits up to
// 256 KiB) is Denied with a short, readable message: the apiserver refuses
// condition messages over 32 KiB, and quoting the value whole would make
// the request impossible to finish.
func TestHugeAnnotationIsDeniedReadably(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "big")
	name := "keyward.dev/big-" + suffix
	keyURI, caFile, _ := caInToken(t, "ca-"+suffix)
	srv := signerConfig(t, name, config.ProfileServer, keyURI, caFile)
	srv.Server = &config.Server{AllowedDNSNames: []string{"{serviceAccount}.{namespace}.svc"}}
	srv.UnverifiedUserAnnotations = []string{config.DefaultDNSNamesKey}
	runSigner(t, baseConfig(t, srv), "replica-0")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)

	for _, tc := range []struct {
		name, value, wantReason string
	}{
		{"one 200 KiB name", strings.Repeat("a", 200<<10), "InvalidUnverifiedUserAnnotations"},
		{"a 200 KiB list of names not allowed", strings.Repeat("x.example.com,", (200<<10)/14), "DNSNameNotAllowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _ := createPCR(t, ctx, w, name, pcrOptions{annotations: map[string]string{config.DefaultDNSNamesKey: tc.value}})
			got := waitTerminal(t, ctx, p, 30*time.Second)
			c := condition(got)
			if c.Type != "Denied" || c.Reason != tc.wantReason {
				t.Fatalf("got %s/%s, want Denied/%s: %.300s", c.Type, c.Reason, tc.wantReason, c.Message)
			}
			if len(c.Message) > 1024 {
				t.Fatalf("message of %d bytes, want a short one: %.300s…", len(c.Message), c.Message)
			}
			if !strings.Contains(c.Message, config.DefaultDNSNamesKey) && !strings.Contains(c.Message, "bytes)") && tc.wantReason == "InvalidUnverifiedUserAnnotations" {
				t.Errorf("message names neither the annotation nor the value's length: %s", c.Message)
			}
			t.Logf("%s: %s", c.Reason, c.Message)
		})
	}
}
