package softhsmtests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/testsupport/controlplane"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
)

// registryAudience is the token service's audience in the shipped examples.
const registryAudience = "keyward.dev/registry"

var nodeRBACFile = filepath.Join("..", "deploy", "examples", "registry-credentials", "node-rbac.yaml")

// TestNodeTokenAudienceNeedsTheShippedNodeRBAC proves against the real
// apiserver (Node,RBAC + NodeRestriction) what kubelet meets when it asks
// for the credential provider's token: a pod-bound token for an audience no
// pod volume names is refused to the node (Forbidden, NodeRestriction's
// audience check) until node-rbac.yaml is applied, allowed after, and still
// refused for a pod that runs on another node.
//
// node-rbac.yaml binds the group system:nodes cluster-wide, so the test
// removes it before it starts and when it ends; it must not run in parallel
// with a test that relies on the binding.
func TestNodeTokenAudienceNeedsTheShippedNodeRBAC(t *testing.T) {
	ctx := testContext(t)
	manifest, err := os.ReadFile(nodeRBACFile)
	if err != nil {
		t.Fatal(err)
	}
	admin := cp.AdminClient()
	removeNodeRBAC(t, ctx, admin, manifest)
	t.Cleanup(func() { removeNodeRBAC(t, context.WithoutCancel(ctx), admin, manifest) })

	nodeA, nodeB := uniqueName(t, "node-a"), uniqueName(t, "node-b")
	// The pod mounts a podCertificate volume only: no volume references the
	// registry audience, so NodeRestriction asks the authorizer.
	mine := podOnNode(t, ctx, nodeA, "keyward.dev/unrelated")
	// Same namespace and service account, on node B: node A's Node
	// authorization covers the service account (its own pod uses it), so
	// the request reaches NodeRestriction's pod-binding check.
	theirs, err := controlplane.CreateWorkload(ctx, admin, controlplane.Workload{
		Namespace: mine.Pod.Namespace, Node: nodeB, ServiceAccount: mine.ServiceAccount.Name,
		Pod: "other", SignerNames: []string{"keyward.dev/unrelated"},
	})
	if err != nil {
		t.Fatal(err)
	}
	kubelet := nodeClient(t, nodeA)

	// Without the binding: Forbidden, and (once the Node authorizer's graph
	// has the pod) for the audience, in NodeRestriction's words.
	err = waitTokenError(ctx, kubelet, mine, func(err error) bool {
		return strings.Contains(err.Error(), fmt.Sprintf("is not authorized to request tokens for audience %q", registryAudience))
	})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("without node-rbac.yaml: %v, want Forbidden for the audience", err)
	}
	t.Logf("without node-rbac.yaml: %v", err)

	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying %s: %v", nodeRBACFile, err)
	}

	// With it: allowed (once RBAC's informer has the binding), and the
	// token is the pod-bound token for the audience the token service wants.
	tr, err := waitToken(ctx, kubelet, mine)
	if err != nil {
		t.Fatalf("with node-rbac.yaml: %v", err)
	}
	review, err := admin.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{registryAudience}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st := review.Status
	wantUser := "system:serviceaccount:" + mine.Pod.Namespace + ":" + mine.ServiceAccount.Name
	if !st.Authenticated || st.User.Username != wantUser || !slices.Contains(st.Audiences, registryAudience) ||
		!slices.Contains(st.User.Extra["authentication.kubernetes.io/pod-uid"], string(mine.Pod.UID)) {
		t.Errorf("the node's token reviews as %+v; want %s, audience %s, bound to pod %s", st, wantUser, registryAudience, mine.Pod.UID)
	}

	// A pod on another node: still Forbidden, the binding notwithstanding.
	err = waitTokenError(ctx, kubelet, theirs, func(err error) bool {
		return strings.Contains(err.Error(), "bound to a pod scheduled on a different node")
	})
	if !apierrors.IsForbidden(err) {
		t.Fatalf("another node's pod with node-rbac.yaml: %v, want Forbidden", err)
	}
	t.Logf("another node's pod: %v", err)
}

// requestToken asks, as kubelet does for a credential provider, for a token
// of w's service account bound to w's pod, for the registry audience
// (expirationSeconds left to the apiserver's default, as kubelet leaves it).
func requestToken(ctx context.Context, kubelet kubernetes.Interface, w *controlplane.WorkloadObjects) (*authnv1.TokenRequest, error) {
	return kubelet.CoreV1().ServiceAccounts(w.Pod.Namespace).CreateToken(ctx, w.ServiceAccount.Name, &authnv1.TokenRequest{
		ObjectMeta: metav1.ObjectMeta{UID: w.ServiceAccount.UID},
		Spec: authnv1.TokenRequestSpec{
			Audiences: []string{registryAudience},
			BoundObjectRef: &authnv1.BoundObjectReference{
				APIVersion: "v1", Kind: "Pod", Name: w.Pod.Name, UID: w.Pod.UID,
			},
		},
	}, metav1.CreateOptions{})
}

var errTokenIssued = errors.New("the apiserver issued the token")

// waitTokenError requests a token until the refusal is the one settled
// (the authorizers' caches have caught up) and returns that error; a token
// issued at any point is errTokenIssued.
func waitTokenError(ctx context.Context, kubelet kubernetes.Interface, w *controlplane.WorkloadObjects, settled func(error) bool) error {
	for {
		_, err := requestToken(ctx, kubelet, w)
		if err == nil {
			return errTokenIssued
		}
		if settled(err) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("last refusal %v (waiting: %w)", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitToken requests a token until it is issued.
func waitToken(ctx context.Context, kubelet kubernetes.Interface, w *controlplane.WorkloadObjects) (*authnv1.TokenRequest, error) {
	for {
		tr, err := requestToken(ctx, kubelet, w)
		if err == nil {
			return tr, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("last refusal %v (waiting: %w)", err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// removeNodeRBAC deletes the ClusterRoles and ClusterRoleBindings the
// manifest names.
func removeNodeRBAC(t *testing.T, ctx context.Context, admin kubernetes.Interface, manifest []byte) {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatalf("decoding %s: %v", nodeRBACFile, err)
		}
		var err error
		switch obj.GetKind() {
		case "ClusterRole":
			err = admin.RbacV1().ClusterRoles().Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
		case "ClusterRoleBinding":
			err = admin.RbacV1().ClusterRoleBindings().Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
		case "":
			continue
		default:
			t.Fatalf("%s holds a %s; the test removes only cluster roles and bindings", nodeRBACFile, obj.GetKind())
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("removing %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}
