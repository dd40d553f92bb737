package install

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// The PKCS#11 guide's stand-ins: the vendor's client library image (the
// guides' registry.example.com/hsm-client:VERSION) holds SoftHSM2's module
// where the pkcs11 overlay and the CA admin Job expect a vendor's,
// /opt/hsm/lib/libvendorpkcs11.so, with its configuration; the token (the
// HSM partition, label keyward-ca as in the guides' key URIs) lives on a
// volume both the signer and the Job mount.
const (
	hsmClientRef  = "ghcr.io/keyward-test/hsm-client:2.6.1"
	hsmTokenDir   = "/var/lib/hsm/tokens"
	hsmClientConf = "/opt/hsm/etc/softhsm2.conf"
)

// initHSMToken provisions the partition: a SoftHSM2 token labelled label
// with user PIN pin in dir, owned by keyward's user (65532), as an HSM's
// administrator creates a partition before keyward is installed.
func initHSMToken(t *testing.T, dir, label, pin string) {
	t.Helper()
	conf := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+"-softhsm2.conf")
	if err := os.WriteFile(conf, []byte("directories.tokendir = "+dir+"\nobjectstore.backend = file\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("softhsm2-util", "--init-token", "--free", "--label", label, "--pin", pin, "--so-pin", pin+"-so")
	cmd.Env = append(os.Environ(), "SOFTHSM2_CONF="+conf)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("softhsm2-util --init-token: %v\n%s", err, out)
	}
	if err := filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 65532, 65532)
	}); err != nil {
		t.Fatal(err)
	}
}

// pushHSMClient builds the client library image (busybox's cp for the
// init container's copy, SoftHSM2's module as the vendor library, its
// configuration naming the token volume) and pushes it.
func (c *cluster) pushHSMClient(t *testing.T, ctx context.Context) {
	t.Helper()
	debs, err := cachedDebs([]string{"libsofthsm2"})
	if err != nil {
		t.Fatal(err)
	}
	unpacked := filepath.Join(c.dir, "libsofthsm2")
	if out, err := exec.Command("dpkg-deb", "-x", debs[0], unpacked).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb -x %s: %v\n%s", debs[0], err, out)
	}
	module, err := os.ReadFile(filepath.Join(unpacked, "usr", "lib", "softhsm", "libsofthsm2.so"))
	if err != nil {
		t.Fatal(err)
	}
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"opt/hsm/lib/libvendorpkcs11.so", module},
		{strings.TrimPrefix(hsmClientConf, "/"), []byte("directories.tokendir = " + hsmTokenDir + "\nobjectstore.backend = file\nlog.level = INFO\nslots.removable = false\n")},
	} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: time.Unix(0, 0)}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	base, err := tarball.ImageFromPath(filepath.Join(c.dir, "images", "busybox.tar"), nil)
	if err != nil {
		t.Fatal(err)
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layer.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(base, l)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := name.NewTag(hsmClientRef, name.StrictValidation)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(c.caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s holds no certificate", c.caFile)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithTransport(tr)); err != nil {
		t.Fatalf("pushing %s: %v", ref, err)
	}
	if c.images[ref.String()], err = img.Digest(); err != nil {
		t.Fatal(err)
	}
}

// editPKCS11Checkout makes, in a copy of deploy/, the edits the guides
// leave to the user: the library image's name in the pkcs11 overlay and
// the CA admin Job, and the client configuration (SOFTHSM2_CONF, the
// partition's volume and its claim). Each edit must find the text it
// replaces, so a changed file fails here, by name.
func editPKCS11Checkout(t *testing.T, deploy string) {
	t.Helper()
	edit := func(rel string, pairs ...string) {
		p := filepath.Join(deploy, rel)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for i := 0; i < len(pairs); i += 2 {
			if !strings.Contains(s, pairs[i]) {
				t.Fatalf("%s no longer holds %q: update the install test's edit", rel, pairs[i])
			}
			s = strings.Replace(s, pairs[i], pairs[i+1], 1)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit("kustomize/overlays/pkcs11/hsm-library.yaml", "image: registry.example.com/hsm-client:VERSION", "image: "+hsmClientRef)
	edit("kustomize/overlays/pkcs11/kustomization.yaml",
		"resources:\n- ../../base\n", "resources:\n- ../../base\n- hsm-tokens.yaml\n",
		"patches:\n- path: hsm-library.yaml\n", "patches:\n- path: hsm-library.yaml\n- path: hsm-client-config.yaml\n")
	files := map[string]string{
		"kustomize/overlays/pkcs11/hsm-tokens.yaml": `apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: hsm-tokens
  namespace: keyward
spec:
  accessModes: ["ReadWriteOnce"]
  volumeName: pv-3
  resources:
    requests:
      storage: 1Gi
`,
		"kustomize/overlays/pkcs11/hsm-client-config.yaml": fmt.Sprintf(`apiVersion: apps/v1
kind: Deployment
metadata:
  name: keyward-signer
  namespace: keyward
spec:
  template:
    spec:
      containers:
      - name: signer
        env:
        - name: SOFTHSM2_CONF
          value: %s
        volumeMounts:
        - name: hsm-tokens
          mountPath: %s
      volumes:
      - name: hsm-tokens
        persistentVolumeClaim:
          claimName: hsm-tokens
`, hsmClientConf, hsmTokenDir),
	}
	for rel, content := range files {
		if err := os.WriteFile(filepath.Join(deploy, rel), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit("examples/ca-admin/job.yaml",
		"image: registry.example.com/hsm-client:VERSION", "image: "+hsmClientRef,
		"        args:\n        - ca\n        - init\n", "        env:\n        - name: SOFTHSM2_CONF\n          value: "+hsmClientConf+"\n        args:\n        - ca\n        - init\n",
		"        - name: pin\n          mountPath: /etc/keyward/hsm\n          readOnly: true\n", "        - name: pin\n          mountPath: /etc/keyward/hsm\n          readOnly: true\n        - name: hsm-tokens\n          mountPath: "+hsmTokenDir+"\n",
		"      volumes:\n", "      volumes:\n      - name: hsm-tokens\n        persistentVolumeClaim:\n          claimName: hsm-tokens\n")
}
