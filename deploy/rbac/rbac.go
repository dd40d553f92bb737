// Package rbac generates every permission keyward's components hold, from
// what they are configured to do: the signer names each one serves, whether
// it publishes trust bundles, which CSRs the approver decides. It is the
// single source of the shipped RBAC (deploy/kustomize/base/rbac.yaml, the
// Helm chart, `keyward deploy rbac`, `keyward demo` and the tests), and
// Expectations/Prove let a test check any rendering of it against a real
// kube-apiserver with SubjectAccessReviews.
//
// Nothing it renders touches Secrets: keyward reads its PIN and TLS key from
// files the kubelet mounts.
package rbac

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"

	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	tsconfig "github.com/keyward/keyward/signer/tokenservice/config"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Default names (docs: issue 14's contract).
const (
	DefaultNamespace = "keyward"
	// DefaultNodeAgentNamespace is the node agent's own namespace: its pod
	// needs Pod Security "privileged" (hostPath, hostNetwork), which the
	// control plane's namespace, labelled "restricted", never grants.
	DefaultNodeAgentNamespace = "keyward-node"
	SignerName                = "keyward-signer"
	ApproverName              = "keyward-approver"
	TokenServiceName          = "keyward-token-service"
	NodeAgentName             = "keyward-node-agent"
	CAAdminName               = "keyward-ca-admin"
)

// Input says what each component is configured to do.
type Input struct {
	Namespace    string             // where the ServiceAccounts and Leases live
	Signer       *SignerInput       // nil: no signer
	Approver     *ApproverInput     // nil: no approver
	TokenService *TokenServiceInput // nil: no token service
	NodeAgent    bool               // true: its ServiceAccount (no bindings: it acts as the node)
	// CAAdmin: the keyward-ca-admin ServiceAccount and ClusterRole, for
	// the short-lived Job that runs keyward ca and keyward trust where the
	// HSM is reachable (docs/production/ca-admin.md). The ClusterRole can be
	// bound to people too.
	CAAdmin bool
	// NodeAgentNamespace is where the node agent's ServiceAccount lives;
	// empty is DefaultNodeAgentNamespace (never Namespace: the agent's
	// namespace cannot be "restricted").
	NodeAgentNamespace string
	// AuthorityNames maps a signer name to its Authority's name where that
	// is not AuthorityName's derived one (`keyward ca init --authority`).
	// Writes on Authorities are granted on exactly these names.
	AuthorityNames map[string]string
}

// SignerInput is the signer's (and its trust publisher's) part.
type SignerInput struct {
	ServiceAccount string   // default keyward-signer
	LeaseName      string   // default keyward-signer
	PCRSigners     []string // signer names of PodCertificateRequest profiles
	CSRSigners     []string // signer names of CSR profiles; empty: no CSR verbs at all
	// TrustPublisher: attest on its names, ClusterTrustBundle writes,
	// Authority patch (trust publisher run in the signer's process).
	TrustPublisher bool
	// BootstrapAuthorities: create on authorities (the softhsm overlay's
	// init container runs `keyward ca init`).
	BootstrapAuthorities bool
}

// ApproverInput is `keyward approver`'s part.
type ApproverInput struct {
	ServiceAccount string   // default keyward-approver
	LeaseName      string   // default keyward-approver
	Signers        []string // the names it approves or denies
}

// TokenServiceInput is the registry token service's part.
type TokenServiceInput struct {
	ServiceAccount string // default keyward-token-service
	LeaseName      string // default keyward-token-service
	SignerName     string // the Authority whose key mints tokens
	TrustPublisher bool   // it publishes SignerName's trust bundles
}

// FromSignerConfig gives the signer's input for a SignerConfiguration: its
// names split by profile (CSR profiles — csr and the kubernetes.io ones —
// to CSRSigners; podIdentity, spiffe and server to PCRSigners), its Lease
// and whether the trust publisher runs. ServiceAccount is the default.
func FromSignerConfig(c *config.SignerConfiguration) SignerInput {
	in := SignerInput{ServiceAccount: SignerName, LeaseName: c.LeaderElection.LeaseName}
	if in.LeaseName == "" {
		in.LeaseName = SignerName
	}
	for _, s := range c.Signers {
		if config.IsCSRProfile(s.Profile) {
			in.CSRSigners = append(in.CSRSigners, s.Name)
		} else {
			in.PCRSigners = append(in.PCRSigners, s.Name)
		}
	}
	in.TrustPublisher = c.TrustPublisher.Enabled == nil || *c.TrustPublisher.Enabled
	return in
}

// ApproverFromSignerConfig gives the approver's input for the
// SignerConfiguration it shares with the signer: the names it decides
// (kubelet client and serving names, csr names with an approval section).
func ApproverFromSignerConfig(c *config.SignerConfiguration) ApproverInput {
	in := ApproverInput{ServiceAccount: ApproverName, LeaseName: approver.DefaultLeaseName}
	for _, s := range c.Signers {
		if approver.Approves(s) {
			in.Signers = append(in.Signers, s.Name)
		}
	}
	return in
}

// ErrInvalidInput is wrapped by Render's errors about its Input.
var ErrInvalidInput = errors.New("invalid RBAC input")

// rule is a PolicyRule with the reason it exists.
type rule struct {
	why string
	rbacv1.PolicyRule
}

// object is one rendered object with its comment block.
type object struct {
	comment string
	obj     runtime.Object
}

func r(why string, groups, resources, names, verbs []string) rule {
	return rule{why: why, PolicyRule: rbacv1.PolicyRule{APIGroups: groups, Resources: resources, ResourceNames: names, Verbs: verbs}}
}

func l(s ...string) []string { return s }

// sortedUnique returns the distinct names, sorted (deterministic output
// whatever the configuration's order).
func sortedUnique(names ...[]string) []string {
	var out []string
	for _, n := range names {
		out = append(out, n...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func orDefault(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

func (in *Input) validate() error {
	if in.Namespace == "" {
		return fmt.Errorf("%w: namespace is empty", ErrInvalidInput)
	}
	if in.Signer == nil && in.Approver == nil && in.TokenService == nil && !in.NodeAgent && !in.CAAdmin {
		return fmt.Errorf("%w: no component to render (a signer, an approver, a token service, the node agent or the CA admin)", ErrInvalidInput)
	}
	if s := in.Signer; s != nil && len(s.PCRSigners)+len(s.CSRSigners) == 0 {
		return fmt.Errorf("%w: the signer has no signer names", ErrInvalidInput)
	}
	if a := in.Approver; a != nil && len(a.Signers) == 0 {
		// A rule on signers without resourceNames is `approve` on every
		// signer name in the cluster.
		return fmt.Errorf("%w: the approver has no signer names to decide (no csr signer with an approval section, and no kubelet names): leave the approver out", ErrInvalidInput)
	}
	if t := in.TokenService; t != nil && t.SignerName == "" {
		return fmt.Errorf("%w: the token service has no signer name", ErrInvalidInput)
	}
	for _, n := range in.allNames() {
		if n == "" || n[len(n)-1] == '*' {
			return fmt.Errorf("%w: signer name %q: exact names only", ErrInvalidInput, n)
		}
		if in.authority(n) == "" {
			return fmt.Errorf("%w: signer name %q: no Authority name can be derived from it: give one (--authority %s=NAME)", ErrInvalidInput, n, n)
		}
	}
	return nil
}

// nodeAgentNamespace is the namespace of the node agent's ServiceAccount.
func (in *Input) nodeAgentNamespace() string {
	return orDefault(in.NodeAgentNamespace, DefaultNodeAgentNamespace)
}

// authority is the name of signerName's Authority.
func (in *Input) authority(signerName string) string {
	if n := in.AuthorityNames[signerName]; n != "" {
		return n
	}
	return AuthorityName(signerName)
}

// authorities gives the Authority names of names, sorted.
func (in *Input) authorities(names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, in.authority(n))
	}
	return sortedUnique(out)
}

// bundles gives the canary and live ClusterTrustBundle names of names,
// sorted.
func bundles(names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, bundleName(n, "canary"), bundleName(n, "live"))
	}
	return sortedUnique(out)
}

func (in *Input) allNames() []string {
	var out []string
	if s := in.Signer; s != nil {
		out = append(out, s.PCRSigners...)
		out = append(out, s.CSRSigners...)
	}
	if a := in.Approver; a != nil {
		out = append(out, a.Signers...)
	}
	if t := in.TokenService; t != nil && t.SignerName != "" {
		out = append(out, t.SignerName)
	}
	return out
}

const (
	certificates = "certificates.k8s.io"
	keyward      = "keyward.dev"
	coordination = "coordination.k8s.io"
)

func signerRules(in *Input, s *SignerInput) []rule {
	names := sortedUnique(s.PCRSigners, s.CSRSigners)
	auths := in.authorities(names)
	var rules []rule
	if len(s.PCRSigners) > 0 {
		rules = append(rules,
			r("Read the PodCertificateRequests it signs (informer).", l(certificates), l("podcertificaterequests"), nil, l("get", "list", "watch")),
			r("Write the certificate or a Failed condition into a PodCertificateRequest's status; never its spec.", l(certificates), l("podcertificaterequests/status"), nil, l("update")))
	}
	if len(s.CSRSigners) > 0 {
		rules = append(rules,
			r("Read the CertificateSigningRequests it signs (informer).", l(certificates), l("certificatesigningrequests"), nil, l("get", "list", "watch")),
			r("Write the certificate or a Failed condition into a CSR's status; never /approval (that is the approver's).", l(certificates), l("certificatesigningrequests/status"), nil, l("update")))
	}
	rules = append(rules,
		r("kube-apiserver lets only an identity with `sign` on the exact signer name issue for it: its configured names, never \"<domain>/*\".", l(certificates), l("signers"), names, l("sign")),
		r("Events on the requests it signs or fails.", l("", "events.k8s.io"), l("events"), nil, l("create", "patch")),
		r(readAuthorities, l(keyward), l("authorities"), nil, l("get", "list", "watch")),
		r(readBundles, l(certificates), l("clustertrustbundles"), nil, l("list", "watch")),
		r("Report keyCheck and lastIssuedNotAfter in its own Authorities' status while leading (server-side apply: patch), never another component's.", l(keyward), l("authorities/status"), auths, l("patch")))
	if s.TrustPublisher {
		rules = append(rules, trustPublisherRules(names, auths)...)
	}
	if s.BootstrapAuthorities {
		rules = append(rules,
			r("Bootstrap (softhsm overlay): the init container's `keyward ca init` creates the Authority of a new CA.", l(keyward), l("authorities"), nil, l("create")))
	}
	return rules
}

func approverRules(a *ApproverInput) []rule {
	return []rule{
		r("Read the CertificateSigningRequests it decides (informer).", l(certificates), l("certificatesigningrequests"), nil, l("get", "list", "watch")),
		r("Write the Approved or Denied condition; never the spec or /status (where certificates go).", l(certificates), l("certificatesigningrequests/approval"), nil, l("update")),
		r("kube-apiserver lets only an identity with `approve` on the exact signer name approve for it: the names it decides.", l(certificates), l("signers"), sortedUnique(a.Signers), l("approve")),
		r("Node cache (informer): a kubelet serving or nodeBound CSR's SANs are checked against its Node's status.addresses and every other Node's (no Node writes).", l(""), l("nodes"), nil, l("list", "watch")),
		r("Kubelet client CSRs are approved when the requester may create certificatesigningrequests/nodeclient or selfnodeclient (as kube-controller-manager's csrapproving does).", l("authorization.k8s.io"), l("subjectaccessreviews"), nil, l("create")),
		r("Events on the CSRs it approves or denies.", l("", "events.k8s.io"), l("events"), nil, l("create", "patch")),
	}
}

// readAuthorities is why every Authority is readable: list and watch cannot
// be narrowed by resourceNames, and the Authority informer
// (kubeclient/authority/client.NewInformer) lists every Authority and finds
// a signer name's by spec.signerName. Reading gives no power over them.
const readAuthorities = "Read the CA generations of its signer names (informer): list and watch cannot be narrowed by name, so every Authority is readable; writes are on its own names only."

// readBundles is why every ClusterTrustBundle is readable: the trust
// publisher's record of phases is an annotation on its bundles, and only a
// generation that record calls Active is signed with.
const readBundles = "Read the trust publisher's record of phases on its ClusterTrustBundles (informer): only the generation it calls Active signs, never one a status write alone calls so. List and watch cannot be narrowed by name (the label selector does not narrow a grant); bundles are public."

// trustPublisherRules are the trust publisher's grants for its signer
// names and their Authorities: attest, its bundles by name, its
// Authorities' override annotation.
func trustPublisherRules(names, auths []string) []rule {
	return []rule{
		r("Trust publisher: kube-apiserver admits a ClusterTrustBundle naming a signer only from an identity with `attest` on that exact name.", l(certificates), l("signers"), names, l("attest")),
		r("Trust publisher: publish (server-side apply: patch, or create when absent) and retire (delete) its own canary and live ClusterTrustBundles only.", l(certificates), l("clustertrustbundles"), bundles(names), l("get", "create", "patch", "delete")),
		r("Trust publisher: remove a used override annotation from its own Authorities only.", l(keyward), l("authorities"), auths, l("patch")),
	}
}

func tokenServiceRules(in *Input, t *TokenServiceInput) []rule {
	auths := in.authorities(l(t.SignerName))
	rules := []rule{
		r("Validate the pod-bound service-account tokens callers present.", l("authentication.k8s.io"), l("tokenreviews"), nil, l("create")),
		r("Read the token's pod and service account (namespace, node, annotations the rules match).", l(""), l("pods", "serviceaccounts"), nil, l("get")),
		r(readAuthorities, l(keyward), l("authorities"), nil, l("get", "list", "watch")),
		r(readBundles, l(certificates), l("clustertrustbundles"), nil, l("list", "watch")),
		r("Report its key's keyCheck and lastIssuedNotAfter in its own Authority's status while leading (server-side apply: patch), never another component's.", l(keyward), l("authorities/status"), auths, l("patch")),
		r("Events on its Authority.", l("", "events.k8s.io"), l("events"), nil, l("create", "patch")),
		{why: "Read the service-account issuer's public keys (OIDC discovery, as the built-in system:service-account-issuer-discovery role) to refuse forged tokens before any TokenReview.",
			PolicyRule: rbacv1.PolicyRule{NonResourceURLs: l("/.well-known/openid-configuration", "/openid/v1/jwks"), Verbs: l("get")}},
	}
	if t.TrustPublisher {
		rules = append(rules, trustPublisherRules(l(t.SignerName), auths)...)
	}
	return rules
}

// caAdminRules are what keyward ca init/import and keyward trust need:
// add generations to Authorities (create or update), move their phases
// (update), and drop a used override annotation (patch: the `kubectl
// annotate authority NAME keyward.dev/override-` that keyward trust --force
// asks for). keyward trust bundle also reads ClusterTrustBundles, which
// every ServiceAccount may (the built-in
// system:cluster-trust-bundle-discovery; people need it bound). Nothing on status, Secrets,
// Leases or requests: it signs nothing but the roots it makes, with keys it
// opens itself.
func caAdminRules() []rule {
	return []rule{
		r("keyward ca init/import: create a signer's Authority or add a generation to it; keyward trust: move generations through their phases (spec only), and drop a used override annotation (kubectl annotate: patch). Reading ClusterTrustBundles needs no grant for a ServiceAccount (system:cluster-trust-bundle-discovery).", l(keyward), l("authorities"), nil, l("get", "list", "watch", "create", "update", "patch")),
	}
}

func leaseRules(lease string) []rule {
	return []rule{
		r("Leader election: create its Lease (create cannot be narrowed by name).", l(coordination), l("leases"), nil, l("create")),
		r("Leader election: read and renew its own Lease only.", l(coordination), l("leases"), l(lease), l("get", "update")),
	}
}

// labels of every object of a component.
func labels(component, name string) map[string]string {
	return map[string]string{
		"app.kubernetes.io/part-of":   "keyward",
		"app.kubernetes.io/name":      name,
		"app.kubernetes.io/component": component,
	}
}

// component renders one component's objects.
func component(ns, comp, sa, leaseName, summary string, rules []rule) []object {
	lb := labels(comp, "keyward-"+comp)
	subject := []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa, Namespace: ns}}
	le := sa + "-leader-election"
	return []object{
		{comment: summary, obj: &corev1.ServiceAccount{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
			ObjectMeta: metav1.ObjectMeta{Name: sa, Namespace: ns, Labels: lb},
		}},
		{obj: clusterRole(sa, lb, rules)},
		{obj: &rbacv1.ClusterRoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: sa, Labels: lb},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: sa},
			Subjects:   subject,
		}},
		{comment: fmt.Sprintf("Leader election of %s: its Lease %s in %s only.", sa, leaseName, ns), obj: role(le, ns, lb, leaseRules(leaseName))},
		{obj: &rbacv1.RoleBinding{
			TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
			ObjectMeta: metav1.ObjectMeta{Name: le, Namespace: ns, Labels: lb},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: le},
			Subjects:   subject,
		}},
	}
}

