package softhsmtests

import (
	"testing"

	"github.com/keyward/keyward/deploy"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The shipped signer Deployment is accepted by the apiserver, and the
// configuration its ConfigMap is generated from passes keyward's own
// validation. (deploy/kustomize's tests build the base and every overlay
// and check replicas per backend.)
func TestDeployManifestsApplyAndConfigValidates(t *testing.T) {
	ctx := testContext(t)
	manifest, err := deploy.Base.ReadFile("kustomize/base/signer.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying deploy/kustomize/base/signer.yaml: %v", err)
	}
	data, err := deploy.Base.ReadFile("kustomize/base/signer-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := config.Parse(data); err != nil {
		t.Fatalf("the shipped configuration is invalid: %v", err)
	}
	if _, err := cp.AdminClient().AppsV1().Deployments("keyward").Get(ctx, "keyward-signer", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
}
