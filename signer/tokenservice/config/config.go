package config

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/keyward/keyward/internal/strictyaml"
	signerconfig "github.com/keyward/keyward/signer/config"
)

// Defaults applied by Default. The plain-HTTP ports differ from the
// signer's (:9090, :9091) so that a token service and a signer can share a
// host.
const (
	DefaultListenAddress  = ":8443"
	DefaultMetricsAddress = ":9092"
	DefaultHealthAddress  = ":9093"
	DefaultTokenLifetime  = 5 * time.Minute
	DefaultReviewCacheTTL = 10 * time.Second
	DefaultLeaseNamespace = "keyward"
	DefaultLeaseName      = "keyward-token-service"

	MinTokenLifetime  = time.Minute
	MaxTokenLifetime  = time.Hour
	MaxReviewCacheTTL = time.Minute
)

// Load reads, strictly decodes, defaults and validates a configuration file.
func Load(path string) (*TokenServiceConfiguration, error) {
	return strictyaml.LoadFile(path, "token service", Parse)
}

// Parse decodes data (unknown and duplicate fields are errors that give the
// field's path; field names are case-sensitive), defaults and validates it.
func Parse(data []byte) (*TokenServiceConfiguration, error) {
	var cfg TokenServiceConfiguration
	if err := strictyaml.Decode(data, &cfg); err != nil {
		return nil, err
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return &cfg, nil
}

// Default fills in every unset field.
func (c *TokenServiceConfiguration) Default() {
	// A review the cache does not hold is three requests (TokenReview,
	// Pod, ServiceAccount): 300 QPS lets one replica review about 100 new
	// service-account tokens a second (the signer's 50 would cap it at
	// 16.7, measured in docs/benchmarks.md); the apiserver's priority and
	// fairness still protects it.
	if c.KubeClient.QPS == 0 {
		c.KubeClient.QPS = 300
	}
	if c.KubeClient.Burst == 0 {
		c.KubeClient.Burst = 600
	}
	le := &c.LeaderElection
	if le.Enabled == nil {
		t := true
		le.Enabled = &t
	}
	if le.Namespace == "" {
		le.Namespace = DefaultLeaseNamespace
	}
	if le.LeaseName == "" {
		le.LeaseName = DefaultLeaseName
	}
	if le.LeaseDuration.Duration == 0 {
		le.LeaseDuration.Duration = 15 * time.Second
	}
	if le.RenewDeadline.Duration == 0 {
		le.RenewDeadline.Duration = 10 * time.Second
	}
	if le.RetryPeriod.Duration == 0 {
		le.RetryPeriod.Duration = 2 * time.Second
	}
	c.TrustPublisher.Default()
	if c.Listen.Address == "" {
		c.Listen.Address = DefaultListenAddress
	}
	if c.MetricsAddress == "" {
		c.MetricsAddress = DefaultMetricsAddress
	}
	if c.HealthAddress == "" {
		c.HealthAddress = DefaultHealthAddress
	}
	if c.TokenLifetime.Duration == 0 {
		c.TokenLifetime.Duration = DefaultTokenLifetime
	}
	if c.KeyIdentifier == "" {
		c.KeyIdentifier = KeyIdentifierX5C
	}
	if c.ReviewCacheTTL == nil {
		c.ReviewCacheTTL = &metav1.Duration{Duration: DefaultReviewCacheTTL}
	}
	for i := range c.Registries {
		r := &c.Registries[i]
		if len(r.Hosts) == 0 && r.Service != "" {
			r.Hosts = []string{r.Service}
		}
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		if len(r.ServiceAccounts) == 0 {
			r.ServiceAccounts = []string{"*"}
		}
		if len(r.Actions) == 0 {
			r.Actions = []string{ActionPull}
		}
	}
}

// Validate checks the whole (defaulted) configuration and reports every
// problem with its field path.
func (c *TokenServiceConfiguration) Validate() field.ErrorList {
	errs := strictyaml.CheckTypeMeta(c.APIVersion, c.Kind, APIVersion, Kind)
	errs = append(errs, c.TrustPublisher.Validate(field.NewPath("trustPublisher"))...)
	if c.KubeClient.QPS < 0 || c.KubeClient.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("kubeClient"), c.KubeClient, "qps and burst must not be negative"))
	}
	errs = append(errs, c.Backends.Validate(field.NewPath("backends"))...)
	errs = append(errs, c.LeaderElection.Validate(field.NewPath("leaderElection"))...)
	errs = append(errs, c.validateAddresses()...)

	if c.SignerName == "" {
		errs = append(errs, field.Required(field.NewPath("signerName"), "the Authority whose Active generation signs tokens, e.g. keyward.dev/registry-token"))
	} else if !signerconfig.ValidSignerName(c.SignerName) {
		errs = append(errs, field.Invalid(field.NewPath("signerName"), c.SignerName, "must be <domain>/<path>, e.g. keyward.dev/registry-token"))
	}
	if strings.TrimSpace(c.Issuer) == "" {
		errs = append(errs, field.Required(field.NewPath("issuer"), "every token's iss, as the registries' auth.token.issuer"))
	}
	if strings.TrimSpace(c.Audience) == "" {
		errs = append(errs, field.Required(field.NewPath("audience"), "the service-account token audience kubelet requests (tokenAttributes.serviceAccountTokenAudience), e.g. keyward.dev/registry"))
	}
	if d := c.TokenLifetime.Duration; d < MinTokenLifetime || d > MaxTokenLifetime {
		errs = append(errs, field.Invalid(field.NewPath("tokenLifetime"), d.String(), "must be between 1m and 1h"))
	}
	if c.KeyIdentifier != KeyIdentifierX5C && c.KeyIdentifier != KeyIdentifierKID {
		errs = append(errs, field.NotSupported(field.NewPath("keyIdentifier"), c.KeyIdentifier, []string{KeyIdentifierX5C, KeyIdentifierKID}))
	}
	if c.ReviewCacheTTL != nil {
		if d := c.ReviewCacheTTL.Duration; d < 0 || d > MaxReviewCacheTTL {
			errs = append(errs, field.Invalid(field.NewPath("reviewCacheTTL"), d.String(), "must be between 0s (no cache) and 1m"))
		}
	}

	services := map[string]bool{}
	errs = append(errs, c.validateRegistries(services)...)
	rp := field.NewPath("rules")
	if len(c.Rules) == 0 {
		errs = append(errs, field.Required(rp, "at least one rule: without one no token grants anything"))
	}
	for i := range c.Rules {
		errs = append(errs, c.Rules[i].validate(rp.Index(i), services)...)
	}
	return errs
}

