package nodetests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/testsupport/controlplane"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Where the workload's projected volume is mounted, and its files.
const (
	credDir    = "/var/run/keyward"
	credBundle = credDir + "/credential.pem"
	trustFile  = credDir + "/trust.pem"
)

// workloadLine is one line the workload program prints (KEYWARD-WORKLOAD
// <json>); the fields of every event are in one struct.
type workloadLine struct {
	Event      string    `json:"event"`
	OK         bool      `json:"ok"`
	Error      string    `json:"error"`
	Subject    string    `json:"subject"`
	Issuer     string    `json:"issuer"`
	Serial     string    `json:"serial"`
	NotAfter   time.Time `json:"notAfter"`
	KeyType    string    `json:"keyType"`
	DNSNames   []string  `json:"dnsNames"`
	URIs       []string  `json:"uris"`
	RootSHA256 []string  `json:"rootSHA256"`
	ChainLen   int       `json:"chainLen"`
	// mtls-dial and mtls-serve
	ServerSerial string `json:"serverSerial"`
	ServerIssuer string `json:"serverIssuer"`
	OwnSerial    string `json:"ownSerial"`
	OwnIssuer    string `json:"ownIssuer"`
	PeerSerial   string `json:"peerSerial"`
	PeerIssuer   string `json:"peerIssuer"`
}

// podSpec describes a workload pod on the node.
type podSpec struct {
	namespace, name, serviceAccount string
	args                            []string
	// sources are the projected volume's sources, mounted at credDir.
	sources []corev1.VolumeProjection
	restart corev1.RestartPolicy
	// sidecar, when set, runs the workload with these arguments in a
	// second container, "trust", with the same volume.
	sidecar []string
}

// liveBundleByName projects signerName's live ClusterTrustBundle by name.
// kubelet v1.37 keeps such a projection stale for up to 5 minutes after a
// change (docs/rotation.md), so the docs advise liveBundleBySigner; a
// bundle that does not change, as in the profile tests, is fine either way.
func liveBundleByName(signerName string) corev1.VolumeProjection {
	name := strings.ReplaceAll(signerName, "/", ":") + ":live"
	return corev1.VolumeProjection{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{Name: &name, Path: "trust.pem"}}
}

// liveBundleBySigner projects it by signer name and the trust publisher's
// version label.
func liveBundleBySigner(signerName string) corev1.VolumeProjection {
	return corev1.VolumeProjection{ClusterTrustBundle: &corev1.ClusterTrustBundleProjection{
		SignerName:    &signerName,
		LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"keyward.dev/cluster-trust-bundle-version": "live"}},
		Path:          "trust.pem",
	}}
}

func podCertificate(signerName, keyType string, annotations map[string]string) corev1.VolumeProjection {
	return corev1.VolumeProjection{PodCertificate: &corev1.PodCertificateProjection{
		SignerName: signerName, KeyType: keyType, CredentialBundlePath: "credential.pem", UserAnnotations: annotations,
	}}
}

// createPod creates the namespace, service account and pod (hostNetwork,
// bound to the node, the workload image as pre-loaded).
func createPod(t *testing.T, ctx context.Context, s podSpec) *corev1.Pod {
	t.Helper()
	if err := controlplane.EnsureNamespace(ctx, env.admin, s.namespace); err != nil {
		t.Fatal(err)
	}
	if _, err := env.admin.CoreV1().ServiceAccounts(s.namespace).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: s.serviceAccount}}, metav1.CreateOptions{}); err != nil && !strings.Contains(err.Error(), "already exists") {
		t.Fatal(err)
	}
	if s.restart == "" {
		s.restart = corev1.RestartPolicyNever
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: s.name, Namespace: s.namespace},
		Spec: corev1.PodSpec{
			NodeName:           nodeName,
			HostNetwork:        true,
			ServiceAccountName: s.serviceAccount,
			// No kube-controller-manager publishes kube-root-ca.crt here;
			// kubelet's podCertificate volume needs no token.
			AutomountServiceAccountToken:  new(false),
			RestartPolicy:                 s.restart,
			TerminationGracePeriodSeconds: new(int64(1)),
			Containers: []corev1.Container{{
				Name: "workload", Image: env.images.WorkloadRef, ImagePullPolicy: corev1.PullNever, Args: s.args,
				VolumeMounts: []corev1.VolumeMount{{Name: "keyward", MountPath: credDir, ReadOnly: true}},
			}},
			Volumes: []corev1.Volume{{Name: "keyward", VolumeSource: corev1.VolumeSource{
				Projected: &corev1.ProjectedVolumeSource{Sources: s.sources}}}},
		},
	}
	if s.sidecar != nil {
		c := pod.Spec.Containers[0]
		c.Name, c.Args = "trust", s.sidecar
		pod.Spec.Containers = append(pod.Spec.Containers, c)
	}
	created, err := env.admin.CoreV1().Pods(s.namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = env.admin.CoreV1().Pods(s.namespace).Delete(context.Background(), s.name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	})
	return created
}

