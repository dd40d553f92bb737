package v1alpha1

import (
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

var (
	notDNS   = regexp.MustCompile(`[^a-z0-9.-]+`)
	dotSeams = regexp.MustCompile(`\.[-.]*`)
)

// DefaultAuthorityName is the name `keyward ca init` gives the Authority of
// a signer name, and the name the shipped RBAC grants writes on:
// "example.com/my-signer" becomes "example.com.my-signer". It fails when no
// valid object name can be derived.
func DefaultAuthorityName(signerName string) (string, error) {
	s := notDNS.ReplaceAllString(strings.ToLower(strings.ReplaceAll(signerName, "/", ".")), "-")
	s = dotSeams.ReplaceAllString(s, ".")
	s = strings.Trim(s, ".-")
	if errs := validation.IsDNS1123Subdomain(s); len(errs) > 0 {
		return "", fmt.Errorf("cannot derive an Authority name from signer %s (%s)", signerName, strings.Join(errs, "; "))
	}
	return s, nil
}
