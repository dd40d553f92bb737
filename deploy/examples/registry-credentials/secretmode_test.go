package registrycredentials_test

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// A Secret volume's files are root's, with the volume's mode, unless the
// pod sets fsGroup: then the kubelet gives them that group and at least
// group read (k8s.io/kubernetes pkg/volume, SetVolumeOwnership). A
// container that runs as a non-root user without fsGroup cannot read a
// 0400 file: the token service would not start (its TLS key) or not open
// its HSM key (the PIN).
func TestTheTokenServiceCanReadItsSecrets(t *testing.T) {
	dep := find[*appsv1.Deployment](t, tokenServiceObjects(t))[0]
	spec := dep.Spec.Template.Spec
	sc := spec.SecurityContext
	root := sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0
	for _, v := range spec.Volumes {
		if v.Secret == nil {
			continue
		}
		mode := corev1.SecretVolumeSourceDefaultMode
		if v.Secret.DefaultMode != nil {
			mode = *v.Secret.DefaultMode
		}
		for _, it := range v.Secret.Items {
			if it.Mode != nil {
				mode = *it.Mode
			}
		}
		readable := root || mode&0o004 != 0 || (sc != nil && sc.FSGroup != nil)
		if !readable {
			t.Errorf("volume %s (Secret %s): files are root's with mode %#o and the pod runs as a non-root user without fsGroup: unreadable", v.Name, v.Secret.SecretName, mode)
		}
	}
}
