package softhsmtests

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
	"github.com/keyward/keyward/testsupport/controlplane"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

// addressNode makes a Node and returns its name; the Node is deleted when
// the test ends.
func addressNode(t *testing.T, ctx context.Context, prefix string) string {
	t.Helper()
	name := uniqueName(t, prefix)
	if _, err := cp.AdminClient().CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return name
}

// writeAddresses writes Node name's status.addresses through client (a
// node writing its own status, or another identity), as field manager
// manager ("" for the client's default).
func writeAddresses(t *testing.T, ctx context.Context, client kubernetes.Interface, name, manager string, addrs ...corev1.NodeAddress) *corev1.Node {
	t.Helper()
	var out *corev1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = addrs
		out, err = client.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{FieldManager: manager})
		return err
	})
	if err != nil {
		t.Fatalf("writing Node %s's status.addresses: %v", name, err)
	}
	return out
}

func addr(typ corev1.NodeAddressType, a string) corev1.NodeAddress {
	return corev1.NodeAddress{Type: typ, Address: a}
}

// waitNotAutoApproved waits for the approver's NotAutoApproved Event on
// CSR name (written after it looked at the CSR and left it for a human)
// and checks that the CSR is still undecided and the Event names naming.
func waitNotAutoApproved(t *testing.T, ctx context.Context, name, naming string) {
	t.Helper()
	admin := cp.AdminClient()
	var msg string
	err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		evs, err := admin.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == approver.ReasonNotAutoApproved {
				msg = e.Message
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s Event on CSR %s: %v", approver.ReasonNotAutoApproved, name, err)
	}
	if !strings.Contains(msg, naming) {
		t.Errorf("Event message %q does not name %q", msg, naming)
	}
	c, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Status.Conditions) > 0 {
		t.Errorf("CSR %s has conditions %+v, want it left undecided for a human", name, c.Status.Conditions)
	}
}

// A node writes into its own Node status (which NodeRestriction allows)
// a wildcard Hostname, node n2's DNS name and n2's IP, then asks for a
// kubelet serving certificate naming them. keyward's approver, with the
// shipped RBAC and suffixes and ranges that cover every one of those
// names, approves none of it: the wildcard and n2's name and address are
// Denied naming the SAN, an address on no Node is left for a human, and
// only the node's own name and address are approved.
func TestNodeCannotObtainServingCertificateForAddressesItWrote(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	installApproverRBAC(t, ctx)
	letNodesRequest(t, ctx)
	admin := cp.AdminClient()

	n1, n2 := addressNode(t, ctx, "n1"), addressNode(t, ctx, "n2")
	writeAddresses(t, ctx, admin, n2, "kubelet",
		addr(corev1.NodeHostName, n2), addr(corev1.NodeInternalDNS, n2+".nodes.example.com"), addr(corev1.NodeInternalIP, "10.61.0.6"))
	n1CS := nodeClient(t, n1)
	// NodeRestriction lets the node write all of this into its own status.
	writeAddresses(t, ctx, n1CS, n1, "",
		addr(corev1.NodeHostName, "*.nodes.example.com"), addr(corev1.NodeHostName, n1),
		addr(corev1.NodeInternalDNS, n2+".nodes.example.com"), addr(corev1.NodeInternalDNS, n1+".nodes.example.com"),
		addr(corev1.NodeInternalIP, "10.61.0.6"), addr(corev1.NodeInternalIP, "10.61.0.5"))

	startApprover(t, `- name: kubernetes.io/kubelet-serving
  profile: kubeletServing
  approval: {allowedDNSSuffixes: [nodes.example.com], allowedIPRanges: [10.0.0.0/8]}
`)
	denied := []struct {
		name   string
		dns    []string
		ips    []string
		naming string
	}{
		{"a wildcard the node wrote as its Hostname is denied naming it", []string{"*.nodes.example.com"}, nil, "*.nodes.example.com"},
		{"another node's DNS name the node wrote as its InternalDNS is denied naming it and that node", []string{n2 + ".nodes.example.com"}, nil, "Node " + n2},
		{"another node's IP the node wrote as its InternalIP is denied naming it and that node", []string{n1}, []string{"10.61.0.6"}, "10.61.0.6 is an address of Node " + n2},
		{"the issue's request (wildcard, n2's name and IP at once) is denied naming the wildcard", []string{"*.nodes.example.com", n2 + ".nodes.example.com"}, []string{"10.61.0.6"}, "*.nodes.example.com"},
	}
	for _, tc := range denied {
		t.Run(tc.name, func(t *testing.T) {
			c := createTestCSR(t, ctx, n1CS, certv1.KubeletServingSignerName, servingRequest(t, n1, tc.dns, tc.ips), servingUsages)
			cond := waitDecided(t, ctx, c.Name)
			if cond.Type != certv1.CertificateDenied || cond.Reason != approver.ReasonSANNotAllowed {
				t.Fatalf("%s %s: %s, want Denied %s", cond.Type, cond.Reason, cond.Message, approver.ReasonSANNotAllowed)
			}
			if !strings.Contains(cond.Message, tc.naming) {
				t.Errorf("message %q does not name %q", cond.Message, tc.naming)
			}
		})
	}
	t.Run("a DNS name that is neither the node's name nor under it is left for a human", func(t *testing.T) {
		c := createTestCSR(t, ctx, n1CS, certv1.KubeletServingSignerName, servingRequest(t, n1, []string{"kube-apiserver.example.com"}, nil), servingUsages)
		waitNotAutoApproved(t, ctx, c.Name, "kube-apiserver.example.com")
	})
	t.Run("the node's own name, its name under the suffix and its own address are approved", func(t *testing.T) {
		c := createTestCSR(t, ctx, n1CS, certv1.KubeletServingSignerName, servingRequest(t, n1, []string{n1, n1 + ".nodes.example.com"}, []string{"10.61.0.5"}), servingUsages)
		if cond := waitDecided(t, ctx, c.Name); cond.Type != certv1.CertificateApproved {
			t.Fatalf("%s %s: %s, want Approved", cond.Type, cond.Reason, cond.Message)
		}
	})
}

