package install

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/keyward/keyward/deploy/image"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/docscript"
	"github.com/keyward/keyward/testsupport/node"
	"github.com/keyward/keyward/testsupport/nodeimages"
	"github.com/keyward/keyward/testsupport/servingcert"
	"github.com/keyward/keyward/testsupport/testregistry"
)

const (
	nodeName    = "keyward-node"
	releaseNS   = "keyward"
	podIdentity = "keyward.dev/pod-identity"
	// busyboxRef is the image docs/quickstart.md's demo pod runs. No
	// Docker Hub is reachable: the node holds Debian's busybox-static
	// (1.35) under this name, as a node that pulled it before would.
	busyboxRef = "docker.io/library/busybox:1.37"
)

// cluster is what the quickstart's commands run against.
type cluster struct {
	dir, repo, version string
	caFile             string // ghcr.io's CA
	admin              kubernetes.Interface
	authorities        *authclient.Client
	env                []string // for helm and kubectl: KUBECONFIG, HOME, PATH, SSL_CERT_FILE
	images             map[string]v1.Hash
	node               *node.Node
}

// TestQuickstartAsWritten runs docs/quickstart.md's commands, as written,
// against the node (package doc), then checks what the issue asks of an
// install: keyward's pods run the images built here under "restricted"
// (the node agent under "privileged", in its own namespace) and are
// ready, the workload's certificate chains to the Authority's root, helm
// test passes, helm upgrade to a changed values file rolls the pods and
// issuing goes on, helm uninstall keeps the CRD, the Authorities and the
// token's claim.
func TestQuickstartAsWritten(t *testing.T) {
	// 20 minutes, or less if go test's -timeout ends sooner: a failure
	// then still ends in a diagnosis, not in go test's panic.
	budget := 20 * time.Minute
	if d, ok := t.Deadline(); ok && time.Until(d)-time.Minute < budget {
		budget = time.Until(d) - time.Minute
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	c := setUpCluster(t, ctx)

	work := filepath.Join(c.dir, "quickstart")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	script, files, err := docscript.Quickstart(filepath.Join(c.repo, "docs", "quickstart.md"), "helm")
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	step := stepper(t)
	done := step("docs/quickstart.md's commands, as written")
	if out, err := c.shell(ctx, work, script); err != nil {
		t.Fatalf("the quickstart's commands failed: %v\n%s\n%s", err, out, c.diagnose(ctx))
	}
	done()

	t.Run("what the quickstart says to look at", func(t *testing.T) {
		c.checkQuickstartClaims(t, ctx)
	})
	t.Run("keyward runs the images built here, under the Pod Security labelled", func(t *testing.T) {
		c.checkPods(t, ctx)
	})
	t.Run("the demo pod's certificate chains to the Authority's root", func(t *testing.T) {
		bundle, err := os.ReadFile(filepath.Join(work, "bundle.pem"))
		if err != nil {
			t.Fatal(err)
		}
		c.checkIssued(t, ctx, bundle, "default", "demo")
	})
	t.Run("helm test", func(t *testing.T) {
		if out, err := c.shell(ctx, work, "helm test keyward -n keyward --timeout 5m"); err != nil {
			t.Fatalf("helm test: %v\n%s", err, out)
		}
	})

	t.Run("helm upgrade to a changed values file rolls the pods", func(t *testing.T) {
		before := c.podUIDs(t, ctx)
		values := "signer:\n  replicas: 1\n  backend:\n    type: softhsm\npodAnnotations:\n  keyward.test/rollout: \"2\"\n"
		if err := os.WriteFile(filepath.Join(work, "upgrade-values.yaml"), []byte(values), 0o644); err != nil {
			t.Fatal(err)
		}
		done := step("helm upgrade")
		if out, err := c.shell(ctx, work, fmt.Sprintf("helm upgrade keyward oci://ghcr.io/keyward/charts/keyward --version %s -n keyward -f upgrade-values.yaml --wait --timeout 5m", c.version)); err != nil {
			t.Fatalf("helm upgrade: %v\n%s\n%s", err, out, c.diagnose(ctx))
		}
		done()
		if err := c.waitRolled(ctx, before); err != nil {
			t.Fatalf("%v\n%s", err, c.diagnose(ctx))
		}
		c.checkPods(t, ctx)
		// The rolled signer opens the same token and issues.
		if out, err := c.shell(ctx, work, "sed 's/name: demo$/name: demo-after-upgrade/' demo-pod.yaml | kubectl apply -f - && kubectl wait --for=condition=Ready pod/demo-after-upgrade --timeout=3m && kubectl exec demo-after-upgrade -- cat /var/run/keyward/credential-bundle.pem > bundle-after-upgrade.pem"); err != nil {
			t.Fatalf("a pod after the upgrade: %v\n%s\n%s", err, out, c.diagnose(ctx))
		}
		bundle, err := os.ReadFile(filepath.Join(work, "bundle-after-upgrade.pem"))
		if err != nil {
			t.Fatal(err)
		}
		c.checkIssued(t, ctx, bundle, "default", "demo-after-upgrade")
	})

	t.Run("helm uninstall keeps the CRD, the Authorities and the token", func(t *testing.T) {
		auths, err := c.authorities.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if out, err := c.shell(ctx, work, "helm uninstall keyward -n keyward --wait --timeout 5m"); err != nil {
			t.Fatalf("helm uninstall: %v\n%s", err, out)
		}
		if out, err := c.shell(ctx, work, "kubectl get crd authorities.keyward.dev"); err != nil {
			t.Errorf("the Authority CRD after helm uninstall: %v\n%s", err, out)
		}
		after, err := c.authorities.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(after.Items) == 0 || len(after.Items) != len(auths.Items) {
			t.Errorf("Authorities after helm uninstall: %d, before: %d", len(after.Items), len(auths.Items))
		}
		for i := range after.Items {
			if len(after.Items[i].Spec.Generations) == 0 {
				t.Errorf("Authority %s lost its generations", after.Items[i].Name)
			}
		}
		if _, err := c.admin.CoreV1().PersistentVolumeClaims(releaseNS).Get(ctx, "keyward-softhsm-tokens", metav1.GetOptions{}); err != nil {
			t.Errorf("the SoftHSM2 token's claim after helm uninstall: %v", err)
		}
		if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			d, err := c.admin.AppsV1().Deployments(releaseNS).List(ctx, metav1.ListOptions{})
			return err == nil && len(d.Items) == 0, nil
		}); err != nil {
			t.Errorf("keyward's Deployments still there after helm uninstall: %v", err)
		}
	})

	// The quickstart's other way, on the same cluster once the Helm
	// install's remains are gone: the namespaces, the Authorities and
	// their bundles, the token's volume, the demo pods.
	if t.Failed() {
		return // what the Helm way left may be why; the kustomize way would only repeat it
	}
	t.Run("the kustomize way", func(t *testing.T) {
		done := step("cluster emptied of the Helm install")
		c.empty(t, ctx, "pv-1")
		c.createVolume(t, ctx, "pv-2")
		done()
		kwork := filepath.Join(c.dir, "quickstart-kustomize")
		if err := os.MkdirAll(kwork, 0o755); err != nil {
			t.Fatal(err)
		}
		// "from a checkout": the script's relative deploy/ path.
		if err := os.Symlink(filepath.Join(c.repo, "deploy"), filepath.Join(kwork, "deploy")); err != nil {
			t.Fatal(err)
		}
		script, files, err := docscript.Quickstart(filepath.Join(c.repo, "docs", "quickstart.md"), "kustomize")
		if err != nil {
			t.Fatal(err)
		}
		for name, content := range files {
			if err := os.WriteFile(filepath.Join(kwork, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		done = step("docs/quickstart.md's commands, the kustomize way")
		if out, err := c.shell(ctx, kwork, script); err != nil {
			t.Fatalf("the quickstart's commands failed: %v\n%s\n%s", err, out, c.diagnose(ctx))
		}
		done()
		c.checkQuickstartClaims(t, ctx)
		c.checkPods(t, ctx)
		bundle, err := os.ReadFile(filepath.Join(kwork, "bundle.pem"))
		if err != nil {
			t.Fatal(err)
		}
		c.checkIssued(t, ctx, bundle, "default", "demo")

		// docs/production/softhsm.md's backup, on this install.
		backup, _, err := docscript.Read(filepath.Join(c.repo, "docs", "production", "softhsm.md"), "", "## Backup and restore")
		if err != nil {
			t.Fatal(err)
		}
		done = step("docs/production/softhsm.md's backup")
		if out, err := c.shell(ctx, kwork, backup); err != nil {
			t.Fatalf("the backup's commands failed: %v\n%s\n%s", err, out, c.diagnose(ctx))
		}
		done()
		checkTokenBackup(t, kwork)
		c.checkPods(t, ctx) // the signer is back
	})

	if t.Failed() {
		return
	}
	// docs/production/pkcs11-hsm.md and ca-admin.md, as written, with
	// SoftHSM2 standing in for the HSM: its library is the vendor library
	// an image of the user's carries (hsm-client), its token the HSM
	// partition, provisioned beforehand as an HSM's administrator would.
	// The user's edits the guides ask for ("after setting the library
	// image and client config", "edit the image names") are made to a copy
	// of deploy/; then quickstart.md's demo pod, from section 5.
	t.Run("the PKCS#11 guide and the CA admin Job", func(t *testing.T) {
		done := step("cluster emptied of the kustomize install")
		c.empty(t, ctx, "pv-2")
		tokens := c.createVolume(t, ctx, "pv-3")
		done()
		done = step("the HSM partition (a SoftHSM2 token) and the client library image")
		pwork := filepath.Join(c.dir, "pkcs11")
		if err := os.MkdirAll(pwork, 0o755); err != nil {
			t.Fatal(err)
		}
		pin := "pkcs11-guide-pin"
		if err := os.WriteFile(filepath.Join(pwork, "pin"), []byte(pin+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		initHSMToken(t, tokens, "keyward-ca", pin)
		c.pushHSMClient(t, ctx)
		done()
		if err := os.CopyFS(filepath.Join(pwork, "deploy"), os.DirFS(filepath.Join(c.repo, "deploy"))); err != nil {
			t.Fatal(err)
		}
		editPKCS11Checkout(t, filepath.Join(pwork, "deploy"))
		var script strings.Builder
		for _, g := range []struct{ doc, from string }{
			{"docs/production/pkcs11-hsm.md", ""},
			{"docs/production/ca-admin.md", ""},
			{"docs/quickstart.md", "## 5."},
		} {
			s, files, err := docscript.Read(filepath.Join(c.repo, g.doc), "", g.from)
			if err != nil {
				t.Fatal(err)
			}
			script.WriteString(s)
			for name, content := range files {
				if err := os.WriteFile(filepath.Join(pwork, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
		done = step("docs/production/pkcs11-hsm.md, ca-admin.md, quickstart.md from section 5")
		if out, err := c.shell(ctx, pwork, script.String()); err != nil {
			t.Fatalf("the guides' commands failed: %v\n%s\n%s", err, out, c.diagnose(ctx))
		}
		done()
		c.checkQuickstartClaims(t, ctx)
		c.checkPods(t, ctx)
		bundle, err := os.ReadFile(filepath.Join(pwork, "bundle.pem"))
		if err != nil {
			t.Fatal(err)
		}
		c.checkIssued(t, ctx, bundle, "default", "demo")
	})
}

// setUpCluster starts what the quickstart assumes exists: a cluster with a
// default StorageClass, and the release: images and chart in ghcr.io.
func setUpCluster(t *testing.T, ctx context.Context) *cluster {
	step := stepper(t)
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	v, err := os.ReadFile(filepath.Join(repo, "VERSION"))
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{dir: filepath.Join(node.WorkDir(), "install"), repo: repo, version: strings.TrimSpace(string(v)),
		admin: cp.AdminClient(), images: map[string]v1.Hash{}}
	for _, d := range []string{"bin", "home", "images", "charts"} {
		if err := os.MkdirAll(filepath.Join(c.dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if c.authorities, err = authclient.New(cp.AdminConfig()); err != nil {
		t.Fatal(err)
	}

	done := step("ghcr.io: a registry with TLS on " + registryIP + ":443")
	tlsFiles, err := servingcert.WriteFor(c.dir, "ghcr.io", "ghcr.io")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.LoadX509KeyPair(tlsFiles.CertFile, tlsFiles.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", net.JoinHostPort(registryIP, "443"))
	if err != nil {
		t.Fatal(err)
	}
	testregistry.StartOpenTLS(t, l, pair)
	c.caFile = tlsFiles.CAFile
	done()

	kubectl, err := controlplane.FindKubectl()
	if err != nil {
		t.Fatal(err)
	}
	helm := os.Getenv("KEYWARD_HELM")
	if helm == "" {
		helm = filepath.Join(repo, "bin", "helm")
	}
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("helm: %v (run make tools, or set KEYWARD_HELM)", err)
	}
	for _, b := range []string{kubectl, helm} {
		if err := os.Symlink(b, filepath.Join(c.dir, "bin", filepath.Base(b))); err != nil {
			t.Fatal(err)
		}
	}
	adminKC := filepath.Join(c.dir, "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", adminKC); err != nil {
		t.Fatal(err)
	}
	// Only these: nothing of the machine's (XDG_*, HELM_*, proxies)
	// may steer helm or kubectl elsewhere.
	c.env = []string{
		"KUBECONFIG=" + adminKC,
		"HOME=" + filepath.Join(c.dir, "home"),
		"PATH=" + filepath.Join(c.dir, "bin") + ":" + os.Getenv("PATH"),
		"TMPDIR=" + os.TempDir(),
		"LANG=C.UTF-8",
		// Go (helm) and OpenSSL take their roots from here: ghcr.io's CA.
		"SSL_CERT_FILE=" + tlsFiles.CAFile,
	}

	done = step("release images assembled (deploy/image) and pushed to ghcr.io")
	c.pushImages(t, ctx, tlsFiles.Pool)
	done()

	done = step("chart packaged and pushed: helm push oci://ghcr.io/keyward/charts")
	if out, err := c.shell(ctx, c.dir, fmt.Sprintf("helm package %s -d charts && helm push charts/keyward-%s.tgz oci://ghcr.io/keyward/charts",
		filepath.Join(repo, "deploy", "helm", "keyward"), c.version)); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	done()

	done = step("kube-controller-manager and kube-scheduler running")
	kcm, err := cp.StartControllerManager(controlplane.ControllerManagerOptions{
		Dir: c.dir,
		Controllers: []string{"deployment-controller", "replicaset-controller", "daemonset-controller", "garbage-collector-controller",
			"namespace-controller", "serviceaccount-controller", "root-ca-certificate-publisher-controller", "persistentvolume-binder-controller",
			// They lift the protection finalizers once nothing uses a claim or volume.
			"persistentvolumeclaim-protection-controller", "persistentvolume-protection-controller",
			// The CA admin Job of docs/production/ca-admin.md.
			"job-controller",
			// It lifts the not-ready taint kubelet registers the Node with.
			"node-lifecycle-controller"},
		QPS: 50, Burst: 100,
		ExtraFlags: []string{"--root-ca-file=" + cp.CAFile()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kcm.Stop)
	sched, err := cp.StartScheduler(c.dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sched.Stop)
	done()

	done = step("a default StorageClass and a hostPath volume for it")
	c.createStorage(t, ctx)
	done()

	done = step("node joined: kubelet, containerd, the CNI bridge")
	c.startNode(t, ctx)
	done()
	return c
}

// pushImages assembles the runtime image and its SoftHSM2 variant for this
// machine's architecture from the release binary, as make release does,
// and pushes them under the names the chart pulls.
func (c *cluster) pushImages(t *testing.T, ctx context.Context, pool *x509.CertPool) {
	bin := filepath.Join(c.dir, "keyward-release")
	build := exec.CommandContext(ctx, filepath.Join(c.repo, "hack", "build-release.sh"), bin)
	build.Env = append(os.Environ(), "VERSION="+c.version)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("hack/build-release.sh: %v\n%s", err, out)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	for _, variant := range []string{"", "softhsm"} {
		debs, err := cachedDebs(image.Packages(variant))
		if err != nil {
			t.Fatal(err)
		}
		img, err := image.Assemble(image.Build{Arch: runtime.GOARCH, Variant: variant, Binary: bin, Debs: debs,
			Version: c.version, Revision: "install-test", Created: time.Unix(0, 0).UTC()})
		if err != nil {
			t.Fatal(err)
		}
		tag := c.version
		if variant != "" {
			tag += "-" + variant
		}
		ref, err := name.NewTag("ghcr.io/keyward/keyward:"+tag, name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		if err := remote.Write(ref, img, remote.WithContext(ctx), remote.WithTransport(tr)); err != nil {
			t.Fatalf("pushing %s: %v", ref, err)
		}
		if c.images[ref.String()], err = img.Digest(); err != nil {
			t.Fatal(err)
		}
	}
}

// createStorage makes the cluster's default StorageClass (no provisioner)
// and one volume for it.
func (c *cluster) createStorage(t *testing.T, ctx context.Context) {
	immediate := storagev1.VolumeBindingImmediate
	if _, err := c.admin.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: "standard", Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"}},
		Provisioner:       "kubernetes.io/no-provisioner",
		VolumeBindingMode: &immediate,
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	c.createVolume(t, ctx, "pv-1")
}

// empty removes what an install left: the demo pods, keyward's
// namespaces, the Authorities and their bundles, the node agent's host
// folders, and volume pv (whose claim went with its namespace).
func (c *cluster) empty(t *testing.T, ctx context.Context, pv string) {
	t.Helper()
	for _, d := range []string{"/etc/keyward-node", "/var/lib/keyward-node"} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := c.shell(ctx, c.dir, `kubectl delete pod demo demo-after-upgrade --ignore-not-found --wait --timeout=3m
kubectl delete namespace keyward keyward-node --ignore-not-found --wait --timeout=3m
kubectl delete authorities.keyward.dev --all --wait --timeout=1m
kubectl delete clustertrustbundles --all --wait --timeout=1m
kubectl delete pv `+pv+` --wait --timeout=1m`); err != nil {
		t.Fatalf("%v\n%s\n%s", err, out, c.diagnose(ctx))
	}
}

// createVolume makes a volume of the default StorageClass on a folder
// anyone may write, as kind's local-path provisioner makes them, and
// returns the folder.
func (c *cluster) createVolume(t *testing.T, ctx context.Context, name string) string {
	path := filepath.Join(c.dir, "volumes", name)
	if err := os.MkdirAll(path, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o777); err != nil {
		t.Fatal(err)
	}
	hostPath := corev1.HostPathDirectory
	if _, err := c.admin.CoreV1().PersistentVolumes().Create(ctx, &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
			AccessModes:                   []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimRetain,
			StorageClassName:              "standard",
			PersistentVolumeSource:        corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: &hostPath}},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return path
}

// startNode starts kubelet as kubeadm lays it out, with the pause and
// busybox images pre-loaded, and waits until the Node is Ready.
func (c *cluster) startNode(t *testing.T, ctx context.Context) {
	imgs, err := nodeimages.Build(ctx, filepath.Join(c.dir, "images"))
	if err != nil {
		t.Fatal(err)
	}
	busybox, err := c.busyboxArchive()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll("/etc/kubernetes", 0o755); err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := cp.NodeConfig(nodeName)
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.WriteKubeconfig(nodeCfg, "system:node:"+nodeName, "/etc/kubernetes/kubelet.conf"); err != nil {
		t.Fatal(err)
	}
	n, err := node.Start(ctx, node.Options{
		Dir:           filepath.Join(c.dir, "node"),
		Name:          nodeName,
		Kubeconfig:    "/etc/kubernetes/kubelet.conf",
		CertDir:       "/var/lib/kubelet/pki",
		ClientCAFile:  cp.CAFile(),
		SandboxImage:  imgs.PauseRef,
		ImageArchives: []string{imgs.PauseArchive, busybox},
		Registries:    map[string]node.Registry{"ghcr.io": {URL: "https://ghcr.io", CAFile: c.caFile}},
		PodSubnet:     podSubnet,
	})
	if err != nil {
		t.Fatal(err)
	}
	running, c.node = n, n
	t.Cleanup(func() {
		running = nil
		if err := n.Stop(); err != nil {
			t.Errorf("stopping the node: %v", err)
		}
	})
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := n.KubeletExited(); err != nil {
			return false, err
		}
		nd, err := c.admin.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		for _, cond := range nd.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				return cond.Status == corev1.ConditionTrue, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("node %s not Ready: %v\nkubelet log:\n%s", nodeName, err, controlplane.Tail(n.KubeletLog, 30))
	}
}

// checkPods checks every pod of the release: running the image pushed to
// ghcr.io under its digest, ready, admitted in a namespace whose labels
// say what the pod needs.
func (c *cluster) checkPods(t *testing.T, ctx context.Context) {
	t.Helper()
	if err := c.waitWorkloads(ctx); err != nil {
		t.Fatalf("%v\n%s", err, c.diagnose(ctx))
	}
	wantLevel := map[string]string{releaseNS: "restricted", releaseNS + "-node": "privileged"}
	for ns, level := range wantLevel {
		checked := 0
		n, err := c.admin.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := n.Labels["pod-security.kubernetes.io/enforce"]; got != level {
			t.Errorf("namespace %s enforces Pod Security %q, want %q", ns, got, level)
		}
		pods, err := c.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=keyward"})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) == 0 {
			t.Errorf("no keyward pods in namespace %s", ns)
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || p.Status.Phase == corev1.PodSucceeded {
				continue
			}
			ready := false
			for _, cond := range p.Status.Conditions {
				if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			if !ready {
				t.Errorf("pod %s/%s is not ready: %+v", ns, p.Name, p.Status.Conditions)
			}
			for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
				want, ok := c.images[cs.Image]
				if !ok {
					t.Errorf("pod %s/%s container %s runs %s, not an image this run built (%v)", ns, p.Name, cs.Name, cs.Image, c.images)
					continue
				}
				checked++
				if !strings.HasSuffix(cs.ImageID, "@"+want.String()) {
					t.Errorf("pod %s/%s container %s runs %s (%s), want the digest pushed, %s", ns, p.Name, cs.Name, cs.Image, cs.ImageID, want)
				}
			}
		}
		if checked == 0 {
			t.Errorf("no keyward container inspected in namespace %s", ns)
		}
		t.Logf("namespace %s: %d keyward containers run the images pushed, by digest", ns, checked)
	}
}

// workloads are what every install runs: the signer and the approver in
// keyward's namespace, the node agent in its own.
var workloads = []struct{ namespace, kind, name string }{
	{releaseNS, "Deployment", "keyward-signer"},
	{releaseNS, "Deployment", "keyward-approver"},
	{releaseNS + "-node", "DaemonSet", "keyward-node-agent"},
}

// waitWorkloads waits until each of workloads has all its pods updated,
// ready and available (a pod refused admission never gets there).
func (c *cluster) waitWorkloads(ctx context.Context) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 4*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, w := range workloads {
			switch w.kind {
			case "Deployment":
				d, err := c.admin.AppsV1().Deployments(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
				if err != nil {
					last = err.Error()
					return false, nil
				}
				want := int32(1)
				if d.Spec.Replicas != nil {
					want = *d.Spec.Replicas
				}
				s := d.Status
				if d.Generation != s.ObservedGeneration || want == 0 || s.UpdatedReplicas != want || s.ReadyReplicas != want || s.AvailableReplicas != want || s.Replicas != want {
					last = fmt.Sprintf("Deployment %s/%s: want %d, status %+v", w.namespace, w.name, want, s)
					return false, nil
				}
			case "DaemonSet":
				d, err := c.admin.AppsV1().DaemonSets(w.namespace).Get(ctx, w.name, metav1.GetOptions{})
				if err != nil {
					last = err.Error()
					return false, nil
				}
				s := d.Status
				if d.Generation != s.ObservedGeneration || s.DesiredNumberScheduled == 0 || s.UpdatedNumberScheduled != s.DesiredNumberScheduled || s.NumberReady != s.DesiredNumberScheduled || s.NumberAvailable != s.DesiredNumberScheduled {
					last = fmt.Sprintf("DaemonSet %s/%s: status %+v", w.namespace, w.name, s)
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("keyward's workloads not all ready: %s: %w", last, err)
	}
	return nil
}

// checkQuickstartClaims checks what the quickstart tells the reader to
// look at: the demo pod's request issued, generation g1 Active in each
// configured signer name's Authority, its live and canary bundles.
func (c *cluster) checkQuickstartClaims(t *testing.T, ctx context.Context) {
	t.Helper()
	pcrs, err := c.admin.CertificatesV1().PodCertificateRequests("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	issued := false
	for _, p := range pcrs.Items {
		for _, cond := range p.Status.Conditions {
			if p.Spec.PodName == "demo" && cond.Type == "Issued" && cond.Status == metav1.ConditionTrue {
				issued = true
			}
		}
	}
	if !issued {
		t.Errorf("no PodCertificateRequest of pod demo with condition Issued among %d", len(pcrs.Items))
	}
	auths, err := c.authorities.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range auths.Items {
		if a.Spec.SignerName != podIdentity {
			continue
		}
		found = true
		if len(a.Spec.Generations) != 1 || a.Spec.Generations[0].Name != "g1" || (a.Spec.Generations[0].Phase != "" && a.Spec.Generations[0].Phase != "Active") {
			t.Errorf("Authority %s: generations %+v, want g1 Active alone", a.Name, a.Spec.Generations)
		}
	}
	if !found {
		t.Errorf("no Authority for %s", podIdentity)
	}
	for _, version := range []string{"live", "canary"} {
		ctbs, err := c.admin.CertificatesV1().ClusterTrustBundles().List(ctx, metav1.ListOptions{LabelSelector: "keyward.dev/cluster-trust-bundle-version=" + version})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, b := range ctbs.Items {
			if b.Spec.SignerName == podIdentity {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%d %s ClusterTrustBundles of %s, want 1", n, version, podIdentity)
		}
	}
}

// checkIssued checks that bundle (a credential bundle: key, then chain)
// holds a leaf for pod ns/pod that chains, with Go's x509.Verify, to the
// pod-identity Authority's generation.
func (c *cluster) checkIssued(t *testing.T, ctx context.Context, bundle []byte, ns, pod string) {
	t.Helper()
	var chain []*x509.Certificate
	for rest := bundle; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type == "CERTIFICATE" {
			cert, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			chain = append(chain, cert)
		}
	}
	if len(chain) == 0 {
		t.Fatalf("no certificate in the credential bundle:\n%s", bundle)
	}
	roots := x509.NewCertPool()
	auths, err := c.authorities.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range auths.Items {
		if a.Spec.SignerName != podIdentity {
			continue
		}
		for _, g := range a.Spec.Generations {
			roots.AppendCertsFromPEM([]byte(g.CertificatePEM))
		}
	}
	inter := x509.NewCertPool()
	for _, ic := range chain[1:] {
		inter.AddCert(ic)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Errorf("pod %s/%s's certificate does not chain to the %s Authority: %v", ns, pod, podIdentity, err)
	}
	p, err := c.admin.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := "system:serviceaccount:" + ns + ":" + p.Spec.ServiceAccountName; chain[0].Subject.CommonName != want {
		t.Errorf("pod %s/%s's certificate is for %q, want %q", ns, pod, chain[0].Subject.CommonName, want)
	}
}

// podUIDs are the UIDs of the release's pods in both namespaces, by
// namespace/name.
func (c *cluster) podUIDs(t *testing.T, ctx context.Context) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, ns := range []string{releaseNS, releaseNS + "-node"} {
		pods, err := c.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=keyward"})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pods.Items {
			out[ns+"/"+p.Name] = string(p.UID)
		}
	}
	if len(out) == 0 {
		t.Fatal("no keyward pods before the upgrade")
	}
	return out
}

// waitRolled waits until none of the pods in before is left and the
// release's pods carry the upgrade's annotation.
func (c *cluster) waitRolled(ctx context.Context, before map[string]string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		n := 0
		for _, ns := range []string{releaseNS, releaseNS + "-node"} {
			pods, err := c.admin.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/part-of=keyward"})
			if err != nil {
				return false, nil
			}
			for _, p := range pods.Items {
				n++
				if _, old := before[ns+"/"+p.Name]; old {
					last = "pod " + ns + "/" + p.Name + " from before the upgrade is still there"
					return false, nil
				}
				if p.Annotations["keyward.test/rollout"] != "2" {
					last = "pod " + ns + "/" + p.Name + " lacks the upgrade's annotation"
					return false, nil
				}
			}
		}
		if n == 0 {
			last = "no pods"
		}
		return n > 0, nil
	})
	if err != nil {
		return fmt.Errorf("the pods did not roll after helm upgrade: %s: %w", last, err)
	}
	return nil
}

// shell runs script with bash (-euo pipefail, traced) in dir with the
// cluster's environment and returns its combined output.
func (c *cluster) shell(ctx context.Context, dir, script string) (string, error) {
	cmd := exec.CommandContext(ctx, "bash", "-euxo", "pipefail", "-c", script)
	cmd.Dir, cmd.Env = dir, c.env
	// At the deadline the whole group goes (kubectl, helm), not bash
	// alone, and the output pipe is given up after a grace period.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// diagnose gathers what a failure needs: pods, events, the last lines of
// kubelet's log.
func (c *cluster) diagnose(context.Context) string {
	// Its own time: the failure may be the deadline of the test's.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, _ := c.shell(ctx, c.dir, `kubectl get pods,pvc,podcertificaterequests -A -o wide || true
kubectl get events -A --sort-by=.lastTimestamp | tail -40 || true
kubectl -n keyward logs deploy/keyward-signer --all-containers --tail=40 || true`)
	if c.node != nil {
		out += "\nkubelet log:\n" + controlplane.Tail(c.node.KubeletLog, 30)
	}
	return out
}

// stepper prints each set-up step with its duration.
func stepper(t *testing.T) func(string) func() {
	return func(what string) func() {
		began := time.Now()
		return func() { t.Logf("%s (%s)", what, time.Since(began).Round(time.Millisecond)) }
	}
}

// checkTokenBackup checks the backup softhsm.md makes: a gzipped tar of
// tokens/ holding a SoftHSM2 token (its token.object).
func checkTokenBackup(t *testing.T, dir string) {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "softhsm-tokens-*.tgz"))
	if err != nil || len(matches) != 1 {
		t.Fatalf("the backup archive: %v %v", matches, err)
	}
	f, err := os.Open(matches[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", matches[0], err)
	}
	tr := tar.NewReader(zr)
	var names []string
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", matches[0], err)
		}
		names = append(names, h.Name)
	}
	if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, "tokens/") && strings.HasSuffix(n, "/token.object") }) {
		t.Errorf("%s holds no token (tokens/*/token.object): %v", matches[0], names)
	}
}
