package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Phase is where a CA generation stands in a canary-then-live rotation
// (see docs/rotation.md for what each phase puts in which trust bundle).
// +kubebuilder:validation:Enum=Staged;Promoted;Active;Retiring;Retired
type Phase string

// The phases, in the order a generation moves through them.
const (
	// PhaseStaged: the generation's root is in the canary bundle only.
	PhaseStaged Phase = "Staged"
	// PhasePromoted: the root is in the canary and the live bundle.
	PhasePromoted Phase = "Promoted"
	// PhaseActive: the generation's key issues every new certificate.
	PhaseActive Phase = "Active"
	// PhaseRetiring: the root has left the canary bundle, still in live.
	PhaseRetiring Phase = "Retiring"
	// PhaseRetired: the root is in no bundle.
	PhaseRetired Phase = "Retired"
)

// Authority holds the CA generations of one signer name and reports where
// each stands in its rotation. It is cluster-scoped; one Authority per
// signer name.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=kwauth,categories=keyward
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Signer",type=string,JSONPath=`.spec.signerName`
// +kubebuilder:printcolumn:name="Active",type=string,JSONPath=`.status.generations[?(@.phase=="Active")].name`,description="The generation whose key issues, as observed"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.generations) || oldSelf.status.generations.all(s, !has(s.phase) || s.phase == 'Retired' || (has(self.spec.generations) && self.spec.generations.exists(g, g.name == s.name)))",message="a generation can be removed only after status shows it Retired: its root is still in a trust bundle"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.generations) || !has(oldSelf.spec.generations) || !has(self.spec.generations) || oldSelf.status.generations.all(s, !has(s.phase) || !(s.phase in ['Staged', 'Promoted', 'Active', 'Retiring']) || self.spec.generations.all(g, g.name != s.name || oldSelf.spec.generations.all(o, o.name != s.name || (g.keyURI == o.keyURI && g.certificatePEM == o.certificatePEM))))",message="the keyURI and certificatePEM of a generation whose root is in a trust bundle (status Staged, Promoted, Active or Retiring) cannot change: a new root is a new generation (add one; retire this one)"
type Authority struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec lists the signer's CA generations and the phase each should be in.
	// +required
	Spec AuthoritySpec `json:"spec"`

	// status reports, per generation, the phase the controller has reached
	// and what holds the next transition back. Written only by the controller.
	// +optional
	Status AuthorityStatus `json:"status,omitempty"`
}