// Approval is no excuse: a kubelet serving CSR naming a wildcard, approved
// by a human, is Failed by the signer naming the SAN, never signed.
func TestSignerFailsApprovedWildcardServingCSR(t *testing.T) {
	ctx := testContext(t)
	serving := certv1.KubeletServingSignerName
	keyURI, caFile, _ := caInToken(t, uniqueName(t, "serving-ca"))
	activeAuthority(t, serving, keyURI, caFile)
	defer grantSign(t, ctx, serving)()
	letNodesRequest(t, ctx)
	runSigner(t, baseConfig(t, config.Signer{Name: serving, Profile: config.ProfileKubeletServing}), "wildcard-signer")

	node := uniqueName(t, "node")
	for _, dns := range [][]string{{"*.nodes.example.com"}, {node, "a.*.example.com"}, {"*"}} {
		t.Run(strings.Join(dns, ","), func(t *testing.T) {
			c := newCSR(t, ctx, nodeClient(t, node), serving, x509.CertificateRequest{
				Subject:  pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}},
				DNSNames: dns,
			}, usages(certv1.UsageDigitalSignature, certv1.UsageServerAuth), nil)
			approve(t, ctx, c)
			got := waitCSRDone(t, ctx, c)
			f := failedCondition(got)
			if f == nil || f.Reason != csr.ReasonSANNotPermitted || len(got.Status.Certificate) > 0 {
				t.Fatalf("conditions %+v, certificate %d bytes; want Failed %s and no certificate", got.Status.Conditions, len(got.Status.Certificate), csr.ReasonSANNotPermitted)
			}
			if want := dns[len(dns)-1]; !strings.Contains(f.Message, want) {
				t.Errorf("message %q does not name %q", f.Message, want)
			}
		})
	}
}

// nodeAddressLockFile is the shipped ValidatingAdmissionPolicy (the Helm
// chart's copy is checked equal by make lint).
var nodeAddressLockFile = filepath.Join("..", "deploy", "kustomize", "components", "node-address-lock", "policy.yaml")

