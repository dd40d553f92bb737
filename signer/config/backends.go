package config

import (
	"net"
	"path/filepath"
	"strconv"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Backends tunes the key backends. Every field is optional; what is left
// out keeps the backend's default (docs/backends.md).
type Backends struct {
	// PKCS11 tunes pkcs11: key URIs (HSMs, SoftHSM2).
	PKCS11 PKCS11Backend `json:"pkcs11,omitempty"`
	// GCPKMS tunes gcpkms: key URIs (Google Cloud KMS).
	GCPKMS GCPKMSBackend `json:"gcpkms,omitempty"`
	// AWSKMS tunes awskms: key URIs (AWS KMS).
	AWSKMS AWSKMSBackend `json:"awskms,omitempty"`
}

// PKCS11Backend tunes pkcs11: key URIs.
type PKCS11Backend struct {
	// AllowedModules are the absolute paths of the PKCS#11 modules key URIs
	// may load (default: SoftHSM2's usual paths). The signer's
	// --pkcs11-module flag, when given, replaces this list.
	AllowedModules []string `json:"allowedModules,omitempty"`
	// MaxSessions bounds each token's session pool (default 16).
	MaxSessions int `json:"maxSessions,omitempty"`
	// PoolWaitTimeout bounds the wait for a free session (default 5s).
	PoolWaitTimeout metav1.Duration `json:"poolWaitTimeout,omitempty"`
}

// GCPKMSBackend tunes gcpkms: key URIs.
type GCPKMSBackend struct {
	// Endpoint is the Cloud KMS endpoint as host:port, e.g. a Private
	// Service Connect endpoint (default cloudkms.googleapis.com:443). TLS
	// and Application Default Credentials are used either way.
	Endpoint string `json:"endpoint,omitempty"`
	// CallTimeout bounds each call (default 10s).
	CallTimeout metav1.Duration `json:"callTimeout,omitempty"`
	// MaxAttempts bounds the calls made for one signature, the first
	// included (default 5).
	MaxAttempts int `json:"maxAttempts,omitempty"`
}

// AWSKMSBackend tunes awskms: key URIs. Endpoints are per key, in the URI.
type AWSKMSBackend struct {
	// CallTimeout bounds each attempt of each call (default 10s).
	CallTimeout metav1.Duration `json:"callTimeout,omitempty"`
	// MaxAttempts bounds the attempts of one call, the first included
	// (default 5).
	MaxAttempts int `json:"maxAttempts,omitempty"`
}

// Validate checks b and names each problem's path under p; the token
// service's configuration embeds Backends too.
func (b *Backends) Validate(p *field.Path) field.ErrorList { return b.validate(p) }

func (b *Backends) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	pp := p.Child("pkcs11")
	seen := map[string]bool{}
	for i, m := range b.PKCS11.AllowedModules {
		mp := pp.Child("allowedModules").Index(i)
		switch {
		case !filepath.IsAbs(m) || filepath.Clean(m) != m:
			errs = append(errs, field.Invalid(mp, m, "must be a clean absolute path"))
		case seen[m]:
			errs = append(errs, field.Duplicate(mp, m))
		}
		seen[m] = true
	}
	errs = append(errs, nonNegative(pp.Child("maxSessions"), b.PKCS11.MaxSessions)...)
	errs = append(errs, nonNegativeDuration(pp.Child("poolWaitTimeout"), b.PKCS11.PoolWaitTimeout)...)

	gp := p.Child("gcpkms")
	if e := b.GCPKMS.Endpoint; e != "" {
		host, port, err := net.SplitHostPort(e)
		if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
			errs = append(errs, field.Invalid(gp.Child("endpoint"), e, "must be host:port, e.g. cloudkms.googleapis.com:443"))
		}
	}
	errs = append(errs, nonNegativeDuration(gp.Child("callTimeout"), b.GCPKMS.CallTimeout)...)
	errs = append(errs, nonNegative(gp.Child("maxAttempts"), b.GCPKMS.MaxAttempts)...)

	ap := p.Child("awskms")
	errs = append(errs, nonNegativeDuration(ap.Child("callTimeout"), b.AWSKMS.CallTimeout)...)
	errs = append(errs, nonNegative(ap.Child("maxAttempts"), b.AWSKMS.MaxAttempts)...)
	return errs
}

func nonNegative(p *field.Path, v int) field.ErrorList {
	if v < 0 {
		return field.ErrorList{field.Invalid(p, v, "must not be negative (0 or unset: the default)")}
	}
	return nil
}

func nonNegativeDuration(p *field.Path, d metav1.Duration) field.ErrorList {
	if d.Duration < 0 {
		return field.ErrorList{field.Invalid(p, d.Duration.String(), "must not be negative (0 or unset: the default)")}
	}
	return nil
}
