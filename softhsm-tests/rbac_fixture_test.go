package softhsmtests

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
const testOnlyGrants = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: keyward-softhsm-tests-trust-objects
rules:
- apiGroups: ["keyward.dev"]
  resources: ["authorities", "authorities/status"]
  verbs: ["patch"]
- apiGroups: ["certificates.k8s.io"]
  resources: ["clustertrustbundles"]
  verbs: ["get", "create", "patch", "delete"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: keyward-softhsm-tests-trust-objects
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: keyward-softhsm-tests-trust-objects
subjects:
- kind: ServiceAccount
  name: keyward-signer
  namespace: keyward
- kind: ServiceAccount
  name: keyward-token-service
  namespace: keyward
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: keyward-softhsm-tests-signer-names
rules:
- apiGroups: ["certificates.k8s.io"]
  resources: ["signers"]
  resourceNames: ["keyward.dev/*"]
  verbs: ["sign", "attest"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: keyward-softhsm-tests-signer-names
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: keyward-softhsm-tests-signer-names
subjects:
- kind: ServiceAccount
  name: keyward-signer
  namespace: keyward
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: keyward-softhsm-tests-approver-names
rules:
- apiGroups: ["certificates.k8s.io"]
  resources: ["signers"]
  resourceNames: ["kubernetes.io/kube-apiserver-client-kubelet", "kubernetes.io/kubelet-serving", "keyward.dev/*"]
  verbs: ["approve"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: keyward-softhsm-tests-approver-names
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: keyward-softhsm-tests-approver-names
subjects:
- kind: ServiceAccount
  name: keyward-approver
  namespace: keyward
---
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
subjects:
- kind: ServiceAccount
  name: keyward-signer
  namespace: keyward
- kind: ServiceAccount
  name: keyward-token-service
  namespace: keyward
`
