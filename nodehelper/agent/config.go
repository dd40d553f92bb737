package agent

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/keyward/keyward/internal/signername"
	"github.com/keyward/keyward/internal/strictyaml"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/nodehelper/trust"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// APIVersion and Kind of the configuration file.
const (
	APIVersion = "keyward.dev/v1alpha1"
	Kind       = "NodeAgentConfiguration"
)

// Defaults.
const (
	DefaultStateDir            = "/var/lib/keyward-node"
	DefaultMetricsAddress      = "127.0.0.1:9465"
	DefaultHealthAddress       = "127.0.0.1:9466"
	DefaultBootstrapSignerName = certv1.KubeAPIServerClientKubeletSignerName
	DefaultKeyType             = nodehelper.KeyTypeECDSAP256
	DefaultBundleFile          = "credential-bundle.pem"
	DefaultCredentialMode      = int32(0o600)
	DefaultRetryInitial        = 2 * time.Second
	DefaultRetryMax            = 5 * time.Minute
	DefaultWaitTimeout         = 15 * time.Minute
	// Disabled as MetricsAddress or HealthAddress serves nothing there.
	Disabled = "-"
	// IdentityName is the certstore name of the bootstrap identity; no
	// credential may take it.
	IdentityName = "identity"
	// NodeNameVariable in a credential's commonName, dnsNames or uris is
	// replaced by the node name.
	NodeNameVariable = "${NODE_NAME}"
	// MinExpirationSeconds is kube-apiserver's minimum for a CSR's
	// spec.expirationSeconds.
	MinExpirationSeconds = 600
)

// Configuration is the node agent's YAML file. Load decodes it strictly
// (unknown or repeated fields are errors), defaults and validates it.
type Configuration struct {
	// APIVersion is keyward.dev/v1alpha1.
	APIVersion string `json:"apiVersion"`
	// Kind is NodeAgentConfiguration.
	Kind string `json:"kind"`
	// NodeName defaults to $NODE_NAME; it is required in the end.
	NodeName string `json:"nodeName,omitempty"`
	// StateDir holds the key/certificate pairs (DefaultStateDir).
	StateDir string `json:"stateDir,omitempty"`
	// Kubeconfig is the node identity (e.g. kubelet's kubeconfig);
	// exclusive with Bootstrap. Neither: the in-cluster service account.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Bootstrap, if set, obtains the node identity with a bootstrap token
	// (KEP-266); exclusive with Kubeconfig.
	Bootstrap *Bootstrap `json:"bootstrap,omitempty"`
	// MetricsAddress (DefaultMetricsAddress) serves /metrics; "-" disables.
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// HealthAddress (DefaultHealthAddress) serves /healthz, which fails
	// while a credential is expired, or missing after its first try, and
	// /readyz; "-" disables.
	HealthAddress string `json:"healthAddress,omitempty"`
	// Renewal tunes the retries after an error and the wait for issuance.
	Renewal Renewal `json:"renewal,omitempty"`
	// Credentials are the key/certificate pairs the agent requests by CSR
	// and keeps current.
	Credentials []Credential `json:"credentials,omitempty"`
	// Trust are the ClusterTrustBundles the agent writes to files on the
	// node.
	Trust []Trust `json:"trust,omitempty"`
}

// Bootstrap is KEP-266's flow: with no valid identity pair in StateDir
// (certstore name "identity") the agent uses Kubeconfig (a bootstrap token)
// to request CN=system:node:<node>, O=system:nodes, then talks to the
// apiserver as that identity and renews it like any credential.
type Bootstrap struct {
	// Kubeconfig holds the bootstrap token used only to request the node
	// identity.
	Kubeconfig string `json:"kubeconfig"`
	// SignerName defaults to kubernetes.io/kube-apiserver-client-kubelet.
	SignerName string `json:"signerName,omitempty"`
	// KeyType defaults to ECDSAP256.
	KeyType string `json:"keyType,omitempty"`
	// ExpirationSeconds, if set, is the identity CSR's
	// spec.expirationSeconds (at least 600).
	ExpirationSeconds *int32 `json:"expirationSeconds,omitempty"`
}

