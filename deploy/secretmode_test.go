package deploy

import (
	"bytes"
	"io/fs"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

// A Secret volume a non-root pod mounts is readable by it: the kubelet
// leaves Secret files root's unless the pod sets fsGroup (then group-owned)
// or the mode lets others read (k8s.io/kubernetes pkg/volume SetVolumeOwnership).
func TestBaseDeploymentsCanReadTheirSecrets(t *testing.T) {
	var files []string
	for _, glob := range []struct {
		fsys    fs.FS
		pattern string
	}{{Base, "kustomize/base/*.yaml"}, {TokenService, "kustomize/components/token-service/*.yaml"}} {
		names, err := fs.Glob(glob.fsys, glob.pattern)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, names...)
	}
	seen := 0
	for _, name := range files {
		fsys := Base
		if strings.HasPrefix(name, "kustomize/components/") {
			fsys = TokenService
		}
		data, err := fsys.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var dep appsv1.Deployment
			if err := dec.Decode(&dep); err != nil {
				break
			}
			if dep.Kind != "Deployment" {
				continue
			}
			spec := dep.Spec.Template.Spec
			sc := spec.SecurityContext
			root := sc == nil || sc.RunAsUser == nil || *sc.RunAsUser == 0
			for _, v := range spec.Volumes {
				if v.Secret == nil {
					continue
				}
				seen++
				mode := corev1.SecretVolumeSourceDefaultMode
				if v.Secret.DefaultMode != nil {
					mode = *v.Secret.DefaultMode
				}
				groupReadable := sc != nil && sc.FSGroup != nil && mode&0o040 != 0
				if !root && mode&0o004 == 0 && !groupReadable {
					t.Errorf("%s: Deployment %s, volume %s (Secret %s): mode %#o, non-root without a group-readable fsGroup: the pod cannot read it",
						name, dep.Name, v.Name, v.Secret.SecretName, mode)
				}
			}
		}
	}
	if seen == 0 {
		t.Fatal("no Secret volume found in deploy/kustomize/base and components/token-service: the test checks nothing")
	}
}