// validateAddresses checks that listen.address, metricsAddress and
// healthAddress are host:port and that no two share a fixed port.
func (c *TokenServiceConfiguration) validateAddresses() field.ErrorList {
	var errs field.ErrorList
	addrs := []struct {
		path *field.Path
		addr string
	}{
		{field.NewPath("listen", "address"), c.Listen.Address},
		{field.NewPath("metricsAddress"), c.MetricsAddress},
		{field.NewPath("healthAddress"), c.HealthAddress},
	}
	seen := map[string]bool{}
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a.addr)
		n, perr := strconv.Atoi(port)
		switch {
		case err != nil || perr != nil || n < 0 || n > 65535:
			errs = append(errs, field.Invalid(a.path, a.addr, "must be [host]:port, e.g. :8443"))
		case n != 0 && seen[a.addr]:
			errs = append(errs, field.Duplicate(a.path, a.addr))
		}
		seen[a.addr] = true
	}
	lp := field.NewPath("listen")
	if c.Listen.TLSCertFile == "" {
		errs = append(errs, field.Required(lp.Child("tlsCertFile"), "the token endpoint serves HTTPS only: the registries' realm and the plugin's URL"))
	}
	if c.Listen.TLSKeyFile == "" {
		errs = append(errs, field.Required(lp.Child("tlsKeyFile"), "the key of tlsCertFile"))
	}
	return errs
}

