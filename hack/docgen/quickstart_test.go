package docgen

import (
	"maps"
	"regexp"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
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
	if !signerconfig.ValidSignerName(pc.SignerName) {
		t.Errorf("podCertificate signer name %q", pc.SignerName)
	}
	// The live bundle by signer name and the live label, not by name:
	// kubelet v1.37 keeps a by-name projection stale for its cache TTL
	// (docs/rotation.md; node-tests TestCARotationUnderLiveMTLS).
	live := map[string]string{v1alpha1.BundleVersionLabel("keyward.dev"): "live"}
	if ctb.Name != nil || ctb.SignerName == nil || *ctb.SignerName != pc.SignerName || ctb.LabelSelector == nil ||
		!maps.Equal(ctb.LabelSelector.MatchLabels, live) || len(ctb.LabelSelector.MatchExpressions) > 0 {
		t.Errorf("the clusterTrustBundle source must select %s's bundles labelled %v and nothing else: %+v", pc.SignerName, live, ctb)
	}
	if !slices.Contains(signerconfig.AllKeyTypes(), pc.KeyType) {
		t.Errorf("keyType %q is none of %v", pc.KeyType, signerconfig.AllKeyTypes())
	}
}
