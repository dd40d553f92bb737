package config

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
)

// CSRUsages are the key usages a CertificateSigningRequest may ask for
// (certificates.k8s.io/v1 KeyUsage), except "cert sign" and "crl sign":
// keyward never issues a CA certificate.
var CSRUsages = []string{
	"signing", "digital signature", "content commitment", "key encipherment", "key agreement",
	"data encipherment", "encipher only", "decipher only", "any",
	"server auth", "client auth", "code signing", "email protection", "s/mime",
	"ipsec end system", "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing",
	"microsoft sgc", "netscape sgc",
}

// CAUsages are the usages only a CA certificate carries; a CSR signer
// never grants them.
var CAUsages = []string{"cert sign", "crl sign"}

// validate checks a csr profile's rules: every pattern well formed, every
// range a CIDR, every usage one certificates.k8s.io knows (and none of a
// CA), and a stated trust distribution.
func (c *CSRPolicy) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if strings.TrimSpace(c.TrustDistribution) == "" {
		errs = append(errs, field.Required(p.Child("trustDistribution"), "say how relying parties get the CA, e.g. ClusterTrustBundle <domain>:<name>:live"))
	}
	for j, pat := range c.CommonNames {
		if err := checkNamePattern(pat, true); err != nil {
			errs = append(errs, field.Invalid(p.Child("commonNames").Index(j), pat, err.Error()))
		}
	}
	for j, o := range c.Organizations {
		if o == "" {
			errs = append(errs, field.Invalid(p.Child("organizations").Index(j), o, "must not be empty"))
		}
	}
	for j, pat := range c.DNSNames {
		if err := checkNamePattern(pat, false); err != nil {
			errs = append(errs, field.Invalid(p.Child("dnsNames").Index(j), pat, err.Error()))
		}
	}
	for j, r := range c.IPRanges {
		if _, _, err := net.ParseCIDR(r); err != nil {
			errs = append(errs, field.Invalid(p.Child("ipRanges").Index(j), r, "must be a CIDR, e.g. 10.0.0.0/8 or fd00::/8"))
		}
	}
	for j, pat := range c.URIs {
		prefix, star := strings.CutSuffix(pat, "*")
		if pat == "" || strings.Contains(prefix, "*") || star && !strings.HasSuffix(prefix, "/") {
			errs = append(errs, field.Invalid(p.Child("uris").Index(j), pat, `must be a URI, optionally ending in "/*" (one or more path segments)`))
		}
	}
	if len(c.KeyUsages) == 0 {
		errs = append(errs, field.Required(p.Child("keyUsages"), `the usages a request may ask for, e.g. ["digital signature", "client auth"]`))
	}
	for j, u := range c.KeyUsages {
		switch {
		case slices.Contains(CAUsages, u):
			errs = append(errs, field.Forbidden(p.Child("keyUsages").Index(j), fmt.Sprintf("%q is a CA usage; keyward never issues CA certificates", u)))
		case !slices.Contains(CSRUsages, u):
			errs = append(errs, field.NotSupported(p.Child("keyUsages").Index(j), u, CSRUsages))
		}
	}
	return errs
}

// checkNamePattern accepts an exact name, a leading "*." (one DNS label)
// and, where any is true, "*" alone (any value).
func checkNamePattern(p string, any bool) error {
	if p == "" {
		return fmt.Errorf("must not be empty")
	}
	if p == "*" {
		if any {
			return nil
		}
		return fmt.Errorf(`"*" alone is not allowed here; use "*.<domain>"`)
	}
	if strings.Contains(strings.TrimPrefix(p, "*."), "*") {
		return fmt.Errorf(`only a leading "*." wildcard is allowed`)
	}
	return nil
}