// installNodeAddressLock applies the shipped node address lock until the
// test ends, and waits until the apiserver enforces it (a policy takes
// effect once its binding is compiled, not at create).
func installNodeAddressLock(t *testing.T, ctx context.Context) {
	t.Helper()
	manifest, err := os.ReadFile(nodeAddressLockFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying %s: %v", nodeAddressLockFile, err)
	}
	t.Cleanup(func() {
		adm := cp.AdminClient().AdmissionregistrationV1()
		_ = adm.ValidatingAdmissionPolicyBindings().Delete(context.Background(), "keyward-node-address-lock", metav1.DeleteOptions{})
		_ = adm.ValidatingAdmissionPolicies().Delete(context.Background(), "keyward-node-address-lock", metav1.DeleteOptions{})
	})
	probe := addressNode(t, ctx, "lock-probe")
	tries := 0
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, probe, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		tries++ // a new address each time: an unchanged one is allowed
		n.Status.Addresses = []corev1.NodeAddress{addr(corev1.NodeInternalIP, fmt.Sprintf("10.63.255.%d", tries%250+1))}
		_, err = nodeClient(t, probe).CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return apierrors.IsForbidden(err) || apierrors.IsInvalid(err), nil
	})
	if err != nil {
		t.Fatalf("the node address lock is not enforced 30s after it was applied: %v", err)
	}
}

// The shipped node address lock (deploy/kustomize/components/node-address-lock,
// Helm approver.nodeAddressLock) is the way not to take a node's own word
// for its addresses, enforced by the real apiserver together with
// NodeRestriction:
//   - a node cannot change its own status.addresses (the forgery of
//     TestNodeCannotObtainServingCertificateForAddressesItWrote);
//   - it cannot register with IP addresses unless tainted
//     node.cloudprovider.kubernetes.io/uninitialized, and NodeRestriction
//     keeps it from removing that taint;
//   - its ordinary status updates (conditions, same addresses) pass;
//   - the cloud controller (here an admin identity) writes addresses and
//     removes the taint.
//
// The approver holds an IP SAN while the Node is uninitialized and
// approves it once the cloud controller has written it.
func TestNodeAddressLock(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	installApproverRBAC(t, ctx)
	letNodesRequest(t, ctx)
	installNodeAddressLock(t, ctx)
	admin := cp.AdminClient()

	t.Run("a node cannot change its own addresses", func(t *testing.T) {
		name := addressNode(t, ctx, "locked")
		n, err := nodeClient(t, name).CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.63.0.9"), addr(corev1.NodeHostName, "*.nodes.example.com")}
		_, err = nodeClient(t, name).CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "may not change its own status.addresses") {
			t.Fatalf("a node writing its own addresses: %v, want refused by keyward-node-address-lock", err)
		}
		// Its ordinary status update (a condition, addresses untouched) passes.
		n, _ = nodeClient(t, name).CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		if _, err := nodeClient(t, name).CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("a node's status update that keeps its addresses: %v", err)
		}
	})

	t.Run("a node registers IP addresses only while uninitialized, and cannot lift the taint", func(t *testing.T) {
		name := uniqueName(t, "register")
		t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{addr(corev1.NodeInternalIP, "10.63.0.20")}}}
		_, err := nodeClient(t, name).CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
		if !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "may register IP addresses only with taint") {
			t.Fatalf("a node registering with an IP and no taint: %v, want refused by keyward-node-address-lock", err)
		}
		node.Spec.Taints = []corev1.Taint{{Key: approver.TaintUninitialized, Value: "true", Effect: corev1.TaintEffectNoSchedule}}
		if _, err := nodeClient(t, name).CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatalf("a node registering with an IP under the uninitialized taint (kubelet --cloud-provider=external): %v", err)
		}
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := nodeClient(t, name).CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = nil
			_, err = nodeClient(t, name).CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if !apierrors.IsForbidden(err) {
			t.Fatalf("a node removing its own uninitialized taint: %v, want Forbidden (NodeRestriction)", err)
		}

		startApprover(t, `- name: kubernetes.io/kubelet-serving
  profile: kubeletServing
  approval: {allowedIPRanges: [10.63.0.0/16]}
`)
		held := createTestCSR(t, ctx, nodeClient(t, name), certv1.KubeletServingSignerName, servingRequest(t, name, []string{name}, []string{"10.63.0.20"}), servingUsages)
		waitNotAutoApproved(t, ctx, held.Name, approver.TaintUninitialized)

		// The cloud controller initializes the Node: the cloud's address,
		// taint removed (an identity other than the node's).
		err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
			n, err := admin.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			n.Spec.Taints = nil
			_, err = admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		writeAddresses(t, ctx, admin, name, "cloud-controller-manager", addr(corev1.NodeInternalIP, "10.63.0.21"))
		waitNodeAddress(t, ctx, name, "10.63.0.21")
		// The approver's Node informer follows the apiserver by a watch
		// event; a CSR it sees first would be held, not retried.
		time.Sleep(time.Second)
		ok := createTestCSR(t, ctx, nodeClient(t, name), certv1.KubeletServingSignerName, servingRequest(t, name, []string{name}, []string{"10.63.0.21"}), servingUsages)
		if cond := waitDecided(t, ctx, ok.Name); cond.Type != certv1.CertificateApproved {
			t.Fatalf("the cloud controller's address after initialization: %s %s: %s, want Approved", cond.Type, cond.Reason, cond.Message)
		}
		stale := createTestCSR(t, ctx, nodeClient(t, name), certv1.KubeletServingSignerName, servingRequest(t, name, []string{name}, []string{"10.63.0.20"}), servingUsages)
		waitNotAutoApproved(t, ctx, stale.Name, "10.63.0.20")
	})
}

