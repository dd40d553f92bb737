package csr

import (
	"fmt"
	"strings"

	"github.com/keyward/keyward/signer/config"
)

// Property names KEP-1513 asks every signer to document, in its order.
var properties = []string{
	"Trust distribution", "Permitted subjects", "Permitted x509 extensions",
	"Permitted key usages / extended key usages", "Expiration / certificate lifetime",
	"CA bit allowed / disallowed", "Meaning of extra PEM blocks in status.certificate",
}

// DescribeSigners is docs/signers.md for cfg: every signer name with the
// seven properties of KEP-1513, as keyward enforces them. A test keeps the
// file equal to what this returns for docs/signers-config.yaml.
func DescribeSigners(cfg *config.SignerConfiguration) string {
	var b strings.Builder
	b.WriteString(docHeader)
	for _, s := range cfg.Signers {
		fmt.Fprintf(&b, "\n## `%s`\n\n", s.Name)
		kind := "PodCertificateRequests"
		if config.IsCSRProfile(s.Profile) {
			kind = "CertificateSigningRequests (certificates.k8s.io/v1)"
		}
		fmt.Fprintf(&b, "Profile `%s`; serves %s.\n\n", s.Profile, kind)
		b.WriteString("| Property | keyward |\n|---|---|\n")
		for i, v := range describe(s) {
			fmt.Fprintf(&b, "| %s | %s |\n", properties[i], strings.ReplaceAll(v, "|", `\|`))
		}
	}
	b.WriteString(docFooter)
	return b.String()
}

func quoteList(xs []string) string {
	if len(xs) == 0 {
		return "none"
	}
	q := make([]string, len(xs))
	for i, x := range xs {
		q[i] = "`" + x + "`"
	}
	return strings.Join(q, ", ")
}

func ctbs(name string) string {
	base := strings.ReplaceAll(name, "/", ":")
	return fmt.Sprintf("ClusterTrustBundles `%s:live` and `%s:canary` (spec.signerName `%s`), published by the trust publisher during rotations (docs/rotation.md)", base, base, name)
}

