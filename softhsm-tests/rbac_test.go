package softhsmtests

import (
	"context"
	"path/filepath"
	"testing"

	authzv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/keyward/keyward/testsupport/controlplane"
)

// wantAllowed asks the apiserver's own authorizer (a SubjectAccessReview)
// whether user in groups may do attrs, and fails the test unless the answer
// is want.
func wantAllowed(t *testing.T, ctx context.Context, user string, groups []string, attrs authzv1.ResourceAttributes, want bool) {
	t.Helper()
	review, err := cp.AdminClient().AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{
		Spec: authzv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &attrs},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if review.Status.Allowed != want {
		t.Fatalf("allowed = %v, want %v (%s)", review.Status.Allowed, want, review.Status.Reason)
	}
}

// bindClusterRole binds the ClusterRole role to subjects under a unique
// name, until the test ends.
func bindClusterRole(t *testing.T, ctx context.Context, role string, subjects ...rbacv1.Subject) {
	t.Helper()
	admin := cp.AdminClient()
	name := uniqueName(t, "binding")
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   subjects,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

func groupSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.GroupKind, Name: name}
}

func userSubject(name string) rbacv1.Subject {
	return rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: name}
}

// serviceAccountKubeconfig writes a kubeconfig for service account sa in
// signerNamespace and returns its path.
func serviceAccountKubeconfig(t *testing.T, sa string) string {
	t.Helper()
	cfg, err := cp.ServiceAccountConfig(signerNamespace, sa)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := controlplane.WriteKubeconfig(cfg, sa, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// The shipped RBAC (deploy/kustomize/base/rbac.yaml) gives the signer's service
// account what the PodCertificateRequest signer and the trust publisher
// need (PodCertificateRequests, CertificateSigningRequests) and nothing
// more; the
// apiserver's own authorizer answers each question.
func TestSignerRBACIsExactlyTheShippedRole(t *testing.T) {
	ctx := testContext(t)
	user := "system:serviceaccount:" + signerNamespace + ":" + signerServiceAccount
	groups := []string{"system:serviceaccounts", "system:serviceaccounts:" + signerNamespace, "system:authenticated"}
	type attrs = authzv1.ResourceAttributes
	pcr := func(verb, sub string) attrs {
		return attrs{Group: "certificates.k8s.io", Resource: "podcertificaterequests", Subresource: sub, Verb: verb, Namespace: "any"}
	}
	signerVerb := func(verb, name string) attrs {
		return attrs{Group: "certificates.k8s.io", Resource: "signers", Verb: verb, Name: name}
	}
	ctb := func(verb string) attrs {
		return attrs{Group: "certificates.k8s.io", Resource: "clustertrustbundles", Verb: verb}
	}
	ctbNamed := func(verb, name string) attrs {
		return attrs{Group: "certificates.k8s.io", Resource: "clustertrustbundles", Verb: verb, Name: name}
	}
	authNamed := func(verb, sub, name string) attrs {
		return attrs{Group: "keyward.dev", Resource: "authorities", Subresource: sub, Verb: verb, Name: name}
	}
	csr := func(verb, sub string) attrs {
		return attrs{Group: "certificates.k8s.io", Resource: "certificatesigningrequests", Subresource: sub, Verb: verb}
	}
	auth := func(verb, sub string) attrs {
		return attrs{Group: "keyward.dev", Resource: "authorities", Subresource: sub, Verb: verb}
	}
	cases := []struct {
		name  string
		attrs attrs
		want  bool
	}{
		{"lists PodCertificateRequests", pcr("list", ""), true},
		{"watches PodCertificateRequests", pcr("watch", ""), true},
		{"gets a PodCertificateRequest", pcr("get", ""), true},
		{"updates a PodCertificateRequest's status", pcr("update", "status"), true},
		// The shipped role grants `sign` on the base's exact names;
		// "keyward.dev/*" here comes from TestMain's test-only grant for
		// per-test names (deploy/rbac proves the shipped role holds no
		// wildcard).
		{"signs for the base's keyward.dev/pod-identity", signerVerb("sign", "keyward.dev/pod-identity"), true},
		{"signs for the per-test keyward.dev/* names (test-only grant)", signerVerb("sign", "keyward.dev/*"), true},
		{"creates Events", attrs{Resource: "events", Verb: "create", Namespace: "any"}, true},
		{"updates its Lease", attrs{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: signerNamespace, Name: "keyward-signer"}, true},

		{"does not update a PodCertificateRequest's spec", pcr("update", ""), false},
		{"does not patch a PodCertificateRequest's status", pcr("patch", "status"), false},
		{"does not delete PodCertificateRequests", pcr("delete", ""), false},
		{"does not sign for a kubernetes.io signer", signerVerb("sign", "kubernetes.io/kube-apiserver-client-pod"), false},
		{"does not sign for another domain's signers", signerVerb("sign", "example.com/*"), false},
		// The trust publisher's grants (same identity).
		{"attests for the base's keyward.dev/pod-identity (publishes trust bundles)", signerVerb("attest", "keyward.dev/pod-identity"), true},
		{"attests for the per-test keyward.dev/* names (test-only grant)", signerVerb("attest", "keyward.dev/*"), true},
		// Writes on bundles and Authorities: the shipped role names the
		// base's own; keyward-softhsm-tests-trust-objects (test-only) adds
		// the per-test ones, so unnamed writes are allowed here.
		{"creates its own ClusterTrustBundle", ctbNamed("create", "keyward.dev:pod-identity:canary"), true},
		{"patches its own ClusterTrustBundle", ctbNamed("patch", "keyward.dev:pod-identity:live"), true},
		{"deletes its own ClusterTrustBundle", ctbNamed("delete", "keyward.dev:pod-identity:live"), true},
		{"creates the per-test ClusterTrustBundles (test-only grant)", ctb("create"), true},
		{"lists ClusterTrustBundles", ctb("list"), true},
		{"watches ClusterTrustBundles", ctb("watch"), true},
		{"does not update (replace) ClusterTrustBundles", ctb("update"), false},
		// CA generations (signer and trust publisher): read every
		// Authority, write status only by server-side apply (a patch).
		{"gets Authorities", auth("get", ""), true},
		{"lists Authorities", auth("list", ""), true},
		{"watches Authorities", auth("watch", ""), true},
		{"patches its own Authority (removes a used override)", authNamed("patch", "", "keyward.dev.pod-identity"), true},
		{"patches its own Authority's status", authNamed("patch", "status", "keyward.dev.pod-identity"), true},
		{"patches the per-test Authorities' status (test-only grant)", auth("patch", "status"), true},

		{"does not attest for another domain's signers", signerVerb("attest", "example.com/*"), false},
		{"does not attest for a kubernetes.io signer", signerVerb("attest", "kubernetes.io/kube-apiserver-client"), false},
		{"does not delete ClusterTrustBundles in bulk", ctb("deletecollection"), false},
		{"does not create Authorities", auth("create", ""), false},
		{"does not update an Authority's spec", auth("update", ""), false},
		{"does not delete Authorities", auth("delete", ""), false},
		{"does not update an Authority's status (applies it)", auth("update", "status"), false},
		// The CertificateSigningRequest signer: read CSRs, write their
		// status, never approve, never change a spec.
		{"lists CSRs", csr("list", ""), true},
		{"watches CSRs", csr("watch", ""), true},
		{"gets a CSR", csr("get", ""), true},
		{"updates a CSR's status", csr("update", "status"), true},
		{"does not approve CSRs", csr("update", "approval"), false},
		{"does not patch a CSR's approval", csr("patch", "approval"), false},
		{"does not update a CSR's spec", csr("update", ""), false},
		{"does not create CSRs", csr("create", ""), false},
		{"does not delete CSRs", csr("delete", ""), false},
		{"does not approve for keyward.dev signer names", signerVerb("approve", "keyward.dev/*"), false},
		{"does not sign for kubernetes.io/kubelet-serving without the documented extra grant", signerVerb("sign", "kubernetes.io/kubelet-serving"), false},
		{"does not read Secrets", attrs{Resource: "secrets", Verb: "get", Namespace: signerNamespace}, false},
		{"does not read Namespaces", attrs{Resource: "namespaces", Verb: "list"}, false},
		{"does not touch Leases elsewhere", attrs{Group: "coordination.k8s.io", Resource: "leases", Verb: "update", Namespace: "kube-system", Name: "kube-controller-manager"}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			wantAllowed(t, ctx, user, groups, tc.attrs, tc.want)
		})
	}
}
