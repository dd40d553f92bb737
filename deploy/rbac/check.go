package rbac

import (
	"context"
	"errors"
	"fmt"
	"strings"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Check is one SubjectAccessReview and the answer the rendered RBAC must give.
type Check struct {
	User        string
	Groups      []string
	Verb        string
	Group       string
	Resource    string
	Subresource string
	Name        string
	Namespace   string
	Allowed     bool
	Why         string
}

func (c Check) String() string {
	want := "denied"
	if c.Allowed {
		want = "allowed"
	}
	res := c.Resource
	if c.Subresource != "" {
		res += "/" + c.Subresource
	}
	if c.Group != "" {
		res += "." + c.Group
	}
	where := "cluster-wide"
	if c.Namespace != "" {
		where = "in " + c.Namespace
	}
	name := ""
	if c.Name != "" {
		name = fmt.Sprintf(" %q", c.Name)
	}
	return fmt.Sprintf("%s %s %s%s %s: want %s (%s)", c.User, c.Verb, res, name, where, want, c.Why)
}

// saChecker builds checks for one ServiceAccount.
type saChecker struct {
	user   string
	groups []string
	out    *[]Check
}

func newSA(out *[]Check, ns, sa string) saChecker {
	return saChecker{
		user:   "system:serviceaccount:" + ns + ":" + sa,
		groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		out:    out,
	}
}

func (s saChecker) add(allowed bool, why, verb, group, resource, sub, name, ns string) {
	*s.out = append(*s.out, Check{User: s.user, Groups: s.groups, Verb: verb, Group: group, Resource: resource,
		Subresource: sub, Name: name, Namespace: ns, Allowed: allowed, Why: why})
}

// otherNamespace is a namespace no component's Lease lives in.
const otherNamespace = "kube-system"

// Expectations lists, for every component of in, each permission it must
// hold and a set it must not: Secrets anywhere, names it was not given
// (also in its own domain), other components' verbs, PCR spec writes,
// deletes, Leases of other namespaces.
func Expectations(in Input) []Check {
	var out []Check
	ns := in.Namespace
	secrets := func(s saChecker) {
		for _, v := range []string{"get", "list", "watch"} {
			s.add(false, "nothing on Secrets: PINs and keys are mounted files", v, "", "secrets", "", "", ns)
			s.add(false, "nothing on Secrets, cluster-wide either", v, "", "secrets", "", "", "")
		}
		s.add(false, "nothing on Secrets", "get", "", "secrets", "", "keyward-hsm-pin", ns)
	}
	lease := func(s saChecker, name string) {
		s.add(true, "leader election", "create", coordination, "leases", "", "", ns)
		s.add(true, "leader election", "get", coordination, "leases", "", name, ns)
		s.add(true, "leader election", "update", coordination, "leases", "", name, ns)
		s.add(false, "only its own Lease", "update", coordination, "leases", "", name+"-other", ns)
		s.add(false, "Leases in its own namespace only", "get", coordination, "leases", "", name, otherNamespace)
		s.add(false, "Leases in its own namespace only", "create", coordination, "leases", "", "", otherNamespace)
	}
	own := in.allNames()
	foreign := foreignName(own)
	if sg := in.Signer; sg != nil {
		s := newSA(&out, ns, orDefault(sg.ServiceAccount, SignerName))
		secrets(s)
		lease(s, orDefault(sg.LeaseName, SignerName))
		names := sortedUnique(sg.PCRSigners, sg.CSRSigners)
		for _, n := range names {
			s.add(true, "signs for its configured name", "sign", certificates, "signers", "", n, "")
			s.add(sg.TrustPublisher, "attest only for its trust publisher", "attest", certificates, "signers", "", n, "")
			s.add(false, "the signer never approves", "approve", certificates, "signers", "", n, "")
		}
		s.add(false, "sign only on names it was given, not others of its domain", "sign", certificates, "signers", "", foreign, "")
		for _, d := range domainWildcards(names) {
			// kube-apiserver also accepts a grant on "<domain>/*": none may exist.
			s.add(false, "no domain wildcard grant", "sign", certificates, "signers", "", d, "")
			s.add(false, "no domain wildcard grant", "attest", certificates, "signers", "", d, "")
		}
		s.add(false, "attest only on its own names", "attest", certificates, "signers", "", foreign, "")
		pcr := len(sg.PCRSigners) > 0
		for _, v := range []string{"get", "list", "watch"} {
			s.add(pcr, "reads the PCRs it signs", v, certificates, "podcertificaterequests", "", "", "")
		}
		s.add(pcr, "writes PCR status", "update", certificates, "podcertificaterequests", "status", "", "")
		s.add(false, "never a PCR's spec", "update", certificates, "podcertificaterequests", "", "", "")
		s.add(false, "never deletes PCRs", "delete", certificates, "podcertificaterequests", "", "", "")
		csr := len(sg.CSRSigners) > 0
		for _, v := range []string{"get", "list", "watch"} {
			s.add(csr, "reads CSRs only when it has CSR names", v, certificates, "certificatesigningrequests", "", "", "")
		}
		s.add(csr, "CSR status only when it has CSR names", "update", certificates, "certificatesigningrequests", "status", "", "")
		s.add(false, "approval is the approver's", "update", certificates, "certificatesigningrequests", "approval", "", "")
		s.add(false, "never deletes CSRs", "delete", certificates, "certificatesigningrequests", "", "", "")
		s.add(true, "events", "create", "", "events", "", "", ns)
		s.add(true, "events", "patch", "events.k8s.io", "events", "", "", ns)
		for _, v := range []string{"get", "list", "watch"} {
			s.add(true, "reads Authorities", v, keyward, "authorities", "", "", "")
		}
		s.add(false, "Authority status writes name the Authority", "patch", keyward, "authorities", "status", "", "")
		s.add(false, "Authority writes name the Authority", "patch", keyward, "authorities", "", "", "")
		s.add(sg.BootstrapAuthorities, "create only for bootstrap", "create", keyward, "authorities", "", "", "")
		s.add(false, "never deletes Authorities", "delete", keyward, "authorities", "", "", "")
		s.add(false, "no ClusterTrustBundle deletes but by name", "delete", certificates, "clustertrustbundles", "", "", "")
		s.add(false, "no token reviews", "create", "authentication.k8s.io", "tokenreviews", "", "", "")
	}
	if ap := in.Approver; ap != nil {
		s := newSA(&out, ns, orDefault(ap.ServiceAccount, ApproverName))
		secrets(s)
		lease(s, orDefault(ap.LeaseName, ApproverName))
		for _, n := range sortedUnique(ap.Signers) {
			s.add(true, "approves for its names", "approve", certificates, "signers", "", n, "")
			s.add(false, "the approver never signs", "sign", certificates, "signers", "", n, "")
		}
		s.add(false, "approve only on its names", "approve", certificates, "signers", "", foreign, "")
		for _, d := range domainWildcards(ap.Signers) {
			s.add(false, "no domain wildcard grant", "approve", certificates, "signers", "", d, "")
		}
		for _, v := range []string{"get", "list", "watch"} {
			s.add(true, "reads CSRs", v, certificates, "certificatesigningrequests", "", "", "")
		}
		s.add(true, "writes approval", "update", certificates, "certificatesigningrequests", "approval", "", "")
		s.add(false, "never CSR status (certificates)", "update", certificates, "certificatesigningrequests", "status", "", "")
		s.add(false, "never CSR spec", "update", certificates, "certificatesigningrequests", "", "", "")
		s.add(true, "node cache", "list", "", "nodes", "", "", "")
		s.add(true, "node cache", "watch", "", "nodes", "", "", "")
		s.add(false, "no node writes", "update", "", "nodes", "", "", "")
		s.add(true, "kubelet client CSR checks", "create", "authorization.k8s.io", "subjectaccessreviews", "", "", "")
		s.add(false, "no PCRs", "list", certificates, "podcertificaterequests", "", "", "")
		s.add(false, "no Authorities", "get", keyward, "authorities", "", "", "")
	}
	if ts := in.TokenService; ts != nil {
		s := newSA(&out, ns, orDefault(ts.ServiceAccount, TokenServiceName))
		secrets(s)
		lease(s, orDefault(ts.LeaseName, TokenServiceName))
		s.add(true, "validates pod tokens", "create", "authentication.k8s.io", "tokenreviews", "", "", "")
		s.add(true, "reads the token's pod", "get", "", "pods", "", "", "default")
		s.add(true, "reads the token's service account", "get", "", "serviceaccounts", "", "", "default")
		s.add(false, "no pod list", "list", "", "pods", "", "", "")
		s.add(false, "no service-account tokens", "create", "", "serviceaccounts", "token", "", "default")
		s.add(true, "reads Authorities", "get", keyward, "authorities", "", "", "")
		s.add(false, "Authority status writes name the Authority", "patch", keyward, "authorities", "status", "", "")
		s.add(ts.TrustPublisher, "attest on its name for its trust publisher", "attest", certificates, "signers", "", ts.SignerName, "")
		s.add(false, "never signs", "sign", certificates, "signers", "", ts.SignerName, "")
		s.add(false, "attest only on its own name", "attest", certificates, "signers", "", foreign, "")
		s.add(false, "no ClusterTrustBundle deletes but by name", "delete", certificates, "clustertrustbundles", "", "", "")
		s.add(false, "no PCRs", "list", certificates, "podcertificaterequests", "", "", "")
		s.add(false, "no Authority creation", "create", keyward, "authorities", "", "", "")
	}
	if in.NodeAgent {
		s := newSA(&out, in.nodeAgentNamespace(), NodeAgentName)
		secrets(s)
		s.add(false, "the node agent's ServiceAccount has no bindings", "list", certificates, "certificatesigningrequests", "", "", "")
		s.add(false, "the node agent's ServiceAccount has no bindings", "sign", certificates, "signers", "", foreign, "")
	}
	if in.CAAdmin {
		s := newSA(&out, ns, CAAdminName)
		secrets(s)
		for _, v := range []string{"get", "list", "watch", "create", "update", "patch"} {
			s.add(true, "keyward ca and keyward trust write Authorities' specs (patch: dropping an override annotation)", v, keyward, "authorities", "", "", "")
		}
		s.add(false, "never deletes an Authority (a generation's history is kept)", "delete", keyward, "authorities", "", "", "")
		s.add(false, "never status: keyCheck and the phase record are the signer's and publisher's", "patch", keyward, "authorities", "status", "", "")
		s.add(false, "never status: keyCheck and the phase record are the signer's and publisher's", "update", keyward, "authorities", "status", "", "")
		s.add(false, "never publishes bundles (the trust publisher does)", "create", certificates, "clustertrustbundles", "", "", "")
		s.add(false, "never deletes bundles", "delete", certificates, "clustertrustbundles", "", "", "")
		for _, n := range sortedUnique(own, l(foreign)) {
			s.add(false, "signs nothing through the apiserver", "sign", certificates, "signers", "", n, "")
			s.add(false, "attests nothing", "attest", certificates, "signers", "", n, "")
			s.add(false, "approves nothing", "approve", certificates, "signers", "", n, "")
		}
		s.add(false, "no PCRs", "list", certificates, "podcertificaterequests", "", "", "")
		s.add(false, "no Leases", "create", coordination, "leases", "", "", ns)
	}
	return append(out, IsolationChecks(in)...)
}

// powers is what one component may do per signer name.
type powers struct {
	sa                    string
	ns                    string // its ServiceAccount's namespace; empty: Input.Namespace
	sign, attest, approve []string
	// status: names whose Authority status it writes; publish: names
	// whose Authority (override annotation) and ClusterTrustBundles it
	// writes (its trust publisher).
	status, publish []string
}

func (in *Input) powers() []powers {
	var out []powers
	if s := in.Signer; s != nil {
		names := sortedUnique(s.PCRSigners, s.CSRSigners)
		p := powers{sa: orDefault(s.ServiceAccount, SignerName), sign: names, status: names}
		if s.TrustPublisher {
			p.attest, p.publish = names, names
		}
		out = append(out, p)
	}
	if a := in.Approver; a != nil {
		out = append(out, powers{sa: orDefault(a.ServiceAccount, ApproverName), approve: sortedUnique(a.Signers)})
	}
	if t := in.TokenService; t != nil {
		p := powers{sa: orDefault(t.ServiceAccount, TokenServiceName), status: l(t.SignerName)}
		if t.TrustPublisher {
			p.attest, p.publish = l(t.SignerName), l(t.SignerName)
		}
		out = append(out, p)
	}
	if in.NodeAgent {
		out = append(out, powers{sa: NodeAgentName, ns: in.nodeAgentNamespace()})
	}
	return out
}

// IsolationChecks is the trust matrix: for every component and every
// signer name of in (and one no component was given), whether it may
// sign, attest or approve for the name, and write (create, update, patch,
// delete) the name's Authority, its status and its canary and live
// ClusterTrustBundles. A component holds each only for its own names and
// only as far as its work needs (status: patch, the server-side apply;
// bundles: create, patch, delete; never update or delete an Authority).
func IsolationChecks(in Input) []Check {
	var out []Check
	universe := sortedUnique(in.allNames(), l(foreignName(in.allNames())))
	for _, p := range in.powers() {
		s := newSA(&out, orDefault(p.ns, in.Namespace), p.sa)
		for _, n := range universe {
			auth, whose := in.authority(n), "another component's"
			mine := func(list []string) bool { return contains(list, n) }
			if mine(p.status) || mine(p.publish) {
				whose = "its own"
			}
			s.add(mine(p.sign), "sign only for its own signer names", "sign", certificates, "signers", "", n, "")
			s.add(mine(p.attest), "attest only for its own signer names (trust publisher)", "attest", certificates, "signers", "", n, "")
			s.add(mine(p.approve), "approve only for the names it decides", "approve", certificates, "signers", "", n, "")
			s.add(mine(p.status), "status of "+whose+" Authority", "patch", keyward, "authorities", "status", auth, "")
			s.add(false, "status is applied (patch), never replaced", "update", keyward, "authorities", "status", auth, "")
			s.add(mine(p.publish), "spec/metadata of "+whose+" Authority (trust publisher: override annotation)", "patch", keyward, "authorities", "", auth, "")
			s.add(false, "no Authority replaced", "update", keyward, "authorities", "", auth, "")
			s.add(false, "no Authority deleted", "delete", keyward, "authorities", "", auth, "")
			for _, v := range []string{"canary", "live"} {
				b := bundleName(n, v)
				s.add(mine(p.publish), "publish "+whose+" ClusterTrustBundle", "patch", certificates, "clustertrustbundles", "", b, "")
				s.add(mine(p.publish), "publish "+whose+" ClusterTrustBundle", "create", certificates, "clustertrustbundles", "", b, "")
				s.add(mine(p.publish), "retire "+whose+" ClusterTrustBundle", "delete", certificates, "clustertrustbundles", "", b, "")
				s.add(false, "bundles are applied (patch), never replaced", "update", certificates, "clustertrustbundles", "", b, "")
			}
		}
	}
	return out
}

// foreignName is a signer name in keyward.dev no component was given.
func foreignName(own []string) string {
	for i := 0; ; i++ {
		n := "keyward.dev/other"
		if i > 0 {
			n = fmt.Sprintf("keyward.dev/other-%d", i)
		}
		if !contains(own, n) {
			return n
		}
	}
}

// domainWildcards gives "<domain>/*" for each domain of names.
func domainWildcards(names []string) []string {
	var out []string
	for _, n := range names {
		if d, _, ok := strings.Cut(n, "/"); ok && !contains(out, d+"/*") {
			out = append(out, d+"/*")
		}
	}
	return out
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// ErrMismatch is wrapped by Prove's error for each check the apiserver
// answered differently.
var ErrMismatch = errors.New("RBAC check mismatch")

// Prove runs a SubjectAccessReview for every check and returns every
// mismatch (and every failed review), each naming its check.
func Prove(ctx context.Context, client kubernetes.Interface, checks []Check) error {
	var errs []error
	for _, c := range checks {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: c.User, Groups: c.Groups,
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: c.Verb, Group: c.Group, Resource: c.Resource, Subresource: c.Subresource,
				Name: c.Name, Namespace: c.Namespace,
			},
		}}
		got, err := client.AuthorizationV1().SubjectAccessReviews().Create(ctx, sar, metav1.CreateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("reviewing %s: %w", c, err))
			continue
		}
		if got.Status.Allowed != c.Allowed {
			errs = append(errs, fmt.Errorf("%s: got allowed=%t (%s): %w", c, got.Status.Allowed, got.Status.Reason, ErrMismatch))
		}
	}
	return errors.Join(errs...)
}
