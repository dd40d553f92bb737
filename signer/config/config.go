// Package config is keyward's signer configuration file: a versioned,
// strictly decoded YAML document (apiVersion keyward.dev/v1alpha1, kind
// SignerConfiguration). Unknown fields are errors that name the field;
// validation errors name the field path.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/keyward/keyward/internal/signername"
	"github.com/keyward/keyward/internal/strictyaml"
)

const (
	APIVersion = "keyward.dev/v1alpha1"
	Kind       = "SignerConfiguration"
)

// Profiles a signer name can use.
const (
	ProfilePodIdentity = "podIdentity"
	ProfileSPIFFE      = "spiffe"
	ProfileServer      = "server"
)

// Profiles for CertificateSigningRequests (certificates.k8s.io/v1). The
// three kubernetes.io profiles serve exactly their signer name (KEP-1513's
// rules, hand the name over from kube-controller-manager first); csr serves
// a custom signer name under the rules of signers[].csr.
const (
	ProfileKubeAPIServerClient        = "kubeAPIServerClient"        // kubernetes.io/kube-apiserver-client
	ProfileKubeAPIServerClientKubelet = "kubeAPIServerClientKubelet" // kubernetes.io/kube-apiserver-client-kubelet
	ProfileKubeletServing             = "kubeletServing"             // kubernetes.io/kubelet-serving
	ProfileCSR                        = "csr"
)

// KubernetesSignerNames maps each kubernetes.io profile to the one signer
// name it serves.
var KubernetesSignerNames = map[string]string{
	ProfileKubeAPIServerClient:        "kubernetes.io/kube-apiserver-client",
	ProfileKubeAPIServerClientKubelet: "kubernetes.io/kube-apiserver-client-kubelet",
	ProfileKubeletServing:             "kubernetes.io/kubelet-serving",
}

// IsCSRProfile reports whether a profile serves CertificateSigningRequests
// (the others serve PodCertificateRequests).
func IsCSRProfile(p string) bool {
	_, k8s := KubernetesSignerNames[p]
	return k8s || p == ProfileCSR
}

// Key types kube-apiserver accepts in a PodCertificateRequest.
var apiserverKeyTypes = []string{"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"}

// AllKeyTypes lists every subject key type a PodCertificateRequest may carry.
func AllKeyTypes() []string { return slices.Clone(apiserverKeyTypes) }

// SignerConfiguration is the whole file.
type SignerConfiguration struct {
	// APIVersion is keyward.dev/v1alpha1.
	APIVersion string `json:"apiVersion"`
	// Kind is SignerConfiguration.
	Kind string `json:"kind"`

	// KubeClient says how to reach the apiserver.
	KubeClient KubeClient `json:"kubeClient,omitempty"`
	// Workers is the number of requests handled at once (default 4). Each
	// worker waits for one CA-key signature at a time, so size it to the
	// peak issuance rate times the key's signing latency, doubled for the
	// status write: a KMS key answering in 20 ms at 400 PCRs/s wants 16
	// (docs/benchmarks.md measures this rule).
	Workers int `json:"workers,omitempty"`
	// MetricsAddress serves /metrics (default :9090).
	MetricsAddress string `json:"metricsAddress,omitempty"`
	// HealthAddress serves /healthz and /readyz (default :9091).
	HealthAddress string `json:"healthAddress,omitempty"`
	// LeaderElection makes one replica active through a Lease.
	LeaderElection LeaderElection `json:"leaderElection,omitempty"`
	// FailAfter turns an outage of a signer's CA key that has lasted this
	// long (from its first failed signature; the next success ends it) into
	// Failed/SignerUnavailable for the requests that meet it. Zero (the
	// default) never does: kubelet treats Failed as permanent.
	FailAfter metav1.Duration `json:"failAfter,omitempty"`
	// Backends tunes the key backends (session pools, KMS endpoints and
	// timeouts).
	Backends Backends `json:"backends,omitempty"`
	// Events says which Kubernetes Events the signer records.
	Events Events `json:"events,omitempty"`
	// Profiling serves Go's pprof handlers under /debug/pprof/ on the
	// metrics address (default false), like Kubernetes' --profiling.
	Profiling bool `json:"profiling,omitempty"`
	// PodCertificateRequestVersion is the certificates.k8s.io version
	// PodCertificateRequests are read through: "v1" or "v1beta1". Empty
	// (the default) reads v1beta1 while the cluster serves it, since only
	// v1beta1 shows the pkixPublicKey requests of kubelets older than 1.37,
	// and v1 otherwise. Set "v1" once every kubelet is 1.37 or newer:
	// through v1beta1, kube-apiserver converts every watch event and
	// status write (docs/benchmarks.md says what that was seen to cost).
	// A version the cluster does not serve stops the start with an error.
	PodCertificateRequestVersion string `json:"podCertificateRequestVersion,omitempty"`
	// TrustPublisher runs the rotation controller and ClusterTrustBundle
	// publisher (trustpublisher/) for the configured signer names in this
	// process, under the same Lease (default enabled). Disable it only when
	// another deployment publishes for these names.
	TrustPublisher TrustPublisher `json:"trustPublisher,omitempty"`
	// Signers are the signer names served and the policy of each; at least
	// one.
	Signers []Signer `json:"signers"`
}

