package nodetests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The rotation scenario's gates: short, so a whole rotation fits the run.
// kubelet here resyncs every 10s, and a bundle change was measured in
// running pods 6-11 s later, so 20s lets it reach every running pod before
// the next step (the trust publisher warns that this is below its
// kubeletSyncFrequency rule of 45s; the test measures it instead).
const (
	rotationSoak   = 3 * time.Second
	rotationWindow = 20 * time.Second
	meshPort       = "18443"
)

// trustStep runs `keyward trust VERB SIGNER GEN [extra...] --wait`, again
// while a gate holds (exit code 3), until it is accepted.
func trustStep(t *testing.T, ctx context.Context, verb, signer, gen string, extra ...string) {
	t.Helper()
	args := append([]string{"trust", verb, signer, gen, "--wait", "--timeout", "2m"}, extra...)
	var refused error
	for {
		_, err := env.run(ctx, args...)
		if err == nil {
			return
		}
		var ee *exec.ExitError
		if ctx.Err() != nil && refused != nil {
			t.Fatalf("%v; the last refusal: %v", ctx.Err(), refused)
		}
		if !errors.As(err, &ee) || ee.ExitCode() != 3 {
			t.Fatalf("%v", err)
		}
		refused = err
		time.Sleep(time.Second)
	}
}

// timedLine is a workload line with kubelet's timestamp for it.
type timedLine struct {
	at time.Time
	workloadLine
}

// timedLines reads one container's workload lines with their timestamps.
func timedLines(t *testing.T, ctx context.Context, ns, pod, container string) []timedLine {
	t.Helper()
	raw, err := env.admin.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, Timestamps: true}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("logs of %s/%s[%s]: %v", ns, pod, container, err)
	}
	var out []timedLine
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		stamp, rest, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		rest, ok = strings.CutPrefix(rest, "KEYWARD-WORKLOAD ")
		if !ok {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			t.Fatalf("log timestamp %q: %v", stamp, err)
		}
		var l timedLine
		l.at = at
		if err := json.Unmarshal([]byte(rest), &l.workloadLine); err != nil {
			t.Fatalf("workload line %q: %v", rest, err)
		}
		out = append(out, l)
	}
	return out
}

// meshPod is an mTLS pod of the mesh signer: its main container serves or
// dials, a second one (trust) reports every change of the projected files.
func meshPod(t *testing.T, ctx context.Context, name string, main []string) {
	t.Helper()
	createPod(t, ctx, podSpec{
		namespace: "node-mesh", name: name, serviceAccount: name, args: main,
		sources: []corev1.VolumeProjection{podCertificate(meshSigner, "ECDSAP256", nil), liveBundleBySigner(meshSigner)},
		restart: corev1.RestartPolicyAlways,
		sidecar: []string{"verify", "--credential-bundle", credBundle, "--trust", trustFile, "--interval", "500ms"},
	})
	waitPodPhase(t, ctx, "node-mesh", name, time.Minute, corev1.PodRunning)
}

// bundleChanges records when the mesh signer's live ClusterTrustBundle
// changed, as this test sees it (polled every 100 ms).
type bundleChanges struct {
	mu      sync.Mutex
	changes []bundleChange
}

type bundleChange struct {
	at    time.Time
	roots []string // sha256 of each root, sorted
}

