package v1alpha1

// Gates: the values of status.generations[].gate and the reason of the
// Progressing condition. Each names what holds a transition back.
const (
	// GateCanarySoak: the root has been in the canary bundle, with canary
	// health holding, for less than spec.gates.canarySoak.
	GateCanarySoak = "CanarySoak"
	// GateCanaryHealth: a canary health check fails now.
	GateCanaryHealth = "CanaryHealth"
	// GatePropagationWindow: a trust bundle changed less than
	// spec.gates.propagationWindow ago.
	GatePropagationWindow = "PropagationWindow"
	// GateLeavesValid: a leaf signed with the generation's key can still be
	// valid (status lastIssuedNotAfter has not passed).
	GateLeavesValid = "LeavesValid"
	// GateKeyNotReady: the signer has not reported the generation's key
	// ready (status keyCheck).
	GateKeyNotReady = "KeyNotReady"
	// GateBundleNotPublished: a trust bundle does not hold what the
	// observed phases put in it yet (a write failed or is pending).
	GateBundleNotPublished = "BundleNotPublished"
	// GateNoSuccessor: the Active generation may leave Active only when
	// another generation becomes Active.
	GateNoSuccessor = "NoSuccessor"
	// GateInvalidCertificate: certificatePEM or chainPEM is unusable.
	GateInvalidCertificate = "InvalidCertificate"
	// GateNotYetValid: the generation's CA certificate (or chain) starts in
	// the future; it cannot become Active before then.
	GateNotYetValid = "NotYetValid"
	// GateConflict: another Authority names the same signer.
	GateConflict = "Conflict"
)

// Condition types on an Authority.
const (
	// ConditionProgressing is True while a generation's observed phase
	// differs from its desired one; its reason is the gate that holds it.
	ConditionProgressing = "Progressing"
	// ConditionBundlesPublished is True when both ClusterTrustBundles hold
	// what the observed phases put in them.
	ConditionBundlesPublished = "BundlesPublished"
	// ConditionCanaryHealthy reports spec.gates.canaryHealth; its
	// lastTransitionTime is when it last turned True, from which a soak
	// counts.
	ConditionCanaryHealthy = "CanaryHealthy"
	// ConditionReady is True when one generation is Active and its key
	// reported ready.
	ConditionReady = "Ready"
	// ConditionPropagationWindowSafe is False when spec.gates'
	// propagationWindow is shorter than a running pod takes to see a
	// bundle change at the kubelet sync frequency the trust publisher was
	// told (trustPublisher.kubeletSyncFrequency): a new root could issue
	// before running pods trust it. It warns; it holds no gate.
	ConditionPropagationWindowSafe = "PropagationWindowSafe"
)

// OverrideAnnotation asks the controller to skip the gates for the named
// generations' next transition, once. Its value is JSON (an Override);
// the controller records an Event and an audit log line, then removes it.
const OverrideAnnotation = "keyward.dev/override"

// Override is the value of OverrideAnnotation.
type Override struct {
	// Reason is why the gates are skipped (required; recorded).
	Reason string `json:"reason"`
	// Generations maps a generation name to the phase it may reach at once.
	// The override applies only while spec asks for that phase.
	Generations map[string]Phase `json:"generations"`
	// RequestedBy names who asked (informational; the apiserver's audit
	// log has the authenticated user).
	RequestedBy string `json:"requestedBy,omitempty"`
}

// Field managers for server-side apply: each writes only its own fields.
const (
	// FieldManagerTrustPublisher owns status phases, gates, bundles and
	// conditions, and the ClusterTrustBundles.
	FieldManagerTrustPublisher = "keyward-trustpublisher"
	// FieldManagerSigner owns status.generations[].lastIssuedNotAfter and
	// keyCheck.
	FieldManagerSigner = "keyward-signer"
	// FieldManagerCLI owns spec edits made by keyward ca and keyward trust.
	FieldManagerCLI = "keyward-cli"
)

// Trust bundle versions: the values of the
// <domain>/cluster-trust-bundle-version label.
const (
	BundleCanary = "canary"
	BundleLive   = "live"
)

// BundleVersionLabel is the label key on published ClusterTrustBundles
// for a label domain: <domain>/cluster-trust-bundle-version.
func BundleVersionLabel(domain string) string {
	return domain + "/cluster-trust-bundle-version"
}