// TrustPublisher configures the trust publisher run inside the signer.
type TrustPublisher struct {
	// Enabled runs the trust publisher (default true).
	Enabled *bool `json:"enabled,omitempty"`
	// KubeletSyncFrequency is the longest syncFrequency of the cluster's
	// kubelets (kubelet's default 1m). A running pod's projected
	// clusterTrustBundle file changes only at its pod's next sync: up to
	// about 1.5× this plus 30s after the bundle does (69–89s were measured
	// at 1m). An Authority whose propagationWindow is shorter gets
	// condition PropagationWindowSafe=False and a Warning Event (default
	// 1m; docs/rotation.md, "Why the window is 5 minutes").
	KubeletSyncFrequency metav1.Duration `json:"kubeletSyncFrequency,omitempty"`
}

// DefaultKubeletSyncFrequency is kubelet's own default syncFrequency.
const DefaultKubeletSyncFrequency = time.Minute

// Default fills the defaults of a trust publisher's configuration.
func (t *TrustPublisher) Default() {
	if t.Enabled == nil {
		on := true
		t.Enabled = &on
	}
	if t.KubeletSyncFrequency.Duration == 0 {
		t.KubeletSyncFrequency.Duration = DefaultKubeletSyncFrequency
	}
}

// Validate reports the trust publisher's problems under path.
func (t *TrustPublisher) Validate(path *field.Path) field.ErrorList {
	if t.KubeletSyncFrequency.Duration < 0 {
		return field.ErrorList{field.Invalid(path.Child("kubeletSyncFrequency"), t.KubeletSyncFrequency.Duration.String(), "must not be negative")}
	}
	return nil
}

// KubeClient says how to reach the apiserver.
type KubeClient struct {
	// Kubeconfig is a kubeconfig path; empty means in-cluster.
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// QPS bounds the requests per second to the apiserver (signer default
	// 50, token service 300).
	QPS float32 `json:"qps,omitempty"`
	// Burst is the QPS limit's burst (signer default 100, token service
	// 600).
	Burst int `json:"burst,omitempty"`
}

// Events says which Kubernetes Events the signer records. Warnings
// (denials, failures, delays, refused writes) are always recorded; Events
// beyond the rate are dropped and counted in keyward_events_dropped_total.
type Events struct {
	// Issued records a Normal Event for every issued certificate. Default
	// false: at thousands of issuances the audit log line, the metrics and
	// the request's own Issued condition are the record.
	Issued bool `json:"issued,omitempty"`
	// PerSecond bounds the Events of each type (Warning, Normal) recorded
	// per second, with a burst of ten seconds' worth (default 10). Events
	// have their own API client, so they never take issuance's QPS.
	PerSecond float64 `json:"perSecond,omitempty"`
}

// DefaultEventsPerSecond is Events.PerSecond's default.
const DefaultEventsPerSecond = 10

// The signer's leader election defaults.
const (
	DefaultLeaseDuration = time.Second
	DefaultRenewDeadline = 750 * time.Millisecond
	DefaultRetryPeriod   = 200 * time.Millisecond
)

// Validate checks the Lease's timing: leaseDuration > renewDeadline >
// retryPeriod > 0, and leaseDuration in whole seconds, which is all a Lease
// record holds (client-go writes leaseDurationSeconds rounded down, and a
// standby waits that long): 1500ms would be a 1 s Lease, shorter than a
// 1 s renewDeadline, and the signer's fence would no longer keep a deposed
// leader from signing.
func (le LeaderElection) Validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	d := le.LeaseDuration.Duration
	if !(d > le.RenewDeadline.Duration && le.RenewDeadline.Duration > le.RetryPeriod.Duration && le.RetryPeriod.Duration > 0) {
		errs = append(errs, field.Invalid(p, fmt.Sprintf("%s/%s/%s", d, le.RenewDeadline.Duration, le.RetryPeriod.Duration),
			"need leaseDuration > renewDeadline > retryPeriod > 0"))
	}
	if d%time.Second != 0 {
		errs = append(errs, field.Invalid(p.Child("leaseDuration"), d.String(),
			"must be whole seconds (a Lease records leaseDurationSeconds; a standby would wait only "+d.Truncate(time.Second).String()+")"))
	}
	return errs
}

