package rbac

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Orphans lists, in a rendered manifest, the RBAC of components it does
// not run: ServiceAccounts no Deployment's, DaemonSet's or bare Pod's pod
// runs as,
// bindings to any other subject, and roles no binding names. A manifest
// that drops a component must drop its grants too. The CA administrator
// (component ca-admin) is the one identity no workload of the manifest
// runs as: people, or the Job of docs/production/ca-admin.md, use it on
// demand.
func Orphans(objs []*unstructured.Unstructured) []string {
	used := map[string]bool{} // namespace/name
	for _, u := range objs {
		if u.GetKind() == "ServiceAccount" && u.GetLabels()["app.kubernetes.io/component"] == "ca-admin" {
			used[u.GetNamespace()+"/"+u.GetName()] = true
		}
		var sa string
		switch u.GetKind() {
		case "Deployment", "DaemonSet":
			sa, _, _ = unstructured.NestedString(u.Object, "spec", "template", "spec", "serviceAccountName")
		case "Pod": // a bare pod, such as the chart's helm test
			sa, _, _ = unstructured.NestedString(u.Object, "spec", "serviceAccountName")
		default:
			continue
		}
		used[u.GetNamespace()+"/"+sa] = true
	}
	bound := map[string]bool{} // Kind/namespace/name of roles
	var problems []string
	for _, u := range objs {
		switch u.GetKind() {
		case "ServiceAccount":
			if !used[u.GetNamespace()+"/"+u.GetName()] {
				problems = append(problems, "ServiceAccount "+u.GetNamespace()+"/"+u.GetName()+" is no workload's")
			}
		case "RoleBinding", "ClusterRoleBinding":
			kind, _, _ := unstructured.NestedString(u.Object, "roleRef", "kind")
			name, _, _ := unstructured.NestedString(u.Object, "roleRef", "name")
			ns := ""
			if kind == "Role" {
				ns = u.GetNamespace()
			}
			bound[kind+"/"+ns+"/"+name] = true
			subjects, _, _ := unstructured.NestedSlice(u.Object, "subjects")
			for _, s := range subjects {
				m, _ := s.(map[string]any)
				if m["kind"] != "ServiceAccount" || !used[fmt.Sprint(m["namespace"])+"/"+fmt.Sprint(m["name"])] {
					problems = append(problems, fmt.Sprintf("%s %s binds %v %v/%v, no workload's", u.GetKind(), u.GetName(), m["kind"], m["namespace"], m["name"]))
				}
			}
		}
	}
	for _, u := range objs {
		if k := u.GetKind(); (k == "Role" || k == "ClusterRole") && !bound[k+"/"+u.GetNamespace()+"/"+u.GetName()] {
			problems = append(problems, k+" "+u.GetName()+" is bound to nobody")
		}
	}
	return problems
}