// waitPodPhase waits for the pod to reach one of phases and returns it;
// on timeout it names the pod's phase, container states and events.
func waitPodPhase(t *testing.T, ctx context.Context, ns, name string, timeout time.Duration, phases ...corev1.PodPhase) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := env.admin.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		for _, ph := range phases {
			if p.Status.Phase == ph {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("pod %s/%s not %v after %s: %s", ns, name, phases, timeout, describePod(ctx, pod))
	}
	return pod
}

// describePod names what a test needs to see when a pod misbehaves.
func describePod(ctx context.Context, pod *corev1.Pod) string {
	if pod == nil {
		return "pod never read"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", pod.Status.Phase)
	for _, c := range pod.Status.ContainerStatuses {
		fmt.Fprintf(&b, "; container %s: %+v", c.Name, c.State)
	}
	for _, e := range podEvents(ctx, pod.Namespace, pod.Name) {
		fmt.Fprintf(&b, "; event %s %s: %s", e.Type, e.Reason, e.Message)
	}
	if err := env.node.KubeletExited(); err != nil {
		fmt.Fprintf(&b, "; %v", err)
	}
	return b.String()
}

func podEvents(ctx context.Context, ns, name string) []corev1.Event {
	evs, err := env.admin.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return nil
	}
	return evs.Items
}

// workloadLines reads the pod's log through kube-apiserver (which reaches
// kubelet's keyward-issued serving certificate through keyward's CA) and
// returns the workload's lines.
func workloadLines(t *testing.T, ctx context.Context, ns, name string) []workloadLine {
	t.Helper()
	raw, err := env.admin.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s/%s through kube-apiserver: %v", ns, name, err)
	}
	var out []workloadLine
	sc := bufio.NewScanner(strings.NewReader(string(raw)))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "KEYWARD-WORKLOAD ")
		if !ok {
			continue
		}
		var l workloadLine
		if err := json.Unmarshal([]byte(rest), &l); err != nil {
			t.Fatalf("workload line %q: %v", rest, err)
		}
		out = append(out, l)
	}
	return out
}

