package rbac

import (
	"testing"

	"github.com/keyward/keyward/trustpublisher"
)

// The RBAC names the very bundles the trust publisher writes.
func TestBundleNamesAreTheTrustPublishers(t *testing.T) {
	for _, s := range []string{"keyward.dev/pod-identity", "kubernetes.io/kubelet-serving", "example.com/a/b"} {
		for _, v := range []string{"canary", "live"} {
			if got, want := bundleName(s, v), trustpublisher.BundleName(s, v); got != want {
				t.Errorf("bundleName(%q, %q) = %q, the trust publisher writes %q", s, v, got, want)
			}
		}
	}
}

// A signer name no Authority name can be derived from needs one given.
func TestAnUnderivableAuthorityNameIsRefused(t *testing.T) {
	in := Input{Namespace: "keyward", TokenService: &TokenServiceInput{SignerName: "___/___"}}
	if _, err := Render(in); err == nil {
		t.Fatalf("Render accepted signer %q with no Authority name", in.TokenService.SignerName)
	}
	in.AuthorityNames = map[string]string{in.TokenService.SignerName: "my-authority"}
	if _, err := Render(in); err != nil {
		t.Fatalf("with an Authority name given: %v", err)
	}
}