// LeaderElection configures the Lease that makes one replica active.
type LeaderElection struct {
	// Enabled turns leader election on (default true); off, every replica
	// acts.
	Enabled *bool `json:"enabled,omitempty"`
	// Namespace is the Lease's namespace (default keyward).
	Namespace string `json:"namespace,omitempty"`
	// LeaseName is the Lease's name (default keyward-signer; the token
	// service's keyward-token-service).
	LeaseName string `json:"leaseName,omitempty"`
	// LeaseDuration is how long a lease is valid without renewal: a
	// standby takes over this long after the leader's last renewal
	// (whole seconds; default 1s for the signer, 15s for the token service).
	LeaseDuration metav1.Duration `json:"leaseDuration,omitempty"`
	// RenewDeadline is how long the leader retries renewing before it gives
	// up leading; the signer signs nothing later than this after its last
	// successful renewal was sent (default 750ms for the signer, 10s for
	// the token service).
	RenewDeadline metav1.Duration `json:"renewDeadline,omitempty"`
	// RetryPeriod is the wait between attempts to acquire or renew (default
	// 200ms for the signer, 2s for the token service).
	RetryPeriod metav1.Duration `json:"retryPeriod,omitempty"`
}

// Signer is the policy for one signer name. Its CA generations are not
// here: they live in the Authority object (keyward.dev/v1alpha1) that
// names the signer (docs/rotation.md).
type Signer struct {
	// Name is the signer name, <domain>/<path> (e.g.
	// keyward.dev/pod-identity); names in kubernetes.io and k8s.io are
	// reserved except the three kubernetes.io CSR profiles' own.
	Name string `json:"name"`
	// Profile is what the name issues: podIdentity, spiffe or server
	// (PodCertificateRequests), kubeAPIServerClient,
	// kubeAPIServerClientKubelet, kubeletServing or csr
	// (CertificateSigningRequests).
	Profile string `json:"profile"`
	// PodIdentity applies to the podIdentity profile.
	PodIdentity *PodIdentity `json:"podIdentity,omitempty"`
	// SPIFFE applies to the spiffe profile.
	SPIFFE *SPIFFE `json:"spiffe,omitempty"`
	// Server applies to the server profile.
	Server *Server `json:"server,omitempty"`
	// AllowedKeyTypes are the subject key types issued; others are Denied
	// with UnsupportedKeyType. Default: every type the apiserver accepts.
	AllowedKeyTypes []string `json:"allowedKeyTypes,omitempty"`
	// MaxLifetime caps a certificate's lifetime (default 24h). At least 1h
	// for PodCertificateRequest profiles, the apiserver's minimum there;
	// at least 2m for CertificateSigningRequest profiles, whose certificates
	// the apiserver takes at any length (kubelet rotates its own at 70-90%
	// of theirs, so minutes show a rotation in a test).
	MaxLifetime metav1.Duration `json:"maxLifetime,omitempty"`
	// RefreshPoint is when kubelet should refresh, as a fraction of the
	// lifetime (default 0.5), clamped to [notBefore+10m, notAfter−10m].
	RefreshPoint *float64 `json:"refreshPoint,omitempty"`
	// Backdate moves notBefore into the past for clock skew (default 2m,
	// below the apiserver's 5m limit). It counts against the lifetime
	// (notAfter − notBefore is the lifetime); for CSR profiles it is at
	// most half the lifetime, so a 3m certificate is usable for 1m30s after
	// issuance (kube-controller-manager adds its backdate to short TTLs).
	Backdate *metav1.Duration `json:"backdate,omitempty"`
	// UnverifiedUserAnnotations are the annotation keys this signer reads;
	// a request carrying any other key is Denied.
	UnverifiedUserAnnotations []string `json:"unverifiedUserAnnotations,omitempty"`
	// RateLimits bound issuance per node and per namespace (default: a
	// per-node bucket of 5/s, burst 110, in delay mode).
	RateLimits RateLimits `json:"rateLimits,omitempty"`
	// CSR states and bounds what a custom CertificateSigningRequest signer
	// name issues (profile csr): KEP-1513's signer properties.
	CSR *CSRPolicy `json:"csr,omitempty"`
	// Approval configures `keyward approver` for this CSR signer name.
	// Without it, the approver leaves a csr name's CSRs alone; the two
	// kubelet names are approved under their built-in rules either way.
	Approval *Approval `json:"approval,omitempty"`
	// Intermediate, when enabled, signs this name's leaves with a
	// short-lived intermediate CA whose key exists only in the signing
	// replica's memory, so that the CA key in the HSM or KMS signs once
	// per intermediate instead of once per leaf (bursts above a KMS
	// quota). It trades the key's protection for that: docs/signer.md,
	// "In-memory intermediate". The Authority's CA must allow a CA below
	// it (`keyward ca init --path-len 1`).
	Intermediate *Intermediate `json:"intermediate,omitempty"`
}

