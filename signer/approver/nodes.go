package approver

import (
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"
)

// nodeIPIndex indexes Nodes by every address of theirs that parses as an
// IP, so that an IP SAN claimed by another Node is found without a scan.
const nodeIPIndex = "ip"

func indexNodeIPs(obj any) ([]string, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return nil, nil
	}
	var out []string
	for _, a := range n.Status.Addresses {
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			out = append(out, ip.Unmap().String())
		}
	}
	return out, nil
}

// nodeCache is the approver's view of the cluster's Nodes (an informer's
// indexer): one Node by name, and which Nodes list an IP.
type nodeCache struct{ store cache.Indexer }

func (n nodeCache) get(name string) (*corev1.Node, bool) {
	obj, ok, err := n.store.GetByKey(name)
	if err != nil || !ok {
		return nil, false
	}
	node, ok := obj.(*corev1.Node)
	return node, ok
}

// othersWithIP are the Nodes other than self that list ip among their
// addresses, whoever wrote it.
func (n nodeCache) othersWithIP(ip netip.Addr, self string) []string {
	objs, _ := n.store.ByIndex(nodeIPIndex, ip.Unmap().String())
	var out []string
	for _, o := range objs {
		if node, ok := o.(*corev1.Node); ok && node.Name != self {
			out = append(out, node.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TaintUninitialized is the taint kubelet registers a Node with under
// --cloud-provider=external; the cloud controller removes it when it has
// written the Node's addresses from the cloud's own record. A node may
// not remove its own taints (NodeRestriction).
const TaintUninitialized = "node.cloudprovider.kubernetes.io/uninitialized"

// uninitialized reports whether node's addresses are still only what the
// node registered with: the cloud controller has not initialized it.
func uninitialized(node *corev1.Node) bool {
	return slices.ContainsFunc(node.Spec.Taints, func(t corev1.Taint) bool { return t.Key == TaintUninitialized })
}

// nodeAddrIPs is node's InternalIP and ExternalIP addresses (those that
// parse), which an IP SAN must be among; none while the node is
// uninitialized.
func nodeAddrIPs(node *corev1.Node) []netip.Addr {
	if uninitialized(node) {
		return nil
	}
	var ips []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			ips = append(ips, ip.Unmap())
		}
	}
	return ips
}

// notOnNode is the message of an IP SAN not among nodeAddrIPs(node).
func notOnNode(ip netip.Addr, node *corev1.Node) string {
	if uninitialized(node) {
		return fmt.Sprintf("IP subjectAltName %s: Node %s still has taint %s, so its addresses are only what the node registered with; the cloud controller has not written them yet", ip, node.Name, TaintUninitialized)
	}
	return fmt.Sprintf("IP subjectAltName %s is not an InternalIP or ExternalIP address of Node %s", ip, node.Name)
}
