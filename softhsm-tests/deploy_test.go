package softhsmtests

import (
	"strings"
	"testing"

	"github.com/keyward/keyward/deploy"
	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/signer/config"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The shipped manifests are accepted by the apiserver, and the
// configuration in the ConfigMap passes keyward's own validation.
func TestDeployManifestsApplyAndConfigValidates(t *testing.T) {
	ctx := testContext(t)
	manifest, err := deploy.Base.ReadFile("kustomize/base/signer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying deploy/kustomize/base/signer.yaml: %v", err)
	}
	var cm *corev1.ConfigMap
	cm, err = cp.AdminClient().CoreV1().ConfigMaps("keyward").Get(ctx, "keyward-signer-config", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse([]byte(cm.Data["config.yaml"])); err != nil {
		t.Fatalf("the shipped configuration is invalid: %v", err)
	}
	// The shipped example's CA key is SoftHSM2 (its Authority names it): a
	// token is files on one machine, and two replicas would each need
	// their own copy of the CA key.
	dep, err := cp.AdminClient().AppsV1().Deployments("keyward").Get(ctx, "keyward-signer", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(manifest), "SoftHSM2") || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 1 {
		t.Errorf("the shipped example uses a SoftHSM2 key but the Deployment does not run exactly 1 replica")
	}
}
