package approver

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"

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

// trustedAddressTypes are the status.addresses entry types (the list's
// map key) whose address one of managers owns in n's managedFields. A
// manager's name is whatever its writer called itself: this says which
// manager wrote an entry, not who.
func trustedAddressTypes(n *corev1.Node, managers []string) map[corev1.NodeAddressType]bool {
	out := map[corev1.NodeAddressType]bool{}
	for _, mf := range n.ManagedFields {
		if !slices.Contains(managers, mf.Manager) || mf.FieldsV1 == nil {
			continue
		}
		var fields struct {
			Status struct {
				Addresses map[string]map[string]any `json:"f:addresses"`
			} `json:"f:status"`
		}
		if json.Unmarshal(mf.FieldsV1.Raw, &fields) != nil {
			continue
		}
		for key, entry := range fields.Status.Addresses {
			raw, ok := strings.CutPrefix(key, "k:")
			if !ok {
				continue
			}
			var k struct {
				Type corev1.NodeAddressType `json:"type"`
			}
			if _, owns := entry["f:address"]; owns && json.Unmarshal([]byte(raw), &k) == nil && k.Type != "" {
				out[k.Type] = true
			}
		}
	}
	return out
}

// nodeAddrIPs is node's InternalIP and ExternalIP addresses (those that
// parse), which an IP SAN must be among; with managers set, only those
// whose entry one of them owns.
func nodeAddrIPs(node *corev1.Node, managers []string) []netip.Addr {
	var trusted map[corev1.NodeAddressType]bool
	if len(managers) > 0 {
		trusted = trustedAddressTypes(node, managers)
	}
	var ips []netip.Addr
	for _, a := range node.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP || trusted != nil && !trusted[a.Type] {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			ips = append(ips, ip.Unmap())
		}
	}
	return ips
}