// clusterRoleWithWhy and roleWithWhy keep each rule's reason beside the
// typed object, so that the YAML writer can print it above the rule.
type clusterRoleWithWhy struct {
	*rbacv1.ClusterRole
	why []string
}

type roleWithWhy struct {
	*rbacv1.Role
	why []string
}

func split(rules []rule) ([]rbacv1.PolicyRule, []string) {
	var pr []rbacv1.PolicyRule
	var why []string
	for _, ru := range rules {
		pr = append(pr, ru.PolicyRule)
		why = append(why, ru.why)
	}
	return pr, why
}

func clusterRole(name string, lb map[string]string, rules []rule) runtime.Object {
	pr, why := split(rules)
	return clusterRoleWithWhy{&rbacv1.ClusterRole{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: lb},
		Rules:      pr,
	}, why}
}

func role(name, ns string, lb map[string]string, rules []rule) runtime.Object {
	pr, why := split(rules)
	return roleWithWhy{&rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lb},
		Rules:      pr,
	}, why}
}

func render(in Input) ([]object, error) {
	if err := in.validate(); err != nil {
		return nil, err
	}
	ns := in.Namespace
	var out []object
	if s := in.Signer; s != nil {
		sa := orDefault(s.ServiceAccount, SignerName)
		out = append(out, component(ns, "signer", sa, orDefault(s.LeaseName, SignerName),
			"The signer: issues PodCertificateRequests and CSRs for its configured names (sign on exactly those), never approves."+
				trustNote(s.TrustPublisher), signerRules(&in, s))...)
	}
	if a := in.Approver; a != nil {
		sa := orDefault(a.ServiceAccount, ApproverName)
		out = append(out, component(ns, "approver", sa, orDefault(a.LeaseName, ApproverName),
			"`keyward approver`: approves or denies CSRs for its names (approve on exactly those), never signs.", approverRules(a))...)
	}
	if t := in.TokenService; t != nil {
		sa := orDefault(t.ServiceAccount, TokenServiceName)
		out = append(out, component(ns, "token-service", sa, orDefault(t.LeaseName, TokenServiceName),
			"The registry token service: reviews pod tokens and mints registry tokens with "+t.SignerName+"'s key."+trustNote(t.TrustPublisher), tokenServiceRules(&in, t))...)
	}
	if in.NodeAgent {
		no := false
		out = append(out, object{
			comment: "The node agent acts as its node (node client certificate), so its ServiceAccount has no bindings and no token.",
			obj: &corev1.ServiceAccount{
				TypeMeta:                     metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
				ObjectMeta:                   metav1.ObjectMeta{Name: NodeAgentName, Namespace: in.nodeAgentNamespace(), Labels: labels("node-agent", NodeAgentName)},
				AutomountServiceAccountToken: &no,
			},
		})
	}
	if in.CAAdmin {
		lb := labels("ca-admin", CAAdminName)
		out = append(out,
			object{
				comment: "The CA administrator: `keyward ca` and `keyward trust` in a short-lived Job where the HSM or KMS is reachable (docs/production/ca-admin.md). The ClusterRole may also be bound to people.",
				obj: &corev1.ServiceAccount{
					TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"},
					ObjectMeta: metav1.ObjectMeta{Name: CAAdminName, Namespace: ns, Labels: lb},
				},
			},
			object{obj: clusterRole(CAAdminName, lb, caAdminRules())},
			object{obj: &rbacv1.ClusterRoleBinding{
				TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
				ObjectMeta: metav1.ObjectMeta{Name: CAAdminName, Labels: lb},
				RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: CAAdminName},
				Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: CAAdminName, Namespace: ns}},
			}},
		)
	}
	return out, nil
}

