package helm

import (
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	signerconfig "github.com/keyward/keyward/signer/config"
)

// Each backend shapes the signer as its production guide says: softhsm
// runs one replica of the -softhsm image on the token's PVC with the PIN
// from keyward-softhsm; pkcs11 mounts the PIN Secret and the vendor's
// library (the only module allowed); the KMS backends mount no Secret at
// all and carry their cloud identity on the ServiceAccount.
func TestBackendsShapeTheSigner(t *testing.T) {
	all := samples(t)
	cases := []struct {
		sample       string
		replicas     int32
		imageSuffix  string
		secrets      []string // Secret volumes of the signer pod
		pvc          bool
		modules      []string // backends.pkcs11.allowedModules
		saAnnotation string
	}{
		{sample: "softhsm", replicas: 1, imageSuffix: "-softhsm", secrets: []string{"keyward-softhsm"}, pvc: true},
		{sample: "pkcs11", replicas: 3, secrets: []string{"hsm-client", "keyward-hsm-pin"}, modules: []string{"/opt/hsm/libvendor-pkcs11.so"}},
		{sample: "gcpkms", replicas: 2, saAnnotation: "iam.gke.io/gcp-service-account"},
		{sample: "awskms", replicas: 2, saAnnotation: "eks.amazonaws.com/role-arn"},
	}
	for _, tc := range cases {
		t.Run("the "+tc.sample+" sample", func(t *testing.T) {
			objs := objects(t, mustTemplate(t, all[tc.sample]))
			u := find(objs, "Deployment", "keyward-signer")
			if u == nil {
				t.Fatal("no signer Deployment")
			}
			pod := podTemplates(t, objs)["keyward-signer"]
			if got := convert[appsv1.Deployment](t, u).Spec.Replicas; got == nil || *got != tc.replicas {
				t.Errorf("replicas %v, want %d", got, tc.replicas)
			}
			image := pod.Spec.Containers[0].Image
			if strings.HasSuffix(image, "-softhsm") != (tc.imageSuffix == "-softhsm") {
				t.Errorf("image %s, want suffix %q", image, tc.imageSuffix)
			}
			var secrets []string
			pvc := false
			for _, v := range pod.Spec.Volumes {
				if v.Secret != nil {
					secrets = append(secrets, v.Secret.SecretName)
				}
				if v.PersistentVolumeClaim != nil {
					pvc = v.PersistentVolumeClaim.ClaimName == "keyward-softhsm-tokens" && find(objs, "PersistentVolumeClaim", "keyward-softhsm-tokens") != nil
				}
			}
			slices.Sort(secrets)
			secrets = slices.Compact(secrets)
			if !slices.Equal(secrets, tc.secrets) {
				t.Errorf("Secret volumes %v, want %v", secrets, tc.secrets)
			}
			if pvc != tc.pvc {
				t.Errorf("token PVC mounted: %v, want %v", pvc, tc.pvc)
			}
			cfg, err := signerconfig.Parse(configMapData(t, objs, "keyward-signer-config", "config.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Backends.PKCS11.AllowedModules, tc.modules) {
				t.Errorf("allowed PKCS#11 modules %v, want %v", cfg.Backends.PKCS11.AllowedModules, tc.modules)
			}
			sa := find(objs, "ServiceAccount", "keyward-signer")
			if sa == nil {
				t.Fatal("no signer ServiceAccount")
			}
			if _, ok := sa.GetAnnotations()[tc.saAnnotation]; tc.saAnnotation != "" && !ok {
				t.Errorf("the ServiceAccount lacks annotation %s", tc.saAnnotation)
			}
			if tc.modules != nil && !mountsAt(pod.Spec.Containers[0], "/opt/hsm") {
				t.Error("the signer does not mount the vendor library at /opt/hsm")
			}
		})
	}
}

func mountsAt(c corev1.Container, path string) bool {
	return slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == path })
}