// Renewal tunes retries.
type Renewal struct {
	// RetryInitial and RetryMax bound the exponential backoff (with
	// jitter) after an error: defaults 2s and 5m.
	RetryInitial metav1.Duration `json:"retryInitial,omitempty"`
	// RetryMax caps the backoff (default 5m).
	RetryMax metav1.Duration `json:"retryMax,omitempty"`
	// WaitTimeout (15m) bounds one wait for issuance; then the same CSR
	// is looked up again (no new request).
	WaitTimeout metav1.Duration `json:"waitTimeout,omitempty"`
}

// Credential is one key and certificate the agent keeps current.
type Credential struct {
	// Name is the certstore name in StateDir and the metric label.
	Name string `json:"name"`
	// SignerName is the CSR's spec.signerName, e.g.
	// keyward.dev/node-daemons.
	SignerName string `json:"signerName"`
	// KeyType defaults to ECDSAP256.
	KeyType string `json:"keyType,omitempty"`
	// CommonName is the subject CN; ${NODE_NAME} is replaced by the node
	// name.
	CommonName string `json:"commonName,omitempty"`
	// Organizations are the subject O values.
	Organizations []string `json:"organizations,omitempty"`
	// DNSNames are DNS SANs; ${NODE_NAME} is replaced by the node name.
	DNSNames []string `json:"dnsNames,omitempty"`
	// IPAddresses are IP SANs.
	IPAddresses []string `json:"ipAddresses,omitempty"`
	// URIs are URI SANs; ${NODE_NAME} is replaced by the node name.
	URIs []string `json:"uris,omitempty"`
	// Usages default to ["digital signature", "client auth"].
	Usages []string `json:"usages,omitempty"`
	// ExpirationSeconds, if set, is at least 600.
	ExpirationSeconds *int32 `json:"expirationSeconds,omitempty"`
	// Output is where the credential's files are written.
	Output Output `json:"output"`
}

// Output is where a credential's files go, written with atomicdir.
type Output struct {
	// Dir is the directory the files are written to, atomically as one set.
	Dir string `json:"dir"`
	// BundleFile (DefaultBundleFile) is KEP-4317's layout: PRIVATE KEY,
	// then the chain, leaf first.
	BundleFile string `json:"bundleFile,omitempty"`
	// KeyFile and ChainFile are optional separate files in the same write.
	KeyFile string `json:"keyFile,omitempty"`
	// ChainFile: see KeyFile (the chain, leaf first).
	ChainFile string `json:"chainFile,omitempty"`
	// Mode of every file (0600); UID and GID their owner (unchanged).
	Mode *int32 `json:"mode,omitempty"`
	// UID owns every file (unset: unchanged).
	UID *int `json:"uid,omitempty"`
	// GID is every file's group (unset: unchanged).
	GID *int `json:"gid,omitempty"`
}