// validateRegistries checks registries and records their services.
func (c *TokenServiceConfiguration) validateRegistries(services map[string]bool) field.ErrorList {
	var errs field.ErrorList
	p := field.NewPath("registries")
	if len(c.Registries) == 0 {
		errs = append(errs, field.Required(p, "at least one registry that trusts this token service"))
	}
	hosts := map[string]bool{}
	for i, r := range c.Registries {
		ip := p.Index(i)
		switch {
		case strings.TrimSpace(r.Service) == "":
			errs = append(errs, field.Required(ip.Child("service"), "the registry's auth.token.service"))
		case services[r.Service]:
			errs = append(errs, field.Duplicate(ip.Child("service"), r.Service))
		}
		services[r.Service] = true
		if r.Audience != "" && strings.TrimSpace(r.Audience) != r.Audience {
			errs = append(errs, field.Invalid(ip.Child("audience"), r.Audience, "must not begin or end with spaces: it is compared exactly with the token's aud"))
		}
		for j, h := range r.Hosts {
			hp := ip.Child("hosts").Index(j)
			switch {
			case !ValidHost(h) && len(r.Hosts) == 1 && h == r.Service:
				errs = append(errs, field.Invalid(ip.Child("hosts"), r.Hosts,
					fmt.Sprintf("defaults to the service, and %q is no image host[:port]; list the hosts images name this registry by", h)))
			case !ValidHost(h):
				errs = append(errs, field.Invalid(hp, h, "must be host or host:port as written in image references, e.g. registry.example.com:5000"))
			case hosts[strings.ToLower(h)]:
				errs = append(errs, field.Duplicate(hp, h))
			}
			hosts[strings.ToLower(h)] = true
		}
	}
	return errs
}

func (r *Rule) validate(p *field.Path, services map[string]bool) field.ErrorList {
	var errs field.ErrorList
	if len(r.Namespaces) == 0 {
		errs = append(errs, field.Required(p.Child("namespaces"), `namespace names, or "*" for all`))
	}
	for i, ns := range r.Namespaces {
		if ns != "*" && len(validation.IsDNS1123Label(ns)) > 0 {
			errs = append(errs, field.Invalid(p.Child("namespaces").Index(i), ns, `must be a namespace name or "*"`))
		}
	}
	for i, sa := range r.ServiceAccounts {
		if sa != "*" && len(validation.IsDNS1123Subdomain(sa)) > 0 {
			errs = append(errs, field.Invalid(p.Child("serviceAccounts").Index(i), sa, `must be a service account name or "*"`))
		}
	}
	keys := make([]string, 0, len(r.ServiceAccountAnnotations))
	for k := range r.ServiceAccountAnnotations {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			errs = append(errs, field.Invalid(p.Child("serviceAccountAnnotations").Key(k), k, "not an annotation key: "+strings.Join(msgs, "; ")))
		}
	}
	for i, s := range r.Registries {
		if !services[s] {
			known := slices.Sorted(maps.Keys(services))
			errs = append(errs, field.NotSupported(p.Child("registries").Index(i), s, known))
		}
	}
	if len(r.Repositories) == 0 {
		errs = append(errs, field.Required(p.Child("repositories"), `repository patterns, e.g. "${namespace}/**"`))
	}
	for i, pat := range r.Repositories {
		if err := CheckRepositoryPattern(pat); err != nil {
			errs = append(errs, field.Invalid(p.Child("repositories").Index(i), pat, err.Error()))
		}
	}
	for i, a := range r.Actions {
		switch {
		case a != ActionPull && a != ActionPush && a != ActionDelete:
			errs = append(errs, field.NotSupported(p.Child("actions").Index(i), a, []string{ActionPull, ActionPush, ActionDelete}))
		case slices.Contains(r.Actions[:i], a):
			errs = append(errs, field.Duplicate(p.Child("actions").Index(i), a))
		}
	}
	return errs
}
