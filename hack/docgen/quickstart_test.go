package docgen

import (
	"regexp"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	signerconfig "github.com/keyward/keyward/signer/config"
)

// The quick start's pod is a valid Pod (strictly decoded) whose
// podCertificate asks for a key type a signer issues and whose
// clusterTrustBundle selects the live bundle of the same signer name.
func TestQuickstartPodIsValid(t *testing.T) {
	doc := readDoc(t, "quickstart.md")
	m := regexp.MustCompile("(?s)```yaml\\n(# demo-pod.yaml\\n.*?)\\n```").FindStringSubmatch(doc)
	if m == nil {
		t.Fatal("docs/quickstart.md has no ```yaml block starting with # demo-pod.yaml")
	}
	var pod corev1.Pod
	if err := yaml.UnmarshalStrict([]byte(m[1]), &pod); err != nil {
		t.Fatalf("the quick start's pod does not decode: %v", err)
	}
	var pc *corev1.PodCertificateProjection
	var ctb *corev1.ClusterTrustBundleProjection
	for _, v := range pod.Spec.Volumes {
		if v.Projected == nil {
			continue
		}
		for _, s := range v.Projected.Sources {
			if s.PodCertificate != nil {
				pc = s.PodCertificate
			}
			if s.ClusterTrustBundle != nil {
				ctb = s.ClusterTrustBundle
			}
		}
	}
	if pc == nil || ctb == nil {
		t.Fatalf("the pod needs a podCertificate and a clusterTrustBundle source, has %v and %v", pc, ctb)
	}
	if !signerconfig.ValidSignerName(pc.SignerName) || ctb.SignerName == nil || *ctb.SignerName != pc.SignerName {
		t.Errorf("signer names: podCertificate %q, clusterTrustBundle %v", pc.SignerName, ctb.SignerName)
	}
	if !slices.Contains(signerconfig.AllKeyTypes(), pc.KeyType) {
		t.Errorf("keyType %q is none of %v", pc.KeyType, signerconfig.AllKeyTypes())
	}
	if ctb.LabelSelector == nil || ctb.LabelSelector.MatchLabels["keyward.dev/cluster-trust-bundle-version"] != "live" {
		t.Errorf("the clusterTrustBundle source must select the live bundle, selects %v", ctb.LabelSelector)
	}
}