// Trust is one trust projection (a trust.Projector).
type Trust struct {
	// Name is the metric label.
	Name string `json:"name"`
	// ClusterTrustBundleName selects the one ClusterTrustBundle of that
	// name; exclusive with SignerName.
	ClusterTrustBundleName string `json:"clusterTrustBundleName,omitempty"`
	// SignerName selects the bundles of this signer name with the version
	// label Version (or the NodeLabel value).
	SignerName string `json:"signerName,omitempty"`
	// Version is canary or live (the default), with SignerName.
	Version string `json:"version,omitempty"`
	// NodeLabel is a label on this Node whose value (canary or live) chooses
	// the version, with SignerName.
	NodeLabel string `json:"nodeLabel,omitempty"`
	// LabelDomain is the domain of the <domain>/cluster-trust-bundle-version
	// label (default keyward.dev).
	LabelDomain string `json:"labelDomain,omitempty"`
	// AdditionalBundleNames, with SignerName, are ClusterTrustBundle
	// names merged besides keyward's own <signer>:<version> (signer name
	// with / as :). Anyone with attest on the signer name can create a
	// bundle under its prefix; by default only keyward's is merged and the
	// others are ignored (keyward_node_trust_bundles_ignored).
	AdditionalBundleNames []string `json:"additionalBundleNames,omitempty"`
	// MaxCertificates caps the trust file's certificates (default 64);
	// over it the last good file stays, the agent says so once and sets
	// keyward_node_trust_bundle_over_limit.
	MaxCertificates int `json:"maxCertificates,omitempty"`
	// MaxBytes caps the trust file's size (default 131072), as
	// MaxCertificates.
	MaxBytes int `json:"maxBytes,omitempty"`
	// Dir is the directory the trust file is written to, atomically.
	Dir string `json:"dir"`
	// File is the trust file in Dir (default ca-bundle.pem).
	File string `json:"file,omitempty"`
	// Mode is the trust file's mode (default 0644).
	Mode *int32 `json:"mode,omitempty"`
	// UID owns the file (unset: unchanged).
	UID *int `json:"uid,omitempty"`
	// GID is the file's group (unset: unchanged).
	GID *int `json:"gid,omitempty"`
	// OnChange is a command (argv, no shell) run after the file changed,
	// killed after OnChangeTimeout (30s).
	OnChange []string `json:"onChange,omitempty"`
	// OnChangeTimeout bounds OnChange (default 30s).
	OnChangeTimeout metav1.Duration `json:"onChangeTimeout,omitempty"`
	// OnChangeDebounce (default 10s) is how long after a change OnChange
	// runs, once, for the file as it is then: changes within that time
	// are folded into that run, so runs are at least this far apart. Keep
	// it well below the Authority's propagation window.
	OnChangeDebounce metav1.Duration `json:"onChangeDebounce,omitempty"`
}