func trustNote(on bool) string {
	if on {
		return " Its trust publisher (same identity and Lease) publishes their ClusterTrustBundles."
	}
	return ""
}

// Render returns every object of in: per component a ServiceAccount, a
// ClusterRole and its binding, a Role for its Lease and its binding, in a
// fixed order (signer, approver, token service, node agent).
func Render(in Input) ([]runtime.Object, error) {
	objs, err := render(in)
	if err != nil {
		return nil, err
	}
	out := make([]runtime.Object, 0, len(objs))
	for _, o := range objs {
		switch v := o.obj.(type) {
		case clusterRoleWithWhy:
			out = append(out, v.ClusterRole)
		case roleWithWhy:
			out = append(out, v.Role)
		default:
			out = append(out, v)
		}
	}
	return out, nil
}

// FromTokenServiceConfig gives the token service's input for its
// configuration: its signer name, Lease and trust publisher switch.
func FromTokenServiceConfig(c *tsconfig.TokenServiceConfiguration) TokenServiceInput {
	return TokenServiceInput{
		ServiceAccount: TokenServiceName,
		LeaseName:      orDefault(c.LeaderElection.LeaseName, TokenServiceName),
		SignerName:     c.SignerName,
		TrustPublisher: c.TrustPublisher.Enabled == nil || *c.TrustPublisher.Enabled,
	}
}

// AuthorityName is the name of signerName's Authority the RBAC grants
// writes on: DefaultAuthorityName's ("example.com/x" → "example.com.x"),
// or "" when none can be derived (Input.validate says so).
func AuthorityName(signerName string) string {
	n, err := v1alpha1.DefaultAuthorityName(signerName)
	if err != nil {
		return ""
	}
	return n
}

// bundleName is the name of a signer's ClusterTrustBundle of one version
// (trustpublisher.BundleName: "/" as ":", then ":canary" or ":live").
func bundleName(signerName, version string) string {
	return strings.ReplaceAll(signerName, "/", ":") + ":" + version
}