// Each PodCertificateRequest profile, as a pod on a real kubelet sees it:
// kubelet makes the key, asks keyward through a PodCertificateRequest,
// projects the credential bundle, and projects the signer's live
// ClusterTrustBundle (by name, and by signer name + label); the workload,
// in the container, verifies the leaf against that bundle with x509.
func TestPodCertificatesOnARealKubelet(t *testing.T) {
	ctx := testContext(t, 3*time.Minute)
	cases := []struct {
		name, signer, keyType string
		annotations           map[string]string
		trust                 corev1.VolumeProjection
		check                 func(t *testing.T, l workloadLine)
	}{
		{name: "pod-identity", signer: podIdentity, keyType: "ECDSAP256", trust: liveBundleByName(podIdentity),
			check: func(t *testing.T, l workloadLine) {
				if want := "CN=system:serviceaccount:node-pods:app-pod-identity"; l.Subject != want {
					t.Errorf("subject %q, want %q", l.Subject, want)
				}
			}},
		{name: "spiffe", signer: spiffeSigner, keyType: "ED25519", trust: liveBundleBySigner(spiffeSigner),
			check: func(t *testing.T, l workloadLine) {
				if want := "spiffe://cluster.local/ns/node-pods/sa/app-spiffe"; len(l.URIs) != 1 || l.URIs[0] != want {
					t.Errorf("URIs %v, want [%s]", l.URIs, want)
				}
			}},
		{name: "server", signer: serverSigner, keyType: "RSA3072", trust: liveBundleByName(serverSigner),
			annotations: map[string]string{"keyward.dev/dns-names": "app-server.node-pods.svc"},
			check: func(t *testing.T, l workloadLine) {
				if len(l.DNSNames) != 1 || l.DNSNames[0] != "app-server.node-pods.svc" {
					t.Errorf("DNS names %v, want [app-server.node-pods.svc]", l.DNSNames)
				}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			began := time.Now()
			createPod(t, ctx, podSpec{
				namespace: "node-pods", name: "verify-" + c.name, serviceAccount: "app-" + c.name,
				args:    []string{"verify", "--credential-bundle", credBundle, "--trust", trustFile, "--once"},
				sources: []corev1.VolumeProjection{podCertificate(c.signer, c.keyType, c.annotations), c.trust},
			})
			pod := waitPodPhase(t, ctx, "node-pods", "verify-"+c.name, 90*time.Second, corev1.PodSucceeded, corev1.PodFailed)
			lines := workloadLines(t, ctx, "node-pods", pod.Name)
			if len(lines) != 1 || lines[0].Event != "verify" {
				t.Fatalf("workload printed %+v, want one verify line; pod: %s", lines, describePod(ctx, pod))
			}
			l := lines[0]
			if !l.OK || pod.Status.Phase != corev1.PodSucceeded {
				t.Fatalf("in the container, the leaf did not verify against the projected bundle: %s (pod %s)", l.Error, pod.Status.Phase)
			}
			if l.KeyType != c.keyType {
				t.Errorf("key type %s, want %s (kubelet made the key the volume asked for)", l.KeyType, c.keyType)
			}
			root := env.roots[c.signer]
			if want := fingerprint(root.Raw); len(l.RootSHA256) != 1 || l.RootSHA256[0] != want {
				t.Errorf("projected bundle roots %v, want only %s's g1 root %s", l.RootSHA256, c.signer, want)
			}
			if l.Issuer != root.Subject.String() {
				t.Errorf("issuer %q, want %q", l.Issuer, root.Subject)
			}
			c.check(t, l)
			t.Logf("%s: pod created → container verified a %s leaf from keyward in %s", c.name, c.keyType, time.Since(began).Round(100*time.Millisecond))
		})
	}
}

// A request keyward denies reaches the pod's owner as kubelet shows it:
// the pod does not start, and its events carry keyward's reason.
func TestADeniedPodCertificateIsAPodEvent(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	createPod(t, ctx, podSpec{
		namespace: "node-pods", name: "denied-server", serviceAccount: "app-denied",
		args: []string{"verify", "--credential-bundle", credBundle, "--trust", trustFile, "--once"},
		sources: []corev1.VolumeProjection{
			podCertificate(serverSigner, "ECDSAP256", map[string]string{"keyward.dev/dns-names": "www.bank.example"}),
			liveBundleByName(serverSigner),
		},
	})
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		seen = seen[:0]
		for _, e := range podEvents(ctx, "node-pods", "denied-server") {
			seen = append(seen, e.Reason+": "+e.Message)
			// kubelet's event: reason Denied, keyward's reason and message
			// in its text (docs/troubleshooting.md shows its form).
			if e.Reason == "Denied" && strings.Contains(e.Message, "DNSNameNotAllowed") &&
				strings.Contains(e.Message, `is not allowed for pod node-pods/denied-server`) {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no pod event names keyward's denial of www.bank.example; events: %q", seen)
	}
	pod, err := env.admin.CoreV1().Pods("node-pods").Get(ctx, "denied-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Status.Phase == corev1.PodRunning || pod.Status.Phase == corev1.PodSucceeded {
		t.Errorf("pod %s with a denied certificate; want it held at volume set-up", pod.Status.Phase)
	}
	t.Logf("pod events: %q", seen)
}