// Intermediate is a signer name's opt-in in-memory intermediate CA: an
// ECDSA P-256 key generated in memory (never written to a file, a Secret
// or a log) and a certificate for it (pathLen 0, keyUsage certSign, bound
// to the replica by name) signed by the Active generation's CA key.
type Intermediate struct {
	// Enabled turns the intermediate on (default false).
	Enabled bool `json:"enabled,omitempty"`
	// Validity is how long each intermediate certificate lives (default
	// renewBefore + 6h, so that each is used for 6 hours). Someone who
	// reads the signer's memory can sign leaves with its key until it
	// expires.
	Validity metav1.Duration `json:"validity,omitempty"`
	// RenewBefore is how long before its notAfter an intermediate is
	// replaced by a new one (a new key). At least maxLifetime (the
	// default): every leaf fits inside the intermediate it is signed
	// under. When the CA key cannot sign a new one, the current
	// intermediate keeps issuing while it has maxLifetime left.
	RenewBefore metav1.Duration `json:"renewBefore,omitempty"`
}

// Validity's default exceeds RenewBefore by DefaultIntermediateUse; it must
// exceed it by at least MinIntermediateUse.
const (
	DefaultIntermediateUse = 6 * time.Hour
	MinIntermediateUse     = 10 * time.Minute
)

func (in *Intermediate) validate(p *field.Path, maxLifetime time.Duration) field.ErrorList {
	var errs field.ErrorList
	v, r := in.Validity.Duration, in.RenewBefore.Duration
	if v < 0 {
		errs = append(errs, field.Invalid(p.Child("validity"), v.String(), "must not be negative"))
	}
	if r < 0 {
		errs = append(errs, field.Invalid(p.Child("renewBefore"), r.String(), "must not be negative"))
	}
	if !in.Enabled || len(errs) > 0 {
		return errs
	}
	if r < maxLifetime {
		errs = append(errs, field.Invalid(p.Child("renewBefore"), r.String(),
			fmt.Sprintf("must be at least maxLifetime (%s): a leaf must end before the intermediate it is signed under", maxLifetime)))
	} else if v < r+MinIntermediateUse {
		errs = append(errs, field.Invalid(p.Child("validity"), v.String(),
			fmt.Sprintf("must exceed renewBefore (%s) by at least %s: an intermediate is used from its start until renewBefore before its end", r, MinIntermediateUse)))
	}
	return errs
}

// CSRPolicy is what a custom CSR signer name issues: the seven properties
// KEP-1513 asks every signer to document, as rules the signer enforces. A
// CSR outside them is marked Failed with the rule named.
type CSRPolicy struct {
	// TrustDistribution says how relying parties get the CA (property 1),
	// e.g. "ClusterTrustBundle keyward.dev:node-daemons:live".
	TrustDistribution string `json:"trustDistribution"`
	// CommonNames are patterns the subject CN must match (property 2); a
	// leading "*." matches one DNS label, "*" alone any CN. Empty: no CN.
	CommonNames []string `json:"commonNames,omitempty"`
	// Organizations the subject may carry (exact); none other is allowed.
	Organizations []string `json:"organizations,omitempty"`
	// DNSNames are patterns each DNS SAN must match (property 3: SAN is
	// the only extension a request may ask for).
	DNSNames []string `json:"dnsNames,omitempty"`
	// IPRanges are CIDRs each IP SAN must lie in.
	IPRanges []string `json:"ipRanges,omitempty"`
	// URIs are patterns each URI SAN must match: exact, or ending in "/*"
	// for one or more plain path segments (no empty, "." or ".." segment,
	// no query, fragment, userinfo or %-escape).
	URIs []string `json:"uris,omitempty"`
	// KeyUsages are the certificates.k8s.io usages a request may ask for
	// (property 4), e.g. ["digital signature", "client auth"]; a request
	// asking for another is Failed.
	KeyUsages []string `json:"keyUsages"`
	// Lifetime is min(maxLifetime, spec.expirationSeconds) (property 5);
	// the CA bit is never set (property 6); status.certificate holds the
	// leaf, then the issuers up to (not including) the root (property 7).
}