func watchLiveBundle(ctx context.Context, signer string) *bundleChanges {
	b := &bundleChanges{}
	name := strings.ReplaceAll(signer, "/", ":") + ":live"
	go func() {
		last := ""
		for ctx.Err() == nil {
			ctb, err := env.admin.CertificatesV1().ClusterTrustBundles().Get(ctx, name, metav1.GetOptions{})
			if err == nil && ctb.Spec.TrustBundle != last {
				last = ctb.Spec.TrustBundle
				roots := pemFingerprints(last)
				b.mu.Lock()
				b.changes = append(b.changes, bundleChange{at: time.Now(), roots: roots})
				b.mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	return b
}

func (b *bundleChanges) when(roots []string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.changes {
		if slices.Equal(c.roots, roots) {
			return c.at, true
		}
	}
	return time.Time{}, false
}

// A CA rotation of the mesh signer, canary then live, under live mTLS
// traffic between pods on the real kubelet:
//
//   - server s1 and client c1 start with g1 leaves; c1 dials s1 every 500 ms
//     with the files kubelet keeps projecting;
//   - g2 is staged, promoted (its root reaches the running pods' live
//     volumes), activated: pods started from then on get g2 leaves, and
//     talk with the g1 pods in both directions (s2 ↔ c1's server s1);
//   - retiring g1 is refused while g1 leaves live (LeavesValid); the g1
//     pods are replaced, and retire and finish are then forced (the leaves
//     are 1h at least, the apiserver's floor, far beyond a test);
//   - through all of it, no handshake fails; every pod verifies its own
//     leaf against its own projected bundle from the start.
//
// It reports the time from each live-bundle change to the file changing
// inside the running containers.
func TestCARotationUnderLiveMTLS(t *testing.T) {
	ctx := testContext(t, 6*time.Minute)
	began := time.Now()
	changes := watchLiveBundle(ctx, meshSigner)
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		changes.mu.Lock()
		defer changes.mu.Unlock()
		for _, c := range changes.changes {
			t.Logf("live bundle at %s: %v", c.at.Format(time.RFC3339Nano), c.roots)
		}
	})
	g1 := fingerprint(env.roots[meshSigner].Raw)
	s1Addr := env.node.IP + ":" + meshPort
	s2Addr := env.node.IP + ":18444"

	// The same live bundle projected by name, watched beside the others:
	// kubelet v1.37 keeps a by-name projection of a bundle with a
	// signerName for its cache's 5-minute TTL (kubernetes/kubernetes#141439).
	createPod(t, ctx, podSpec{
		namespace: "node-mesh", name: "by-name", serviceAccount: "by-name", restart: corev1.RestartPolicyAlways,
		args:    []string{"verify", "--credential-bundle", credBundle, "--trust", trustFile, "--interval", "500ms"},
		sources: []corev1.VolumeProjection{podCertificate(meshSigner, "ECDSAP256", nil), liveBundleByName(meshSigner)},
	})
	waitPodPhase(t, ctx, "node-mesh", "by-name", time.Minute, corev1.PodRunning)
	byNameStarted := time.Now() // kubelet's cache entry for it is at most this old
	meshPod(t, ctx, "s1", []string{"mtls-serve", "--listen", s1Addr, "--credential-bundle", credBundle, "--trust", trustFile})
	meshPod(t, ctx, "c1", []string{"mtls-dial", "--addr", s1Addr, "--credential-bundle", credBundle, "--trust", trustFile, "--interval", "500ms"})
	waitDialed(t, ctx, "c1", 1)

	// Stage and promote g2: its root reaches the live bundle.
	// A new key in the token and its root, Staged: in the canary bundle.
	g2Root, err := env.caInit(ctx, meshSigner, "g2")
	if err != nil {
		t.Fatal(err)
	}
	g2 := fingerprint(g2Root.Raw)
	both := sorted(g1, g2)
	early := startVerifyPod(t, ctx, "during-canary")
	trustStep(t, ctx, "promote", meshSigner, "g2")
	t.Logf("promoted at %s", time.Now().Format(time.RFC3339Nano))
	promoted := startVerifyPod(t, ctx, "after-promote")
	if l := onlyVerify(t, ctx, promoted); !slices.Equal(sorted(l.RootSHA256...), both) {
		t.Fatalf("pod %s started after promote: live volume roots %v, want g1 and g2 %v", promoted, l.RootSHA256, both)
	}
	trustStep(t, ctx, "activate", meshSigner, "g2")
	// The signer follows status through its informer, moments behind.
	activated := startVerifyPod(t, ctx, "after-activate")

	meshPod(t, ctx, "s2", []string{"mtls-serve", "--listen", s2Addr, "--credential-bundle", credBundle, "--trust", trustFile})
	meshPod(t, ctx, "c2", []string{"mtls-dial", "--addr", s1Addr, "--credential-bundle", credBundle, "--trust", trustFile, "--interval", "500ms"})
	meshPod(t, ctx, "c3", []string{"mtls-dial", "--addr", s2Addr, "--credential-bundle", credBundle, "--trust", trustFile, "--interval", "500ms"})
	waitDialed(t, ctx, "c2", 3)
	waitDialed(t, ctx, "c3", 3)

	// Retire g1: refused while its leaves are valid.
	if _, err := env.run(ctx, "trust", "retire", meshSigner, "g1"); err == nil || !strings.Contains(err.Error(), string(v1alpha1.GateLeavesValid)) {
		t.Fatalf("retire g1 while g1 leaves are valid: %v; want a refusal naming %s", err, v1alpha1.GateLeavesValid)
	}
	// Replace the g1 pods (clients first, so no dial meets a server
	// going away), then force the leaf gate they held.
	checkDials(t, ctx, "c1", s1Addr)
	checkDials(t, ctx, "c2", s1Addr)
	keepTrustLines(t, ctx, "s1")
	for _, p := range []string{"c1", "c2", "s1"} {
		deletePod(t, ctx, "node-mesh", p)
	}
	const why = "node-tests: every pod holding a g1 leaf was replaced; leaves are 1h at least"
	trustStep(t, ctx, "retire", meshSigner, "g1", "--force", "--reason", why)
	trustStep(t, ctx, "finish", meshSigner, "g1", "--force", "--reason", why)
	// The live bundle without g1 reaches the running pods.
	waitTrustFile(t, ctx, "s2", []string{g2})
	waitTrustFile(t, ctx, "c3", []string{g2})
	late := startVerifyPod(t, ctx, "after-finish")

	// What each pod saw.
	for _, v := range []struct {
		pod        string
		wantIssuer string
		wantRoots  []string
	}{
		{early, "g1", []string{g1}},
		{promoted, "g1", both},
		{activated, "g2", both},
		{late, "g2", []string{g2}},
	} {
		l := onlyVerify(t, ctx, v.pod)
		if !l.OK {
			t.Errorf("pod %s: its leaf did not verify against its projected live bundle: %s", v.pod, l.Error)
		}
		if !strings.HasSuffix(l.Issuer, " "+v.wantIssuer) {
			t.Errorf("pod %s: leaf issuer %q, want generation %s", v.pod, l.Issuer, v.wantIssuer)
		}
		if !slices.Equal(sorted(l.RootSHA256...), v.wantRoots) {
			t.Errorf("pod %s: live volume roots %v, want %v", v.pod, l.RootSHA256, v.wantRoots)
		}
	}
	checkDials(t, ctx, "c3", s2Addr)
	keepTrustLines(t, ctx, "s2")

	// The by-name projection, as kubelet v1.37 keeps it.
	if promotedAt, ok := changes.when(both); ok {
		var byName time.Time
		for _, l := range timedLines(t, ctx, "node-mesh", "by-name", "workload") {
			if slices.Equal(sorted(l.RootSHA256...), both) {
				byName = l.at
				break
			}
		}
		switch {
		case byName.IsZero():
			t.Logf("promote: the by-name projection still lacked g2 %s after the bundle changed (kubelet's 5-minute cache, kubernetes/kubernetes#141439); docs/rotation.md says to project by signerName + labelSelector", time.Since(promotedAt).Round(time.Second))
		case byName.Sub(promotedAt) < rotationWindow && promotedAt.Sub(byNameStarted) < 5*time.Minute-rotationWindow:
			t.Errorf("promote reached the by-name projection after %s: kubelet no longer keeps it for its cache TTL (kubernetes/kubernetes#141439 fixed?): revisit docs/rotation.md's projection advice and this check", byName.Sub(promotedAt).Round(100*time.Millisecond))
		default:
			t.Logf("promote: by-name projection changed after %s (kubelet's cache TTL)", byName.Sub(promotedAt).Round(time.Second))
		}
	}

	// Bundle change → file change inside running containers.
	for _, m := range []struct {
		what  string
		roots []string
		pods  []string
	}{
		{"promote (g2 root added to live)", both, []string{"s1", "c1"}},
		{"finish (g1 root removed from live)", []string{g2}, []string{"s2", "c3"}},
	} {
		changed, ok := changes.when(m.roots)
		if !ok {
			t.Errorf("%s: the test never saw the live bundle hold %v", m.what, m.roots)
			continue
		}
		for _, p := range m.pods {
			seen := seenInContainer(m.roots, p)
			if seen.IsZero() {
				t.Errorf("%s: pod %s's trust file never held %v", m.what, p, m.roots)
				continue
			}
			// A measurement, not a timed assertion: what a slow change
			// would break, the handshakes and verifications above check.
			t.Logf("%s: ClusterTrustBundle changed → file changed in running pod %s after %s (window %s)", m.what, p, seen.Sub(changed).Round(100*time.Millisecond), rotationWindow)
		}
	}
	t.Logf("whole rotation under traffic: %s", time.Since(began).Round(time.Second))
}

// seenRoots holds each pod's trust-sidecar lines, read before the pods
// are deleted (their logs go with them).
var (
	seenMu    sync.Mutex
	seenRoots = map[string][]timedLine{}
)

func seenInContainer(roots []string, pod string) time.Time {
	seenMu.Lock()
	defer seenMu.Unlock()
	for _, l := range seenRoots[pod] {
		if slices.Equal(sorted(l.RootSHA256...), roots) {
			return l.at
		}
	}
	return time.Time{}
}

// checkDials reads a client's dial lines and its trust sidecar's lines
// (kept for the propagation report); a failed handshake fails the test.
func checkDials(t *testing.T, ctx context.Context, client, addr string) {
	t.Helper()
	lines := timedLines(t, ctx, "node-mesh", client, "workload")
	ok := 0
	for _, l := range lines {
		switch l.Event {
		case "dialed":
			ok++
		case "dial-failed":
			t.Errorf("client %s → %s at %s: %s", client, addr, l.at.Format(time.RFC3339Nano), l.Error)
		}
	}
	t.Logf("client %s → %s: %d handshakes, every one verified both ways", client, addr, ok)
	keepTrustLines(t, ctx, client)
}

// keepTrustLines reads a mesh pod's trust sidecar and fails the test on
// any moment its own leaf did not verify against its own live volume.
func keepTrustLines(t *testing.T, ctx context.Context, pod string) {
	t.Helper()
	l := timedLines(t, ctx, "node-mesh", pod, "trust")
	seenMu.Lock()
	reported := len(seenRoots[pod])
	seenRoots[pod] = l
	seenMu.Unlock()
	for _, x := range l[min(reported, len(l)):] {
		if !x.OK {
			t.Errorf("pod %s at %s: its leaf (issuer %q) did not verify against its projected live bundle %v: %s",
				pod, x.at.Format(time.RFC3339Nano), x.Issuer, x.RootSHA256, x.Error)
		}
	}
}

// waitDialed waits until client has completed n handshakes.
func waitDialed(t *testing.T, ctx context.Context, client string, n int) {
	t.Helper()
	var got int
	var failed []string
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got, failed = 0, nil
		for _, l := range timedLines(t, ctx, "node-mesh", client, "workload") {
			switch l.Event {
			case "dialed":
				got++
			default:
				failed = append(failed, l.Event+": "+l.Error)
			}
		}
		return got >= n, nil
	}); err != nil {
		if len(failed) > 3 {
			failed = failed[len(failed)-3:]
		}
		for _, pod := range []string{"s1", "s2"} {
			for _, c := range []string{"workload", "trust"} {
				if raw, err := env.admin.CoreV1().Pods("node-mesh").GetLogs(pod, &corev1.PodLogOptions{Container: c, Timestamps: true}).DoRaw(ctx); err == nil {
					t.Logf("%s[%s]:\n%s", pod, c, lastLines(string(raw), 6))
				}
			}
		}
		t.Fatalf("client %s: %d handshakes, want %d; last other lines: %q", client, got, n, failed)
	}
}