// Load reads, decodes (strictly), defaults and validates the file at path.
// Errors name the field, e.g. `credentials[1].signerName: Required value`.
func Load(path string) (*Configuration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading node agent configuration: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// Parse is Load on the file's content.
func Parse(data []byte) (*Configuration, error) {
	var cfg Configuration
	if err := strictyaml.Decode(data, &cfg); err != nil {
		return nil, err
	}
	cfg.Default()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

// Default fills in every unset field; NodeName from $NODE_NAME.
func (c *Configuration) Default() {
	if c.NodeName == "" {
		c.NodeName = os.Getenv("NODE_NAME")
	}
	if c.StateDir == "" {
		c.StateDir = DefaultStateDir
	}
	if c.MetricsAddress == "" {
		c.MetricsAddress = DefaultMetricsAddress
	}
	if c.HealthAddress == "" {
		c.HealthAddress = DefaultHealthAddress
	}
	if b := c.Bootstrap; b != nil {
		if b.SignerName == "" {
			b.SignerName = DefaultBootstrapSignerName
		}
		if b.KeyType == "" {
			b.KeyType = DefaultKeyType
		}
	}
	r := &c.Renewal
	if r.RetryInitial.Duration == 0 {
		r.RetryInitial.Duration = DefaultRetryInitial
	}
	if r.RetryMax.Duration == 0 {
		r.RetryMax.Duration = DefaultRetryMax
	}
	if r.WaitTimeout.Duration == 0 {
		r.WaitTimeout.Duration = DefaultWaitTimeout
	}
	for i := range c.Credentials {
		cr := &c.Credentials[i]
		if cr.KeyType == "" {
			cr.KeyType = DefaultKeyType
		}
		if len(cr.Usages) == 0 {
			cr.Usages = []string{string(certv1.UsageDigitalSignature), string(certv1.UsageClientAuth)}
		}
		if cr.Output.BundleFile == "" {
			cr.Output.BundleFile = DefaultBundleFile
		}
		if cr.Output.Mode == nil {
			m := DefaultCredentialMode
			cr.Output.Mode = &m
		}
	}
	for i := range c.Trust {
		t := &c.Trust[i]
		if t.File == "" {
			t.File = trust.DefaultFileName
		}
		if t.Mode == nil {
			m := int32(trust.DefaultMode)
			t.Mode = &m
		}
		if t.LabelDomain == "" {
			t.LabelDomain = trust.DefaultLabelDomain
		}
		if t.OnChangeTimeout.Duration == 0 {
			t.OnChangeTimeout.Duration = trust.DefaultHookTimeout
		}
		if t.OnChangeDebounce.Duration == 0 {
			t.OnChangeDebounce.Duration = trust.DefaultHookDebounce
		}
		if t.MaxCertificates == 0 {
			t.MaxCertificates = trust.DefaultMaxCertificates
		}
		if t.MaxBytes == 0 {
			t.MaxBytes = trust.DefaultMaxBytes
		}
	}
}

var (
	// storeNameRE is what a certstore name may be (a DNS label).
	storeNameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	keyTypes    = []string{nodehelper.KeyTypeRSA3072, nodehelper.KeyTypeRSA4096, nodehelper.KeyTypeECDSAP256,
		nodehelper.KeyTypeECDSAP384, nodehelper.KeyTypeECDSAP521, nodehelper.KeyTypeED25519}
	// keyUsages are the usages certificates.k8s.io/v1 knows.
	keyUsages = func() map[certv1.KeyUsage]bool {
		m := map[certv1.KeyUsage]bool{}
		for _, u := range []certv1.KeyUsage{certv1.UsageSigning, certv1.UsageDigitalSignature, certv1.UsageContentCommitment,
			certv1.UsageKeyEncipherment, certv1.UsageKeyAgreement, certv1.UsageDataEncipherment, certv1.UsageCertSign,
			certv1.UsageCRLSign, certv1.UsageEncipherOnly, certv1.UsageDecipherOnly, certv1.UsageAny, certv1.UsageServerAuth,
			certv1.UsageClientAuth, certv1.UsageCodeSigning, certv1.UsageEmailProtection, certv1.UsageSMIME,
			certv1.UsageIPsecEndSystem, certv1.UsageIPsecTunnel, certv1.UsageIPsecUser, certv1.UsageTimestamping,
			certv1.UsageOCSPSigning, certv1.UsageMicrosoftSGC, certv1.UsageNetscapeSGC} {
			m[u] = true
		}
		return m
	}()
)

// Validate checks a defaulted configuration. Its error is a
// field.ErrorList aggregate (errors.As to utilerrors.Aggregate, each a
// *field.Error naming the field).
func (c *Configuration) Validate() error {
	errs := strictyaml.CheckTypeMeta(c.APIVersion, c.Kind, APIVersion, Kind)
	if c.NodeName == "" {
		errs = append(errs, field.Required(field.NewPath("nodeName"), "set it or $NODE_NAME"))
	} else {
		for _, msg := range validation.IsDNS1123Subdomain(c.NodeName) {
			errs = append(errs, field.Invalid(field.NewPath("nodeName"), c.NodeName, msg))
		}
	}
	if !filepath.IsAbs(c.StateDir) {
		errs = append(errs, field.Invalid(field.NewPath("stateDir"), c.StateDir, "must be an absolute path"))
	}
	if b := c.Bootstrap; b != nil {
		p := field.NewPath("bootstrap")
		if c.Kubeconfig != "" {
			errs = append(errs, field.Forbidden(field.NewPath("kubeconfig"), "exclusive with bootstrap (the identity comes from the bootstrap flow)"))
		}
		if b.Kubeconfig == "" {
			errs = append(errs, field.Required(p.Child("kubeconfig"), "the bootstrap kubeconfig (a bootstrap token)"))
		}
		errs = append(errs, validateSignerName(b.SignerName, p.Child("signerName"))...)
		errs = append(errs, validateKeyType(b.KeyType, p.Child("keyType"))...)
		errs = append(errs, validateExpiration(b.ExpirationSeconds, p.Child("expirationSeconds"))...)
	}
	errs = append(errs, validateAddress(c.MetricsAddress, field.NewPath("metricsAddress"))...)
	errs = append(errs, validateAddress(c.HealthAddress, field.NewPath("healthAddress"))...)
	if c.MetricsAddress != Disabled && c.MetricsAddress == c.HealthAddress && !strings.HasSuffix(c.MetricsAddress, ":0") {
		errs = append(errs, field.Duplicate(field.NewPath("healthAddress"), c.HealthAddress))
	}
	r, rp := c.Renewal, field.NewPath("renewal")
	if r.RetryInitial.Duration <= 0 {
		errs = append(errs, field.Invalid(rp.Child("retryInitial"), r.RetryInitial.String(), "must be positive"))
	}
	if r.RetryMax.Duration < r.RetryInitial.Duration {
		errs = append(errs, field.Invalid(rp.Child("retryMax"), r.RetryMax.String(), "must be at least retryInitial"))
	}
	if r.WaitTimeout.Duration <= 0 {
		errs = append(errs, field.Invalid(rp.Child("waitTimeout"), r.WaitTimeout.String(), "must be positive"))
	}
	if len(c.Credentials) == 0 && len(c.Trust) == 0 && c.Bootstrap == nil {
		errs = append(errs, field.Required(field.NewPath("credentials"), "nothing to do: no credentials, trust or bootstrap"))
	}

	dirs := map[string]string{} // cleaned output dir -> the field that took it
	takeDir := func(dir string, p *field.Path) {
		clean := filepath.Clean(dir)
		if other, ok := dirs[clean]; ok {
			errs = append(errs, field.Invalid(p, dir, "already written by "+other+" (one writer per directory)"))
			return
		}
		dirs[clean] = p.String()
	}
	if filepath.IsAbs(c.StateDir) {
		// atomicdir links its names into the directory it writes: in the
		// state directory they could replace a pair's current link.
		dirs[filepath.Clean(c.StateDir)] = "stateDir"
	}
	names := map[string]bool{}
	for i, cr := range c.Credentials {
		p := field.NewPath("credentials").Index(i)
		switch {
		case cr.Name == IdentityName:
			errs = append(errs, field.Invalid(p.Child("name"), cr.Name, "is reserved for the bootstrap identity"))
		case len(cr.Name) > 63 || !storeNameRE.MatchString(cr.Name):
			errs = append(errs, field.Invalid(p.Child("name"), cr.Name, "must be a DNS label: lower case letters, digits and '-', at most 63"))
		case names[cr.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), cr.Name))
		}
		names[cr.Name] = true
		errs = append(errs, validateSignerName(cr.SignerName, p.Child("signerName"))...)
		errs = append(errs, validateKeyType(cr.KeyType, p.Child("keyType"))...)
		errs = append(errs, validateExpiration(cr.ExpirationSeconds, p.Child("expirationSeconds"))...)
		// Without a node name (said above) check names as a node "node"
		// would have them, so that the one mistake gives one error.
		nodeName := cmp.Or(c.NodeName, "node")
		expand := func(s string) string { return strings.ReplaceAll(s, NodeNameVariable, nodeName) }
		if cr.CommonName == "" && len(cr.DNSNames) == 0 && len(cr.IPAddresses) == 0 && len(cr.URIs) == 0 {
			errs = append(errs, field.Required(p.Child("commonName"), "a common name or a DNS name, IP address or URI"))
		}
		for j, d := range cr.DNSNames {
			for _, msg := range validation.IsDNS1123Subdomain(strings.TrimPrefix(expand(d), "*.")) {
				errs = append(errs, field.Invalid(p.Child("dnsNames").Index(j), d, msg))
			}
		}
		for j, ip := range cr.IPAddresses {
			if _, err := netip.ParseAddr(ip); err != nil {
				errs = append(errs, field.Invalid(p.Child("ipAddresses").Index(j), ip, "must be an IP address"))
			}
		}
		for j, u := range cr.URIs {
			if parsed, err := url.Parse(expand(u)); err != nil || parsed.Scheme == "" {
				errs = append(errs, field.Invalid(p.Child("uris").Index(j), u, "must be an absolute URI, e.g. spiffe://cluster.local/node/"+NodeNameVariable))
			}
		}
		seen := map[string]bool{}
		for j, u := range cr.Usages {
			switch {
			case !keyUsages[certv1.KeyUsage(u)]:
				errs = append(errs, field.Invalid(p.Child("usages").Index(j), u, "not a certificates.k8s.io/v1 key usage (e.g. \"digital signature\", \"client auth\", \"server auth\")"))
			case seen[u]:
				errs = append(errs, field.Duplicate(p.Child("usages").Index(j), u))
			}
			seen[u] = true
		}
		o, op := cr.Output, p.Child("output")
		if !filepath.IsAbs(o.Dir) {
			errs = append(errs, field.Invalid(op.Child("dir"), o.Dir, "must be an absolute path"))
		} else {
			takeDir(o.Dir, op.Child("dir"))
		}
		files := map[string]bool{}
		for _, f := range []struct{ name, v string }{{"bundleFile", o.BundleFile}, {"keyFile", o.KeyFile}, {"chainFile", o.ChainFile}} {
			if f.v == "" {
				continue
			}
			if !plainName(f.v) {
				errs = append(errs, field.Invalid(op.Child(f.name), f.v, "must be a plain file name not starting with .."))
			} else if files[f.v] {
				errs = append(errs, field.Duplicate(op.Child(f.name), f.v))
			}
			files[f.v] = true
		}
		if (o.KeyFile == "") != (o.ChainFile == "") {
			errs = append(errs, field.Required(op.Child("chainFile"), "keyFile and chainFile go together"))
		}
		errs = append(errs, validateFileOwner(o.Mode, o.UID, o.GID, op)...)
	}
	trustNames := map[string]bool{}
	for i, t := range c.Trust {
		p := field.NewPath("trust").Index(i)
		switch {
		case len(t.Name) > 63 || !storeNameRE.MatchString(t.Name):
			errs = append(errs, field.Invalid(p.Child("name"), t.Name, "must be a DNS label: lower case letters, digits and '-', at most 63"))
		case trustNames[t.Name]:
			errs = append(errs, field.Duplicate(p.Child("name"), t.Name))
		}
		trustNames[t.Name] = true
		switch {
		case t.ClusterTrustBundleName == "" && t.SignerName == "":
			errs = append(errs, field.Required(p.Child("signerName"), "a signer name or a clusterTrustBundleName"))
		case t.ClusterTrustBundleName != "" && t.SignerName != "":
			errs = append(errs, field.Forbidden(p.Child("signerName"), "exclusive with clusterTrustBundleName"))
		case t.SignerName != "":
			errs = append(errs, validateSignerName(t.SignerName, p.Child("signerName"))...)
		case t.Version != "" || t.NodeLabel != "":
			errs = append(errs, field.Forbidden(p.Child("version"), "version and nodeLabel apply only with signerName"))
		}
		if t.Version != "" && t.Version != v1alpha1.BundleCanary && t.Version != v1alpha1.BundleLive {
			errs = append(errs, field.NotSupported(p.Child("version"), t.Version, []string{v1alpha1.BundleCanary, v1alpha1.BundleLive}))
		}
		if t.NodeLabel != "" {
			for _, msg := range validation.IsQualifiedName(t.NodeLabel) {
				errs = append(errs, field.Invalid(p.Child("nodeLabel"), t.NodeLabel, msg))
			}
		}
		if !filepath.IsAbs(t.Dir) {
			errs = append(errs, field.Invalid(p.Child("dir"), t.Dir, "must be an absolute path"))
		} else {
			takeDir(t.Dir, p.Child("dir"))
		}
		if !plainName(t.File) {
			errs = append(errs, field.Invalid(p.Child("file"), t.File, "must be a plain file name not starting with .."))
		}
		errs = append(errs, validateFileOwner(t.Mode, t.UID, t.GID, p)...)
		for j, a := range t.OnChange {
			if a == "" {
				errs = append(errs, field.Invalid(p.Child("onChange").Index(j), a, "must not be empty"))
			}
		}
		if t.OnChangeTimeout.Duration < 0 {
			errs = append(errs, field.Invalid(p.Child("onChangeTimeout"), t.OnChangeTimeout.String(), "must be positive"))
		}
		if t.OnChangeDebounce.Duration < 0 {
			errs = append(errs, field.Invalid(p.Child("onChangeDebounce"), t.OnChangeDebounce.String(), "must be positive"))
		}
		if t.MaxCertificates < 0 {
			errs = append(errs, field.Invalid(p.Child("maxCertificates"), t.MaxCertificates, "must be positive"))
		}
		if t.MaxBytes < 0 {
			errs = append(errs, field.Invalid(p.Child("maxBytes"), t.MaxBytes, "must be positive"))
		}
		prefix := trust.BundlePrefix(t.SignerName)
		for j, n := range t.AdditionalBundleNames {
			switch {
			case t.SignerName == "":
				errs = append(errs, field.Forbidden(p.Child("additionalBundleNames"), "applies only with signerName"))
			case !strings.HasPrefix(n, prefix) || n == prefix:
				errs = append(errs, field.Invalid(p.Child("additionalBundleNames").Index(j), n, "must start with "+prefix+" (the apiserver admits no other name for the signer's bundles)"))
			}
		}
	}
	return errs.ToAggregate()
}

