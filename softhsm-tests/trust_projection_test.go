package softhsmtests

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/trust"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// keyward node trust, as the node identity (system:node:<name>, Node
// authorizer), follows the canary/live ClusterTrustBundles of a signer:
// each change reaches the file (latency measured and logged), a Node label
// switches the node between live and canary, and an empty selection keeps
// the last good file.
func TestTrustProjectionFollowsBundlesAndNodeLabel(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "proj")
	signer := "keyward.dev/" + suffix
	const versionLabel = "keyward.dev/cluster-trust-bundle-version"
	const nodeLabel = "keyward.dev/trust-bundle"
	node := suffix
	admin := cp.AdminClient()
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("creating Node %s: %v", node, err)
	}
	t.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(t.Context(), node, metav1.DeleteOptions{}) })

	publisher := trustPublisherClient(t)
	ctbName := func(v string) string { return strings.ReplaceAll(signer, "/", ":") + ":" + v }
	cas := make([]string, 5)
	for i := range cas {
		cas[i] = newTestCA(t).pem
	}
	for v, bundle := range map[string]string{"live": cas[0], "canary": cas[0] + cas[1]} {
		ctb := &certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: ctbName(v), Labels: map[string]string{versionLabel: v}},
			Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: bundle},
		}
		if _, err := publisher.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", ctb.Name, err)
		}
		t.Cleanup(func() {
			_ = admin.CertificatesV1().ClusterTrustBundles().Delete(t.Context(), ctb.Name, metav1.DeleteOptions{})
		})
	}

	dir := t.TempDir()
	outcomes := make(chan trust.Outcome, 100)
	// The hook fails its first run; the projection goes on.
	var hookCalls atomic.Int32
	hookErr := errors.New("reload failed")
	p, err := trust.New(trust.Options{
		Client:     nodeClient(t, node),
		SignerName: signer,
		NodeName:   node,
		NodeLabel:  nodeLabel,
		Dir:        dir,
		UID:        -1, GID: -1,
		Synced: func(o trust.Outcome) { outcomes <- o },
		// Each change below waits for its write, which is more than this
		// apart: each write gets its own hook run.
		OnChangeDebounce: 10 * time.Millisecond,
		OnChange: func(context.Context) error {
			if hookCalls.Add(1) == 1 {
				return hookErr
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(0), ktesting.BufferLogs(true)))
	logs := logger.GetSink().(ktesting.Underlier).GetBuffer()
	runCtx, stop := context.WithCancel(klog.NewContext(ctx, logger))
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("projector: %v", err)
		}
	})

	file := filepath.Join(dir, trust.DefaultFileName)
	// waitFor returns how long after start the projector wrote want. With
	// onlyWant set, any other write on the way fails the test.
	onlyWant := false
	waitFor := func(what string, start time.Time, want string) time.Duration {
		t.Helper()
		wantData := trust.Merge([]byte(want))
		for {
			select {
			case o := <-outcomes:
				if o.Written && onlyWant && !bytes.Equal(o.Data, wantData) {
					t.Fatalf("%s: projector wrote %q first", what, o.Data)
				}
				if !o.Written || !bytes.Equal(o.Data, wantData) {
					continue
				}
				took := time.Since(start)
				got, err := os.ReadFile(file)
				if err != nil || !bytes.Equal(got, wantData) {
					t.Fatalf("%s: projector wrote the expected data but %s holds %q (%v)", what, file, got, err)
				}
				return took
			case <-ctx.Done():
				t.Fatalf("%s: the trust file never held the expected certificates", what)
			}
		}
	}
	waitFor("first projection of live", time.Now(), cas[0])

	setBundle := func(v, bundle string) time.Time {
		t.Helper()
		ctb, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, ctbName(v), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		ctb.Spec.TrustBundle = bundle
		start := time.Now()
		if _, err := admin.CertificatesV1().ClusterTrustBundles().Update(ctx, ctb, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("updating %s: %v", ctb.Name, err)
		}
		return start
	}
	setNodeLabel := func(value string) time.Time {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[nodeLabel] = value
		start := time.Now()
		if _, err := admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("labelling Node %s: %v", node, err)
		}
		return start
	}

	var latencies []time.Duration
	measure := func(what string, start time.Time, want string) {
		t.Helper()
		took := waitFor(what, start, want)
		t.Logf("latency %-40s %v", what, took.Round(time.Millisecond))
		latencies = append(latencies, took)
	}
	// The first write's hook run (the failing one) before the next change:
	// changes closer together than OnChangeDebounce share one run.
	for deadline := time.Now().Add(20 * time.Second); hookCalls.Load() < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hook never ran after the first write")
		}
	}
	// The live bundle changes: a new CA added, then the old one removed.
	measure("live bundle: CA added", setBundle("live", cas[0]+cas[2]), cas[0]+cas[2])
	for deadline := time.Now().Add(20 * time.Second); hookCalls.Load() < 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("hook ran %d times after two writes, want 2", hookCalls.Load())
		}
	}
	if !strings.Contains(logs.String(), hookErr.Error()) {
		t.Fatalf("the hook's failure is not logged:\n%s", logs.String())
	}
	measure("live bundle: old CA dropped", setBundle("live", cas[2]), cas[2])
	// The node is labelled canary: it takes the canary bundle, and
	// follows its changes.
	measure("node labelled canary", setNodeLabel("canary"), cas[0]+cas[1])
	measure("canary bundle: CA added", setBundle("canary", cas[0]+cas[1]+cas[3]), cas[0]+cas[1]+cas[3])
	// A change of the live bundle does not reach a canary node; the next
	// canary change does.
	onlyWant = true
	setBundle("live", cas[2]+cas[4])
	measure("canary bundle: CA dropped", setBundle("canary", cas[1]+cas[3]), cas[1]+cas[3])
	onlyWant = false
	// Back to live.
	measure("node labelled live", setNodeLabel("live"), cas[2]+cas[4])

	slices.Sort(latencies)
	median := latencies[len(latencies)/2]
	t.Logf("latencies: median %v, max %v over %d changes", median.Round(time.Millisecond), latencies[len(latencies)-1].Round(time.Millisecond), len(latencies))
	if median > 2*time.Second {
		t.Errorf("median latency %v from a change to the file, want within 2 s", median)
	}

	// The selection becomes empty: the last good file stays.
	if err := admin.CertificatesV1().ClusterTrustBundles().Delete(ctx, ctbName("live"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for o := range outcomes {
		if o.Written {
			t.Fatalf("projector wrote %q after the live bundle was deleted", o.Data)
		}
		if o.Empty {
			break
		}
	}
	// Another event while the selection stays empty: still kept, said once.
	setBundle("canary", cas[1]+cas[3]+"\n")
	for o := range outcomes {
		if o.Written {
			t.Fatalf("projector wrote %q while the selection is empty", o.Data)
		}
		if o.Empty {
			break
		}
	}
	got, err := os.ReadFile(file)
	if want := trust.Merge([]byte(cas[2] + cas[4])); err != nil || !bytes.Equal(got, want) {
		t.Fatalf("after the selection became empty the file holds %q (%v), want the last good file", got, err)
	}
	if n := strings.Count(logs.String(), "No certificate in the selected"); n != 1 {
		t.Fatalf("the empty selection was said %d times at default verbosity, want once:\n%s", n, logs.String())
	}
	// The node switches to canary again: the file follows.
	measure("empty live, node labelled canary", setNodeLabel("canary"), cas[1]+cas[3])
}

// A bundle selected by name (metadata.name field selector) is projected
// as the node identity and followed when it changes.
func TestTrustProjectionByName(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "byname")
	signer := "keyward.dev/" + suffix
	name := strings.ReplaceAll(signer, "/", ":") + ":live"
	admin := cp.AdminClient()
	a, b := newTestCA(t).pem, newTestCA(t).pem
	ctb := &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: a},
	}
	if _, err := admin.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.CertificatesV1().ClusterTrustBundles().Delete(t.Context(), name, metav1.DeleteOptions{})
	})

	outcomes := make(chan trust.Outcome, 100)
	p, err := trust.New(trust.Options{
		Client: nodeClient(t, suffix), Name: name, Dir: t.TempDir(), UID: -1, GID: -1,
		Synced: func(o trust.Outcome) { outcomes <- o },
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(klog.NewContext(ctx, ktesting.NewLogger(t, ktesting.NewConfig())))
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })

	wait := func(what, want string, start time.Time) {
		t.Helper()
		for {
			select {
			case o := <-outcomes:
				if o.Written && bytes.Equal(o.Data, trust.Merge([]byte(want))) {
					t.Logf("latency %s: %v", what, time.Since(start).Round(time.Millisecond))
					return
				}
			case <-ctx.Done():
				t.Fatalf("%s: the file never held the expected certificates", what)
			}
		}
	}
	wait("first projection", a, time.Now())
	cur, err := admin.CertificatesV1().ClusterTrustBundles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec.TrustBundle = a + b
	start := time.Now()
	if _, err := admin.CertificatesV1().ClusterTrustBundles().Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait("bundle by name: CA added", a+b, start)
}