// waitNodeAddress waits until the approver can have seen ip on Node name
// (the apiserver serves it; the approver's informer follows within its
// watch latency, which waitDecided's retry covers).
func waitNodeAddress(t *testing.T, ctx context.Context, name, ip string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		n, err := cp.AdminClient().CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, a := range n.Status.Addresses {
			if a.Address == ip {
				return len(n.Spec.Taints) == 0, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("Node %s never showed address %s untainted: %v", name, ip, err)
	}
}

// A newcomer's approver RBAC without list/watch on nodes: kubelet client
// CSRs are still approved (they need no Node), while a serving CSR waits
// undecided instead of being decided on an empty Node cache. Once the
// grant is back, the serving CSR is decided.
func TestApproverWithoutNodesGrantStillApprovesClientCSRs(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	installApproverRBAC(t, ctx)
	t.Cleanup(func() { installApproverRBAC(t, context.Background()) })
	admin := cp.AdminClient()
	role, err := admin.RbacV1().ClusterRoles().Get(ctx, "keyward-approver", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var kept []rbacv1.PolicyRule
	for _, r := range role.Rules {
		if !slices.Contains(r.Resources, "nodes") {
			kept = append(kept, r)
		}
	}
	role.Rules = kept
	if _, err := admin.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cfg, err := cp.ServiceAccountConfig(signerNamespace, approverServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	waitDenied(t, ctx, cfg, authzv1.ResourceAttributes{Resource: "nodes", Verb: "list"})

	letNodesRequest(t, ctx)
	bindClusterRole(t, ctx, "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", groupSubject("system:nodes"))
	node := addressNode(t, ctx, "nogrant")
	writeAddresses(t, ctx, admin, node, "", addr(corev1.NodeInternalIP, "10.64.0.5"))
	startApprover(t, `- name: kubernetes.io/kube-apiserver-client-kubelet
  profile: kubeAPIServerClientKubelet
- name: kubernetes.io/kubelet-serving
  profile: kubeletServing
  approval: {allowedIPRanges: [10.64.0.0/16]}
`)
	serving := createTestCSR(t, ctx, nodeClient(t, node), certv1.KubeletServingSignerName, servingRequest(t, node, []string{node}, []string{"10.64.0.5"}), servingUsages)
	client := createTestCSR(t, ctx, nodeClient(t, node), certv1.KubeAPIServerClientKubeletSignerName,
		pemCSR(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}), clientUsages)
	if cond := waitDecided(t, ctx, client.Name); cond.Type != certv1.CertificateApproved {
		t.Fatalf("kubelet client CSR without the approver's nodes grant: %s %s: %s, want Approved", cond.Type, cond.Reason, cond.Message)
	}
	got, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, serving.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) != 0 {
		t.Fatalf("a serving CSR was decided on an unsynced Node cache: %+v", got.Status.Conditions)
	}
	installApproverRBAC(t, ctx)
	if cond := waitDecided(t, ctx, serving.Name); cond.Type != certv1.CertificateApproved {
		t.Fatalf("serving CSR once the grant is back: %s %s: %s, want Approved", cond.Type, cond.Reason, cond.Message)
	}
}
