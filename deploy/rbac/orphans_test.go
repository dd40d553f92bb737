package rbac

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// A component's grants left behind without its workload (the softhsm
// overlay's old token service RBAC) are named; a workload's own are not.
func TestOrphansNamesGrantsWithoutTheirWorkload(t *testing.T) {
	var objs []*unstructured.Unstructured
	for _, doc := range strings.Split(`apiVersion: apps/v1
kind: Deployment
metadata: {name: keyward-signer, namespace: keyward}
spec: {template: {spec: {serviceAccountName: keyward-signer}}}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: keyward-signer, namespace: keyward}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: keyward-token-service, namespace: keyward}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: keyward-token-service}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: keyward-token-service}
roleRef: {kind: ClusterRole, name: keyward-token-service}
subjects: [{kind: ServiceAccount, name: keyward-token-service, namespace: keyward}]
---
apiVersion: v1
kind: Pod
metadata: {name: keyward-test-signer, namespace: keyward}
spec: {serviceAccountName: keyward-test}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: keyward-test, namespace: keyward}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: nobody}`, "---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, u)
	}
	got := strings.Join(Orphans(objs), "\n")
	for _, want := range []string{"ServiceAccount keyward/keyward-token-service", "ClusterRoleBinding keyward-token-service binds", "ClusterRole nobody"} {
		if !strings.Contains(got, want) {
			t.Errorf("Orphans does not name %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "keyward-signer") {
		t.Errorf("Orphans names the signer's own grants:\n%s", got)
	}
	if strings.Contains(got, "keyward-test") {
		t.Errorf("Orphans names the ServiceAccount a bare Pod runs as:\n%s", got)
	}
}