// Approval says which CSRs `keyward approver` approves for a signer name;
// every other CSR for it is Denied with the rule it broke. kubernetes.io
// names have built-in rules (docs/signers.md); these fields add to them.
type Approval struct {
	// Users and Groups may request (profile csr; deny by default).
	Users []string `json:"users,omitempty"`
	// Groups: see Users.
	Groups []string `json:"groups,omitempty"`
	// AllowedDNSSuffixes (profile kubeletServing) are the suffixes a
	// serving certificate's DNS SAN may have below the node's name: a
	// DNS SAN is approved only as the node's name or <node>.<suffix>, the
	// node's name filling exactly one label. A kubeletServing name is
	// approved automatically only when it has an approval section.
	AllowedDNSSuffixes []string `json:"allowedDNSSuffixes,omitempty"`
	// AllowedIPRanges (profile kubeletServing, CIDRs): an IP SAN is
	// approved only inside one of them, when it is an InternalIP or
	// ExternalIP of the requesting Node and of no other Node, and the Node
	// no longer has taint node.cloudprovider.kubernetes.io/uninitialized.
	// Empty: no IP SAN is approved automatically. A node writes its own
	// addresses unless the node-address-lock admission policy is installed
	// (docs/approver.md, threat model).
	AllowedIPRanges []string `json:"allowedIPRanges,omitempty"`
	// NodeBound (profile csr) approves only requests from a node identity
	// (system:node:<name>, group system:nodes) for names of that node:
	// the subject CN and every DNS SAN are <name>.<suffix> for a pattern
	// *.<suffix> they match, the name filling the * as exactly one label;
	// every URI SAN is <prefix><name> or <prefix><name>/<path> for a
	// pattern <prefix>*; every IP SAN is an address of that Node and of
	// no other. Without it, any allowed requester may ask for any name the
	// csr rules permit, so one node could obtain another node's
	// certificate.
	NodeBound bool `json:"nodeBound,omitempty"`
}

// PodIdentity configures the podIdentity profile.
type PodIdentity struct {
	// Critical marks the PodIdentity extension critical. Default false:
	// KEP-4317 asks for a critical extension only on certificates for
	// kube-apiserver's own kube-apiserver-client-pod authentication, which
	// v1.37 does not implement, and TLS stacks that do not know the
	// extension (openssl, Envoy, Java, Go's x509.Verify) reject a leaf that
	// carries it critical.
	Critical bool `json:"critical,omitempty"`
}

// SPIFFE configures the spiffe profile.
type SPIFFE struct {
	// TrustDomain is the SPIFFE trust domain of the issued
	// spiffe://<trustDomain>/ns/<namespace>/sa/<serviceAccount> IDs.
	TrustDomain string `json:"trustDomain"`
}

// Server configures the server profile.
type Server struct {
	// DNSNamesAnnotation is the unverifiedUserAnnotations key that carries a
	// comma-separated list of DNS names (default keyward.dev/dns-names).
	DNSNamesAnnotation string `json:"dnsNamesAnnotation,omitempty"`
	// AllowedDNSNames are patterns a requested name must match exactly,
	// after substituting {namespace}, {serviceAccount} and {podName}; a
	// leading "*." matches one DNS label.
	AllowedDNSNames []string `json:"allowedDNSNames"`
}

// RateLimits bound issuance per node and per namespace.
type RateLimits struct {
	// PerNode is a token bucket per requesting node (spec.nodeName).
	// Default (when onLimit is delay): qps 5, burst 110 (kubelet's default
	// maxPods, so a node starting full gets its certificates at once), so
	// one node cannot take the signer (or a cloud KMS's signing quota)
	// from the others. Size it in docs/signer.md.
	PerNode *Rate `json:"perNode,omitempty"`
	// PerNamespace is a token bucket per namespace.
	PerNamespace *Rate `json:"perNamespace,omitempty"`
	// OnLimit is "delay" (default: requeue until a token is free) or "deny"
	// (Denied with reason RateLimited: kubelet treats Denied as permanent
	// and the pod never starts). With deny, perNode has no default.
	OnLimit string `json:"onLimit,omitempty"`
}

// Rate is a token bucket.
type Rate struct {
	// QPS is the rate tokens are added, per second (positive).
	QPS float64 `json:"qps"`
	// Burst is the bucket size (at least 1).
	Burst int `json:"burst"`
}

// Defaults applied by Load.
const (
	DefaultWorkers = 4
	// DefaultPerNodeQPS and DefaultPerNodeBurst are rateLimits.perNode
	// when the configuration is silent (and onLimit is delay).
	DefaultPerNodeQPS   = 5
	DefaultPerNodeBurst = 110
	DefaultRefreshPoint = 0.5
	DefaultBackdate     = 2 * time.Minute
	DefaultMaxLifetime  = 24 * time.Hour
	DefaultDNSNamesKey  = "keyward.dev/dns-names"
	MinLifetime         = time.Hour
	MinCSRLifetime      = 2 * time.Minute
	MaxBackdate         = 5 * time.Minute
)

// WorkersFor is the sizing rule of the workers field: enough workers that
// peakPerSecond requests can each wait signLatency for the CA key with the
// status write on top (twice peak × latency), never fewer than the default.
func WorkersFor(peakPerSecond float64, signLatency time.Duration) int {
	return max(DefaultWorkers, int(math.Ceil(2*peakPerSecond*signLatency.Seconds())))
}

// Load reads, strictly decodes, defaults and validates a configuration file.
func Load(path string) (*SignerConfiguration, error) {
	return strictyaml.LoadFile(path, "signer", Parse)
}