// waitTrustFile waits until pod's trust sidecar reports exactly roots.
func waitTrustFile(t *testing.T, ctx context.Context, pod string, roots []string) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		keepTrustLines(t, ctx, pod)
		return !seenInContainer(roots, pod).IsZero(), nil
	}); err != nil {
		t.Fatalf("pod %s's trust file never held %v", pod, roots)
	}
}

// startVerifyPod starts a pod that verifies its mesh leaf against its live
// volume once, and returns its name.
func startVerifyPod(t *testing.T, ctx context.Context, name string) string {
	t.Helper()
	createPod(t, ctx, podSpec{
		namespace: "node-mesh", name: name, serviceAccount: "verifier",
		args:    []string{"verify", "--credential-bundle", credBundle, "--trust", trustFile, "--once"},
		sources: []corev1.VolumeProjection{podCertificate(meshSigner, "ECDSAP256", nil), liveBundleBySigner(meshSigner)},
	})
	waitPodPhase(t, ctx, "node-mesh", name, time.Minute, corev1.PodSucceeded, corev1.PodFailed)
	return name
}

func onlyVerify(t *testing.T, ctx context.Context, pod string) workloadLine {
	t.Helper()
	lines := workloadLines(t, ctx, "node-mesh", pod)
	if len(lines) != 1 {
		t.Fatalf("pod %s printed %d lines, want one verify line", pod, len(lines))
	}
	return lines[0]
}

func deletePod(t *testing.T, ctx context.Context, ns, name string) {
	t.Helper()
	if err := env.admin.CoreV1().Pods(ns).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
}

// authorityOf is the Authority name keyward ca init derives for a signer.
func authorityOf(signer string) string { return strings.ReplaceAll(signer, "/", ".") }

func sorted(s ...string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// pemFingerprints is the sorted SHA-256 of each certificate in a PEM
// bundle (none if it does not parse).
func pemFingerprints(bundle string) []string {
	certs, _ := pemcert.Parse([]byte(bundle))
	var out []string
	for _, c := range certs {
		out = append(out, fingerprint(c.Raw))
	}
	slices.Sort(out)
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
