package softhsmtests

import "strings"

// The tests mint signer names and Lease names per test (keyward.dev/pod-id-<suffix>,
// ha-<suffix>), so no fixed list exists to render exact grants from. The
// shipped, generated deploy/kustomize/base/rbac.yaml is applied as is; these
// test-only grants add, for the same identities, what the per-test names
// need. deploy/rbac's TestRenderedRBACHoldsExactlyTheExpectedPermissions
// proves the shipped RBAC itself (exact names, no domain wildcards).
//
// The shipped RBAC grants writes on Authorities and ClusterTrustBundles by
// exact name (resourceNames cannot hold a pattern), so the per-test
// Authorities and bundles need keyward-softhsm-tests-trust-objects: the
// unnarrowed writes the shipped role no longer has. deploy/rbac's
// TestTokenServiceCannotRewriteAnotherSignersTrust and the isolation
// matrix (rbac.IsolationChecks) prove the shipped RBAC without it.
var testOnlyGrants = strings.Join([]string{
	clusterGrant("keyward-softhsm-tests-trust-objects", `
- apiGroups: ["keyward.dev"]
  resources: ["authorities", "authorities/status"]
  verbs: ["patch"]
- apiGroups: ["certificates.k8s.io"]
  resources: ["clustertrustbundles"]
  verbs: ["get", "create", "patch", "delete"]`, "keyward-signer", "keyward-token-service"),
	clusterGrant("keyward-softhsm-tests-signer-names", `
- apiGroups: ["certificates.k8s.io"]
  resources: ["signers"]
  resourceNames: ["keyward.dev/*"]
  verbs: ["sign", "attest"]`, "keyward-signer"),
	clusterGrant("keyward-softhsm-tests-approver-names", `
- apiGroups: ["certificates.k8s.io"]
  resources: ["signers"]
  resourceNames: ["kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving", "keyward.dev/*"]
  verbs: ["approve"]`, "keyward-approver"),
	`
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: keyward-softhsm-tests-leases
  namespace: keyward
rules:
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "update"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: keyward-softhsm-tests-leases
  namespace: keyward
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: keyward-softhsm-tests-leases
subjects:` + subjects("keyward-signer", "keyward-token-service"),
}, "\n---")

// clusterGrant is a ClusterRole name with rules (YAML list items) and its
// ClusterRoleBinding of the same name to keyward's ServiceAccounts sas.
func clusterGrant(name, rules string, sas ...string) string {
	return `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: ` + name + `
rules:` + rules + `
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: ` + name + `
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: ` + name + `
subjects:` + subjects(sas...)
}

// subjects is a binding's subjects list: keyward's ServiceAccounts sas.
func subjects(sas ...string) string {
	var b strings.Builder
	for _, sa := range sas {
		b.WriteString("\n- kind: ServiceAccount\n  name: " + sa + "\n  namespace: keyward")
	}
	return b.String()
}