// Parse decodes (unknown and duplicate fields are errors that give the
// field's path, field names are case-sensitive), defaults and validates data.
func Parse(data []byte) (*SignerConfiguration, error) {
	var cfg SignerConfiguration
	if err := strictyaml.Decode(data, &cfg, removedCA); err != nil {
		return nil, err
	}
	cfg.Default()
	if errs := cfg.Validate(); len(errs) > 0 {
		return nil, errs.ToAggregate()
	}
	return &cfg, nil
}

// Default fills in every unset field.
func (c *SignerConfiguration) Default() {
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.KubeClient.QPS == 0 {
		c.KubeClient.QPS = 50
	}
	if c.KubeClient.Burst == 0 {
		c.KubeClient.Burst = 100
	}
	if c.Events.PerSecond == 0 {
		c.Events.PerSecond = DefaultEventsPerSecond
	}
	if c.MetricsAddress == "" {
		c.MetricsAddress = ":9090"
	}
	if c.HealthAddress == "" {
		c.HealthAddress = ":9091"
	}
	c.TrustPublisher.Default()
	le := &c.LeaderElection
	if le.Enabled == nil {
		t := true
		le.Enabled = &t
	}
	if le.Namespace == "" {
		le.Namespace = "keyward"
	}
	if le.LeaseName == "" {
		le.LeaseName = "keyward-signer"
	}
	// A short Lease: failover in about a second after a leader dies
	// (docs/signer.md, "High availability"). The fence (kubeclient.Fence)
	// keeps a leader that cannot renew from signing past renewDeadline.
	if le.LeaseDuration.Duration == 0 {
		le.LeaseDuration.Duration = DefaultLeaseDuration
	}
	if le.RenewDeadline.Duration == 0 {
		le.RenewDeadline.Duration = DefaultRenewDeadline
	}
	if le.RetryPeriod.Duration == 0 {
		le.RetryPeriod.Duration = DefaultRetryPeriod
	}
	for i := range c.Signers {
		s := &c.Signers[i]
		if len(s.AllowedKeyTypes) == 0 {
			s.AllowedKeyTypes = AllKeyTypes()
		}
		if s.MaxLifetime.Duration == 0 {
			s.MaxLifetime.Duration = DefaultMaxLifetime
		}
		if s.RefreshPoint == nil {
			r := DefaultRefreshPoint
			s.RefreshPoint = &r
		}
		if s.Backdate == nil {
			s.Backdate = &metav1.Duration{Duration: DefaultBackdate}
		}
		if s.Server != nil && s.Server.DNSNamesAnnotation == "" {
			s.Server.DNSNamesAnnotation = DefaultDNSNamesKey
		}
		if s.RateLimits.OnLimit == "" {
			s.RateLimits.OnLimit = "delay"
		}
		if in := s.Intermediate; in != nil {
			if in.RenewBefore.Duration == 0 {
				in.RenewBefore.Duration = s.MaxLifetime.Duration
			}
			if in.Validity.Duration == 0 {
				in.Validity.Duration = in.RenewBefore.Duration + DefaultIntermediateUse
			}
		}
		// The default bucket only ever delays: a Denied PCR is permanent
		// for kubelet.
		if s.RateLimits.PerNode == nil && s.RateLimits.OnLimit == "delay" {
			s.RateLimits.PerNode = &Rate{QPS: DefaultPerNodeQPS, Burst: DefaultPerNodeBurst}
		}
	}
}

// ValidSignerName reports whether s has a signer name's form,
// <domain>/<path> (e.g. keyward.dev/pod-identity): signername.Valid, which
// the node helper uses too.
func ValidSignerName(s string) bool { return signername.Valid(s) }

var (
	trustDomainRE   = regexp.MustCompile(`^[a-z0-9._-]+$`)
	annotationKeyRE = regexp.MustCompile(`^([a-z0-9.-]+/)?[A-Za-z0-9][-A-Za-z0-9_.]*$`)
	placeholderRE   = regexp.MustCompile(`\{[^}]*\}`)
)

func reservedDomain(d string) bool {
	return d == "kubernetes.io" || strings.HasSuffix(d, ".kubernetes.io") || d == "k8s.io" || strings.HasSuffix(d, ".k8s.io")
}