func plainName(n string) bool {
	return n != "" && !strings.ContainsRune(n, '/') && !strings.HasPrefix(n, "..")
}

func validateSignerName(s string, p *field.Path) field.ErrorList {
	switch {
	case s == "":
		return field.ErrorList{field.Required(p, "")}
	case !signername.Valid(s):
		return field.ErrorList{field.Invalid(p, s, "must be <domain>/<path>, e.g. keyward.dev/node-daemon")}
	}
	return nil
}

func validateKeyType(k string, p *field.Path) field.ErrorList {
	for _, t := range keyTypes {
		if k == t {
			return nil
		}
	}
	return field.ErrorList{field.NotSupported(p, k, keyTypes)}
}

func validateExpiration(e *int32, p *field.Path) field.ErrorList {
	if e != nil && *e < MinExpirationSeconds {
		return field.ErrorList{field.Invalid(p, *e, fmt.Sprintf("must be at least %d (kube-apiserver's minimum)", MinExpirationSeconds))}
	}
	return nil
}

func validateAddress(a string, p *field.Path) field.ErrorList {
	if a == Disabled {
		return nil
	}
	if _, port, err := net.SplitHostPort(a); err != nil || port == "" {
		return field.ErrorList{field.Invalid(p, a, `must be host:port (":0" picks a port) or "-" to disable`)}
	}
	return nil
}

func validateFileOwner(mode *int32, uid, gid *int, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	if mode != nil && (*mode <= 0 || *mode > 0o777) {
		errs = append(errs, field.Invalid(p.Child("mode"), fmt.Sprintf("%#o", *mode), "must be a file mode between 0001 and 0777 (YAML: 0600 or 384)"))
	}
	for _, f := range []struct {
		name string
		v    *int
	}{{"uid", uid}, {"gid", gid}} {
		if f.v != nil && *f.v < 0 {
			errs = append(errs, field.Invalid(p.Child(f.name), *f.v, "must not be negative (leave it out to keep the owner)"))
		}
	}
	return errs
}