// describe returns the seven properties of one signer name.
func describe(s config.Signer) [7]string {
	keys := "subject keys " + quoteList(s.AllowedKeyTypes) + "; others are refused"
	noCA := "Never: the certificate carries basicConstraints CA:FALSE"
	lifetime := fmt.Sprintf("min(maxLifetime %s, the request's maximum), notBefore backdated %s", s.MaxLifetime.Duration, s.Backdate.Duration)
	csrLifetime := fmt.Sprintf("min(maxLifetime %s, spec.expirationSeconds); no expirationSeconds gets %s; kube-apiserver's minimum of 600s is honoured as asked (not raised); notBefore backdated up to %s; never beyond the CA's own expiry", s.MaxLifetime.Duration, s.MaxLifetime.Duration, s.Backdate.Duration)
	pcrChain := "status.certificateChain holds the leaf, then the CA certificate of the generation that signed and its issuers"
	csrChain := "status.certificate holds the leaf, then any intermediate CA certificates of the signing generation; the self-signed root is never sent (get it from the trust distribution)"
	if in := s.Intermediate; in != nil && in.Enabled {
		mem := fmt.Sprintf("; right after the leaf comes the signing replica's in-memory intermediate (signers[].intermediate: pathLen 0, at most %s, renewed %s before its end), signed by that generation", in.Validity.Duration, in.RenewBefore.Duration)
		pcrChain += mem
		csrChain = "status.certificate holds the leaf, then the signing replica's in-memory intermediate (signers[].intermediate: pathLen 0, at most " + in.Validity.Duration.String() + ", renewed " + in.RenewBefore.Duration.String() + " before its end), then any intermediate CA certificates of the signing generation; the self-signed root is never sent (get it from the trust distribution)"
	}
	csrNoCA := noCA + "; a request asking basicConstraints CA:TRUE or usage `cert sign` / `crl sign` is marked Failed (CARequested)"
	usageNote := "the certificate carries exactly spec.usages"
	switch s.Profile {
	case config.ProfilePodIdentity:
		crit := "non-critical"
		if s.PodIdentity != nil && s.PodIdentity.Critical {
			crit = "critical"
		}
		return [7]string{ctbs(s.Name),
			"CN `system:serviceaccount:<namespace>:<serviceAccount>` of the requesting pod; " + keys,
			"the KEP-4317 PodIdentity extension (" + crit + "), subjectKeyIdentifier, authorityKeyIdentifier; no SANs",
			"digital signature; client auth", lifetime, noCA, pcrChain}
	case config.ProfileSPIFFE:
		td := ""
		if s.SPIFFE != nil {
			td = s.SPIFFE.TrustDomain
		}
		return [7]string{ctbs(s.Name),
			"empty subject; " + keys,
			"URI SAN `spiffe://" + td + "/ns/<namespace>/sa/<serviceAccount>` (critical), subjectKeyIdentifier, authorityKeyIdentifier",
			"digital signature; server auth, client auth", lifetime, noCA, pcrChain}
	case config.ProfileServer:
		var pats []string
		ann := ""
		if s.Server != nil {
			pats, ann = s.Server.AllowedDNSNames, s.Server.DNSNamesAnnotation
		}
		return [7]string{ctbs(s.Name),
			"CN = the first requested DNS name of at most 64 characters; " + keys,
			"DNS SANs from the `" + ann + "` annotation, each matching one of " + quoteList(pats) + "; subjectKeyIdentifier, authorityKeyIdentifier",
			"digital signature (and key encipherment for RSA keys); server auth", lifetime, noCA, pcrChain}
	case config.ProfileKubeAPIServerClient:
		return [7]string{
			"kube-apiserver must trust this signer's CA for client authentication (`--client-ca-file`); " + ctbs(s.Name),
			"any subject (kube-apiserver reads CN as the user, O as groups; the approver decides who gets what); " + keys,
			"subjectAltName honoured as requested; other requested extensions are discarded",
			"`client auth` required; `digital signature` and `key encipherment` optional; nothing else (UsagesNotPermitted); " + usageNote,
			csrLifetime, csrNoCA, csrChain}
	case config.ProfileKubeAPIServerClientKubelet:
		return [7]string{
			"kube-apiserver must trust this signer's CA for client authentication (`--client-ca-file`); " + ctbs(s.Name),
			"O exactly `system:nodes`, CN beginning `system:node:`; " + keys,
			"no subjectAltNames at all (DNS, IP, email, URI: SubjectAltNameNotPermitted); other requested extensions are discarded",
			"exactly `digital signature`, `client auth`, optionally `key encipherment`; " + usageNote,
			csrLifetime, csrNoCA, csrChain}
	case config.ProfileKubeletServing:
		return [7]string{
			"whoever connects to kubelets must trust this signer's CA: kube-apiserver's `--kubelet-certificate-authority`, metrics scrapers; " + ctbs(s.Name),
			"O exactly `system:nodes`, CN beginning `system:node:`; " + keys,
			"at least one DNS or IP subjectAltName; never a `*` in a DNS SAN or the CN (Failed even when approved); no email or URI SANs; other requested extensions are discarded",
			"exactly `digital signature`, `server auth`, optionally `key encipherment`; " + usageNote,
			csrLifetime, csrNoCA, csrChain}
	case config.ProfileCSR:
		c := s.CSR
		if c == nil {
			c = &config.CSRPolicy{}
		}
		cn := "no CN"
		if len(c.CommonNames) > 0 {
			cn = "a CN matching " + quoteList(c.CommonNames) + " (case-sensitive; a `*.` label is never `*` itself)"
		}
		return [7]string{c.TrustDistribution,
			cn + "; O only among " + quoteList(c.Organizations) + "; no other subject attribute; " + keys,
			"subjectAltName only: DNS names matching " + quoteList(c.DNSNames) + " (case-insensitive), IP addresses in " + quoteList(c.IPRanges) +
				", URIs matching " + quoteList(c.URIs) + ", no email addresses; basicConstraints CA:FALSE, keyUsage and extKeyUsage in the request are tolerated and ignored; any other requested extension is Failed (ExtensionNotPermitted)",
			"a non-empty subset of " + quoteList(c.KeyUsages) + "; " + usageNote,
			csrLifetime, csrNoCA, csrChain}
	}
	return [7]string{}
}