// Validate checks the whole configuration and reports every problem with
// its field path.
func (c *SignerConfiguration) Validate() field.ErrorList {
	errs := strictyaml.CheckTypeMeta(c.APIVersion, c.Kind, APIVersion, Kind)
	if c.Workers < 1 {
		errs = append(errs, field.Invalid(field.NewPath("workers"), c.Workers, "must be at least 1"))
	}
	if c.KubeClient.QPS < 0 || c.KubeClient.Burst < 0 {
		errs = append(errs, field.Invalid(field.NewPath("kubeClient"), c.KubeClient, "qps and burst must not be negative"))
	}
	if v := c.PodCertificateRequestVersion; v != "" && v != "v1" && v != "v1beta1" {
		errs = append(errs, field.NotSupported(field.NewPath("podCertificateRequestVersion"), v, []string{"v1", "v1beta1"}))
	}
	if c.Events.PerSecond < 0 {
		errs = append(errs, field.Invalid(field.NewPath("events", "perSecond"), c.Events.PerSecond, "must not be negative"))
	}
	errs = append(errs, c.TrustPublisher.Validate(field.NewPath("trustPublisher"))...)
	if c.FailAfter.Duration < 0 {
		errs = append(errs, field.Invalid(field.NewPath("failAfter"), c.FailAfter.Duration.String(), "must not be negative"))
	}
	errs = append(errs, c.Backends.validate(field.NewPath("backends"))...)
	errs = append(errs, c.LeaderElection.Validate(field.NewPath("leaderElection"))...)
	sp := field.NewPath("signers")
	if len(c.Signers) == 0 {
		errs = append(errs, field.Required(sp, "at least one signer name"))
	}
	seen := map[string]bool{}
	for i := range c.Signers {
		p := sp.Index(i)
		s := &c.Signers[i]
		if seen[s.Name] {
			errs = append(errs, field.Duplicate(p.Child("name"), s.Name))
		}
		seen[s.Name] = true
		errs = append(errs, s.validate(p)...)
	}
	return errs
}

func (s *Signer) validate(p *field.Path) field.ErrorList {
	var errs field.ErrorList
	domain, _, _ := strings.Cut(s.Name, "/")
	switch {
	case !signername.Valid(s.Name):
		errs = append(errs, field.Invalid(p.Child("name"), s.Name, "must be <domain>/<path>, e.g. keyward.dev/pod-identity"))
	case reservedDomain(domain) && KubernetesSignerNames[s.Profile] != s.Name:
		errs = append(errs, field.Invalid(p.Child("name"), s.Name, "signer names in the kubernetes.io and k8s.io domains are reserved, except the three a CSR profile serves (kubeAPIServerClient, kubeAPIServerClientKubelet, kubeletServing)"))
	}
	if want, ok := KubernetesSignerNames[s.Profile]; ok && s.Name != want {
		errs = append(errs, field.Invalid(p.Child("name"), s.Name, fmt.Sprintf("profile %s serves exactly %s", s.Profile, want)))
	}
	if s.PodIdentity != nil && s.Profile != ProfilePodIdentity {
		errs = append(errs, field.Invalid(p.Child("podIdentity"), *s.PodIdentity, "applies only to profile "+ProfilePodIdentity))
	}
	switch s.Profile {
	case ProfilePodIdentity:
	case ProfileSPIFFE:
		if s.SPIFFE == nil || !trustDomainRE.MatchString(s.SPIFFE.TrustDomain) {
			errs = append(errs, field.Required(p.Child("spiffe", "trustDomain"), "a trust domain of lowercase letters, digits, '.', '-', '_'"))
		}
	case ProfileServer:
		if s.Server == nil || len(s.Server.AllowedDNSNames) == 0 {
			errs = append(errs, field.Required(p.Child("server", "allowedDNSNames"), "at least one pattern, e.g. {serviceAccount}.{namespace}.svc"))
		} else {
			if !slices.Contains(s.UnverifiedUserAnnotations, s.Server.DNSNamesAnnotation) {
				errs = append(errs, field.Invalid(p.Child("unverifiedUserAnnotations"), s.UnverifiedUserAnnotations,
					fmt.Sprintf("must list %q, the server profile's DNS names annotation", s.Server.DNSNamesAnnotation)))
			}
			for j, pat := range s.Server.AllowedDNSNames {
				if err := checkPattern(pat); err != nil {
					errs = append(errs, field.Invalid(p.Child("server", "allowedDNSNames").Index(j), pat, err.Error()))
				}
			}
		}
	case ProfileKubeAPIServerClient, ProfileKubeAPIServerClientKubelet, ProfileKubeletServing:
	case ProfileCSR:
		if s.CSR == nil {
			errs = append(errs, field.Required(p.Child("csr"), "profile csr states its rules in csr (trustDistribution, keyUsages, subjects, SANs)"))
		} else {
			errs = append(errs, s.CSR.validate(p.Child("csr"))...)
		}
	default:
		errs = append(errs, field.NotSupported(p.Child("profile"), s.Profile, []string{ProfilePodIdentity, ProfileSPIFFE, ProfileServer,
			ProfileKubeAPIServerClient, ProfileKubeAPIServerClientKubelet, ProfileKubeletServing, ProfileCSR}))
	}
	if s.CSR != nil && s.Profile != ProfileCSR {
		errs = append(errs, field.Invalid(p.Child("csr"), "…", "applies only to profile "+ProfileCSR))
	}
	if s.Approval != nil && !IsCSRProfile(s.Profile) {
		errs = append(errs, field.Invalid(p.Child("approval"), "…", "applies only to CertificateSigningRequest profiles"))
	} else {
		errs = append(errs, validateApproval(s.Approval, s.Profile, s.CSR, p)...)
	}
	for j, kt := range s.AllowedKeyTypes {
		if !slices.Contains(apiserverKeyTypes, kt) {
			errs = append(errs, field.NotSupported(p.Child("allowedKeyTypes").Index(j), kt, apiserverKeyTypes))
		}
	}
	if IsCSRProfile(s.Profile) {
		if s.MaxLifetime.Duration < MinCSRLifetime {
			errs = append(errs, field.Invalid(p.Child("maxLifetime"), s.MaxLifetime.Duration.String(), "must be at least 2m for a CertificateSigningRequest profile"))
		}
	} else if s.MaxLifetime.Duration < MinLifetime {
		errs = append(errs, field.Invalid(p.Child("maxLifetime"), s.MaxLifetime.Duration.String(), "must be at least 1h (the apiserver refuses PodCertificateRequest certificates shorter than 1h)"))
	}
	if r := *s.RefreshPoint; !(r > 0 && r < 1) {
		errs = append(errs, field.Invalid(p.Child("refreshPoint"), r, "must be a fraction of the lifetime, in (0, 1)"))
	}
	if b := s.Backdate.Duration; b < 0 || b >= MaxBackdate {
		errs = append(errs, field.Invalid(p.Child("backdate"), b.String(), "must be in [0, 5m): the apiserver refuses a notBefore more than 5 minutes from its clock"))
	}
	for j, k := range s.UnverifiedUserAnnotations {
		if !annotationKeyRE.MatchString(k) {
			errs = append(errs, field.Invalid(p.Child("unverifiedUserAnnotations").Index(j), k, "not an annotation key"))
		}
	}
	rp := p.Child("rateLimits")
	for name, r := range map[string]*Rate{"perNode": s.RateLimits.PerNode, "perNamespace": s.RateLimits.PerNamespace} {
		if r != nil && (r.QPS <= 0 || r.Burst < 1) {
			errs = append(errs, field.Invalid(rp.Child(name), *r, "qps must be positive and burst at least 1"))
		}
	}
	if s.RateLimits.OnLimit != "delay" && s.RateLimits.OnLimit != "deny" {
		errs = append(errs, field.NotSupported(rp.Child("onLimit"), s.RateLimits.OnLimit, []string{"delay", "deny"}))
	}
	if s.Intermediate != nil {
		errs = append(errs, s.Intermediate.validate(p.Child("intermediate"), s.MaxLifetime.Duration)...)
	}
	return errs
}

