package config

import (
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// validateApproval checks signers[].approval for a signer of profile
// profile. Each field applies to one kind of signer name only: users and
// groups to csr (kubelet client CSRs are approved by SubjectAccessReview,
// as kube-controller-manager does), the DNS suffixes and IP ranges to
// kubeletServing. kubeAPIServerClient names are never approved
// automatically: any identity the apiserver trusts could be asked for.
func validateApproval(a *Approval, profile string, rules *CSRPolicy, signer *field.Path) field.ErrorList {
	var errs field.ErrorList
	if a == nil {
		return nil
	}
	p := signer.Child("approval")
	if profile == ProfileKubeAPIServerClient {
		return append(errs, field.Forbidden(p, "kubernetes.io/kube-apiserver-client CSRs can name any user the apiserver trusts; keyward approver does not approve them (approve them by hand)"))
	}
	if profile != ProfileCSR {
		for _, f := range []struct {
			name string
			v    []string
		}{{"users", a.Users}, {"groups", a.Groups}} {
			if len(f.v) > 0 {
				errs = append(errs, field.Forbidden(p.Child(f.name), "applies only to profile csr (kubelet client CSRs are approved after a SubjectAccessReview on certificatesigningrequests/nodeclient or selfnodeclient; kubelet serving CSRs only for the node itself)"))
			}
		}
	}
	if profile != ProfileKubeletServing {
		for _, f := range []struct {
			name string
			v    []string
		}{{"allowedDNSSuffixes", a.AllowedDNSSuffixes}, {"allowedIPRanges", a.AllowedIPRanges}} {
			if len(f.v) > 0 {
				errs = append(errs, field.Forbidden(p.Child(f.name), "applies only to profile kubeletServing"))
			}
		}
	}
	if a.NodeBound && profile != ProfileCSR {
		errs = append(errs, field.Forbidden(p.Child("nodeBound"), "applies only to profile csr (kubelet CSRs are bound to their node already)"))
	}
	if a.NodeBound && profile == ProfileCSR && rules != nil {
		errs = append(errs, validateNodeBoundPatterns(rules, signer.Child("csr"))...)
	}
	if profile == ProfileCSR && len(a.Users) == 0 && len(a.Groups) == 0 {
		errs = append(errs, field.Required(p.Child("users"), "at least one user or group may request (every other CSR is Denied)"))
	}
	for j, u := range a.Users {
		if strings.TrimSpace(u) == "" {
			errs = append(errs, field.Invalid(p.Child("users").Index(j), u, "must not be empty"))
		}
	}
	for j, g := range a.Groups {
		if strings.TrimSpace(g) == "" {
			errs = append(errs, field.Invalid(p.Child("groups").Index(j), g, "must not be empty"))
		}
	}
	for j, s := range a.AllowedDNSSuffixes {
		for _, msg := range validation.IsDNS1123Subdomain(s) {
			errs = append(errs, field.Invalid(p.Child("allowedDNSSuffixes").Index(j), s, "a DNS suffix without a leading dot or wildcard, e.g. nodes.example.com: "+msg))
		}
	}
	for j, r := range a.AllowedIPRanges {
		prefix, err := netip.ParsePrefix(r)
		switch {
		case err != nil:
			errs = append(errs, field.Invalid(p.Child("allowedIPRanges").Index(j), r, "must be a CIDR, e.g. 10.0.0.0/8 or fd00::/8"))
		case prefix != prefix.Masked():
			errs = append(errs, field.Invalid(p.Child("allowedIPRanges").Index(j), r, "has host bits set; did you mean "+prefix.Masked().String()+"?"))
		}
	}
	return errs
}

// validateNodeBoundPatterns refuses csr patterns that approval.nodeBound
// can never approve a name under: the requesting node's name must fill a
// pattern's wildcard (*.<suffix> for CNs and DNS names, <prefix>* for
// URIs), so "*" alone and exact names would only deny every request that
// carries such a name.
func validateNodeBoundPatterns(rules *CSRPolicy, p *field.Path) field.ErrorList {
	var errs field.ErrorList
	for _, f := range []struct {
		name     string
		patterns []string
	}{{"commonNames", rules.CommonNames}, {"dnsNames", rules.DNSNames}} {
		for j, pat := range f.patterns {
			if suffix, ok := strings.CutPrefix(pat, "*."); !ok || suffix == "" {
				errs = append(errs, field.Invalid(p.Child(f.name).Index(j), pat,
					"with approval.nodeBound a name is approved only as <node>.<suffix> for a pattern *.<suffix> (the node's name fills the *); this pattern can never be"))
			}
		}
	}
	for j, pat := range rules.URIs {
		if len(pat) < 2 || !strings.HasSuffix(pat, "*") {
			errs = append(errs, field.Invalid(p.Child("uris").Index(j), pat,
				"with approval.nodeBound a URI is approved only as <prefix><node>[/<path>] for a pattern <prefix>* (the node's name fills the *); this pattern can never be"))
		}
	}
	return errs
}