const docHeader = `# Signer names keyward serves

<!-- GENERATED by signer/csr.DescribeSigners from docs/signers-config.yaml.
     Do not edit: change the config or the function, then run make generate
     (go test ./signer/csr -run TestSignersDoc -update). -->

KEP-1513 asks every signer to document seven properties for each signer
name. This page states them for every name in the example configuration
docs/signers-config.yaml, as keyward enforces them; a test fails when this
page and the configuration disagree. A CertificateSigningRequest that breaks
a rule is marked ` + "`Failed`" + ` with a reason naming the rule
(UnsupportedKeyType, CARequested, ExtensionNotPermitted, SubjectNotPermitted,
SubjectAltNameNotPermitted, UsagesNotPermitted, InvalidRequest; BackendFailure
and StatusRejected when the CA key or kube-apiserver refuse for good, while a
transient outage is retried and never fails a CSR); keyward signs
only CSRs with ` + "`Approved`" + ` and without ` + "`Denied`" + `/` + "`Failed`" + `, sets
status.certificate once, and never touches a CSR for a signer name it was not
configured with. It needs ` + "`sign`" + ` on each name and never ` + "`approve`" + `.
Rate limits (rateLimits) and failAfter apply to PodCertificateRequests only.
Each signed or Failed CSR is one log line and a count in
keyward_csr_outcomes_total{signer,outcome,reason}; a Failed one also gets a
Warning Event (CSRs are cluster-scoped: ` + "`kubectl get events -n default`" + `).
`

const docFooter = `
## Handing the kubernetes.io names to keyward

kube-controller-manager signs the three kubernetes.io names itself (its
csrsigning controller). Before configuring keyward for one of them:

- stop kube-controller-manager from signing it: ` + "`--controllers=*,-csrsigning`" + `
  hands all of them over; to keep some, drop ` + "`--cluster-signing-cert-file`" + `/` + "`--cluster-signing-key-file`" + `
  and set only the per-name flags of the names it keeps
  (` + "`--cluster-signing-kube-apiserver-client-cert-file`" + `, ` + "`--cluster-signing-kubelet-client-cert-file`" + `,
  ` + "`--cluster-signing-kubelet-serving-cert-file`" + ` and their ` + "`-key-file`" + `s);
- make the relying parties trust keyward's CA: kube-apiserver's
  ` + "`--client-ca-file`" + ` must include it for kubernetes.io/kube-apiserver-client
  and kubernetes.io/kube-apiserver-client-kubelet, and
  ` + "`--kubelet-certificate-authority`" + ` for kubernetes.io/kubelet-serving;
- grant the signer's ClusterRole ` + "`sign`" + ` on the name, and ` + "`attest`" + ` if the trust
  publisher runs in the signer (it publishes the name's ClusterTrustBundles):
  ` + "`keyward deploy rbac --signer-config FILE`" + ` renders exact grants for every
  name in the configuration (deploy/kustomize/base/rbac.yaml is its output for
  the base's names; the Helm chart renders the same from its values).
  Never grant the signer ` + "`approve`" + `: approving is the approver's, under its
  own identity.

If kube-controller-manager still signs a name keyward serves, both sign and
the first certificate written wins: keyward logs once per name, at the
default verbosity, "Another signer wrote this CSR's certificate first" with
the other certificate's issuer, and counts it in ` + "`keyward_csr_outcomes_total`" + ` (outcome SignedElsewhere).
`