// MigrationDoc is where the move of a removed ca: block is described.
const MigrationDoc = "docs/rotation.md#migrating-from-the-ca-block"

// ErrCABlockRemoved is matched (errors.Is) when a configuration still has
// a signers[].ca block.
var ErrCABlockRemoved = errors.New("the ca block was removed from the signer configuration")

// removedCA refuses a file that still has a signers[].ca block, with one
// error that names the field and says where its content goes now. The
// block is looked for before strict decoding so that it is not reported as
// just an unknown field.
func removedCA(js []byte) error {
	var loose struct {
		Signers []map[string]json.RawMessage `json:"signers"`
	}
	if json.Unmarshal(js, &loose) != nil {
		return nil // strict decoding reports it
	}
	var errs field.ErrorList
	for i, s := range loose.Signers {
		if _, ok := s["ca"]; ok {
			errs = append(errs, field.Forbidden(field.NewPath("signers").Index(i).Child("ca"), fmt.Sprintf(
				"%v: a signer's CA certificate and key now live in an Authority object (keyward.dev/v1alpha1), "+
					"the one source of truth every replica reads; move it there with `keyward ca import` and delete the block (%s)",
				ErrCABlockRemoved, MigrationDoc)))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return &caBlockError{errs.ToAggregate()}
}

// caBlockError is the refusal of a ca: block; it matches ErrCABlockRemoved.
type caBlockError struct{ err error }

func (e *caBlockError) Error() string        { return e.err.Error() }
func (e *caBlockError) Is(target error) bool { return target == ErrCABlockRemoved }

func checkPattern(p string) error {
	rest := strings.TrimPrefix(p, "*.")
	for _, ph := range placeholderRE.FindAllString(rest, -1) {
		if ph != "{namespace}" && ph != "{serviceAccount}" && ph != "{podName}" {
			return fmt.Errorf("unknown placeholder %s (known: {namespace}, {serviceAccount}, {podName})", ph)
		}
	}
	if strings.Contains(rest, "*") {
		return fmt.Errorf("only a leading \"*.\" wildcard is allowed")
	}
	return nil
}