// AuthoritySpec is the desired state of a signer's CA generations.
type AuthoritySpec struct {
	// signerName is the Kubernetes signer name (<domain>/<path>) whose
	// certificates these generations sign. It cannot be changed.
	// +required
	// +kubebuilder:validation:MinLength=3
	// +kubebuilder:validation:MaxLength=200
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="signerName is immutable: create a new Authority for another signer name"
	SignerName string `json:"signerName"`

	// generations are the signer's CA generations, old and new. At most one
	// may be Active; names are unique; a generation is removed only after
	// its phase is Retired.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:XValidation:rule="self.filter(g, has(g.phase) && g.phase == 'Active').size() <= 1",message="two generations active: at most one generation may have phase Active"
	// +kubebuilder:validation:XValidation:rule="oldSelf.all(o, (has(o.phase) && o.phase == 'Retired') || self.exists(g, g.name == o.name))",message="a generation can be removed only after its phase is Retired: set phase Retired and wait until status shows it"
	Generations []Generation `json:"generations,omitempty"`

	// trustBundleLabelDomain is the domain of the
	// <domain>/cluster-trust-bundle-version label (values canary and live)
	// on the ClusterTrustBundles published for this signer.
	// +optional
	// +kubebuilder:default="keyward.dev"
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`
	TrustBundleLabelDomain string `json:"trustBundleLabelDomain,omitempty"`

	// gates are the waits the controller enforces between phases.
	// +optional
	Gates Gates `json:"gates,omitempty"`
}

// Gates configure the waits between phases (docs/rotation.md lists which
// gate holds which transition). Defaults are written in Go's duration form
// ("1h0m0s", not "1h") so that a typed client's read-modify-write leaves
// spec, and metadata.generation, unchanged.
type Gates struct {
	// canarySoak is how long a root must sit in the canary bundle with
	// canary health holding before it goes on: Staged before Promoted, and
	// Retiring before Retired. Default 1h.
	// +optional
	// +kubebuilder:default="1h0m0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="canarySoak must be at least 1s"
	CanarySoak *metav1.Duration `json:"canarySoak,omitempty"`

	// propagationWindow is the least time after any change of a trust
	// bundle before the next transition, so that every node has the new
	// bundle (KEP-3257 expects delivery within 5 minutes). Default 5m.
	// +optional
	// +kubebuilder:default="5m0s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="propagationWindow must be at least 1s"
	PropagationWindow *metav1.Duration `json:"propagationWindow,omitempty"`

	// canaryHealth, if set, must hold throughout a canary soak; a failure
	// restarts the soak.
	// +optional
	CanaryHealth *CanaryHealth `json:"canaryHealth,omitempty"`
}

// CanaryHealth is what must hold while a root soaks in the canary bundle.
// +kubebuilder:validation:XValidation:rule="has(self.url) || has(self.pods)",message="canaryHealth needs a url, pods, or both"
type CanaryHealth struct {
	// url must answer a GET with a 2xx status, every interval.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="self.startsWith('http://') || self.startsWith('https://')",message="url must be http:// or https://"
	URL string `json:"url,omitempty"`

	// pods: the count of ready pods matching the selector must not drop
	// below the count when the soak began.
	// +optional
	Pods *PodHealth `json:"pods,omitempty"`

	// interval is how often the checks run. Default 10s.
	// +optional
	// +kubebuilder:default="10s"
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1s')",message="interval must be at least 1s"
	Interval *metav1.Duration `json:"interval,omitempty"`
}

// PodHealth selects the pods whose ready count is watched.
type PodHealth struct {
	// namespace of the pods.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Namespace string `json:"namespace"`

	// selector picks the pods.
	// +required
	Selector metav1.LabelSelector `json:"selector"`
}

// Generation is one CA: its key, its certificate, and the phase it should
// be in.
type Generation struct {
	// name identifies the generation within this Authority (a DNS label,
	// e.g. "2026-11").
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	Name string `json:"name"`

	// keyURI names the CA's private key in a backend (pkcs11:, gcpkms:,
	// awskms:, file:). It must not carry a PIN or password: name where the
	// PIN comes from with pin-source=file:... or pin-source=env:... instead.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=2048
	// +kubebuilder:validation:XValidation:rule="!self.lowerAscii().matches('(^|[:;?&])(pin-value|password)=')",message="keyURI must not carry a pin-value or password attribute: use pin-source=file:<path> or pin-source=env:<name>"
	KeyURI string `json:"keyURI"`

	// certificatePEM is the generation's CA certificate, PEM-encoded: the
	// certificate whose key keyURI names.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=16384
	CertificatePEM string `json:"certificatePEM"`

	// chainPEM holds the issuers above certificatePEM, PEM-encoded, nearest
	// first; empty when certificatePEM is a self-signed root.
	// +optional
	// +kubebuilder:validation:MaxLength=262144
	ChainPEM string `json:"chainPEM,omitempty"`

	// phase is the phase this generation should reach. The controller moves
	// it there one gated step at a time and reports progress in status.
	// +optional
	// +kubebuilder:default=Staged
	Phase Phase `json:"phase,omitempty"`
}

// AuthorityStatus is the observed state of a signer's CA generations.
type AuthorityStatus struct {
	// observedGeneration is the metadata.generation of the spec this status
	// describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// generations reports each generation's observed phase and gate.
	// +optional
	// +listType=map
	// +listMapKey=name
	// +kubebuilder:validation:MaxItems=8
	Generations []GenerationStatus `json:"generations,omitempty"`

	// bundles reports the canary and live ClusterTrustBundles.
	// +optional
	// +listType=map
	// +listMapKey=version
	// +kubebuilder:validation:MaxItems=2
	Bundles []BundleStatus `json:"bundles,omitempty"`

	// conditions are the Authority's conditions (e.g. Ready, Progressing).
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=16
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// GenerationStatus is where one generation stands and what it waits for.
type GenerationStatus struct {
	// name is the generation's name in spec.generations.
	// +required
	Name string `json:"name"`

	// phase is the phase the generation has reached.
	// +optional
	Phase Phase `json:"phase,omitempty"`

	// since is when the generation entered phase: the moment the trust
	// publisher's ClusterTrustBundle writes for it had returned, rounded
	// up to the next second. Absent while those writes are not confirmed;
	// no gate that counts from since opens before it is set.
	// +optional
	Since *metav1.Time `json:"since,omitempty"`

	// lastIssuedNotAfter bounds the notAfter of every certificate signed
	// with this generation's key: the signer raises it before it signs a
	// leaf that would end later, so no leaf outlives it. Unset: the key
	// never signed. No retirement before it has passed. Written by the
	// signer.
	// +optional
	LastIssuedNotAfter *metav1.Time `json:"lastIssuedNotAfter,omitempty"`

	// keyCheck is the signer's report on the generation's key. Written by
	// the signer.
	// +optional
	KeyCheck *KeyCheck `json:"keyCheck,omitempty"`

	// readyPodsAtSoakStart is the ready-pod count canaryHealth.pods saw
	// when this generation's canary soak began.
	// +optional
	ReadyPodsAtSoakStart *int32 `json:"readyPodsAtSoakStart,omitempty"`

	// gate names what holds the next transition back (e.g. canary soak,
	// propagation window, leaves still valid); empty when nothing does.
	// +optional
	Gate string `json:"gate,omitempty"`

	// gateOpensAt is when gate is expected to open, if it is time-bound.
	// +optional
	GateOpensAt *metav1.Time `json:"gateOpensAt,omitempty"`

	// canarySoak is spec.gates.canarySoak as it was when this soak began
	// (set with since, in Staged and Retiring). The soak lasts the longer
	// of it and the spec's value now: shortening spec.gates does not
	// shorten a soak under way (an override does, with an Event).
	// +optional
	CanarySoak *metav1.Duration `json:"canarySoak,omitempty"`
}

// KeyCheck is what the signer found when it opened a generation's key.
type KeyCheck struct {
	// ready is true when the key opened, matches certificatePEM and the
	// chain links up: the generation can issue.
	// +required
	Ready bool `json:"ready"`

	// message says what is wrong when ready is false.
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	Message string `json:"message,omitempty"`

	// keyVersion is the backend's version id of the key (e.g. a KMS
	// cryptoKeyVersion, or token and CKA_ID).
	// +optional
	// +kubebuilder:validation:MaxLength=1024
	KeyVersion string `json:"keyVersion,omitempty"`

	// time is when the signer last checked.
	// +optional
	Time *metav1.Time `json:"time,omitempty"`

	// keyURI is the spec keyURI the signer checked. A keyCheck counts
	// for the KeyNotReady gate only while it names the generation's
	// current keyURI and certificateDigest.
	// +optional
	// +kubebuilder:validation:MaxLength=2048
	KeyURI string `json:"keyURI,omitempty"`

	// certificateDigest is the hex SHA-256 of the certificatePEM and
	// chainPEM the signer checked the key against (record.CertificateDigest).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	CertificateDigest string `json:"certificateDigest,omitempty"`
}

// BundleStatus is what the controller published in one ClusterTrustBundle.
type BundleStatus struct {
	// version is the bundle's cluster-trust-bundle-version label value:
	// canary or live.
	// +required
	// +kubebuilder:validation:Enum=canary;live
	Version string `json:"version"`

	// name is the ClusterTrustBundle's name.
	// +optional
	Name string `json:"name,omitempty"`

	// generations are the generations whose roots the bundle holds.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	Generations []string `json:"generations,omitempty"`

	// digest is the SHA-256 of the bundle's content (hex).
	// +optional
	Digest string `json:"digest,omitempty"`

	// lastChangeTime is when the bundle's content last changed: the
	// moment the write of that content had returned, rounded up to the
	// next second. The propagation window runs from here.
	// +optional
	LastChangeTime *metav1.Time `json:"lastChangeTime,omitempty"`

	// published is true when the ClusterTrustBundle holds digest.
	// +optional
	Published bool `json:"published,omitempty"`

	// propagationWindow is spec.gates.propagationWindow as it was at
	// lastChangeTime. The window after this change lasts the longer of it
	// and the spec's value now.
	// +optional
	PropagationWindow *metav1.Duration `json:"propagationWindow,omitempty"`
}

// AuthorityList is a list of Authority objects.
//
// +kubebuilder:object:root=true
type AuthorityList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the Authority objects.
	Items []Authority `json:"items"`
}
