package softhsmtests

import (
	"errors"
	"strings"
	"testing"

	"github.com/keyward/keyward/cmd/keyward/app"
)

// ca init --skip-if-present, as the softhsm overlay's init container runs it
// on every pod start: the first run creates the key and the generation, a
// rerun with the same key URI changes nothing and exits 0 with one line,
// and generation GEN with another key URI is an error naming both URIs.
func TestCAInitSkipIfPresent(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c := authorityClient(t)
	u := uniqueName(t, "skip")
	signer := "keyward.dev/" + u
	uri := tokenKeyURI(u + "-g1")
	args := []string{"ca", "init", "--signer", signer, "--generation", "g1", "--key-uri", uri, "--create-key", "--skip-if-present"}

	if out, err := keyward(t, args...); err != nil {
		t.Fatalf("first ca init: %v\n%s", err, out)
	}
	before := authorityFor(t, c, signer)
	if before == nil {
		t.Fatal("the first run made no Authority")
	}
	out, err := keyward(t, args...)
	if err != nil {
		t.Fatalf("second ca init: %v\n%s", err, out)
	}
	if lines := strings.Split(strings.TrimSpace(out), "\n"); len(lines) != 1 {
		t.Errorf("second run printed %d lines, want one:\n%s", len(lines), out)
	}
	if after := authorityFor(t, c, signer); after.ResourceVersion != before.ResourceVersion {
		t.Error("the second run changed the Authority")
	}

	other := tokenKeyURI(u + "-other")
	out, err = keyward(t, "ca", "init", "--signer", signer, "--generation", "g1", "--key-uri", other, "--create-key", "--skip-if-present")
	if !errors.Is(err, app.ErrGenerationKeyDiffers) {
		t.Fatalf("generation g1 with another key: got %v, want ErrGenerationKeyDiffers\n%s", err, out)
	}
	// The refusal names both URIs (this part is about the message).
	stored := generation(t, before, "g1").KeyURI
	if msg := err.Error(); !strings.Contains(msg, stored) || !strings.Contains(msg, other) {
		t.Errorf("error %q does not name both %s and %s", msg, stored, other)
	}
	if after := authorityFor(t, c, signer); after.ResourceVersion != before.ResourceVersion {
		t.Error("the refused run changed the Authority")
	}
}
