package softhsmtests

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/nodehelper/trust"
	"github.com/keyward/keyward/signer/config"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// BenchmarkFailover: two signer replicas (child processes) with the
// default leader election (config.DefaultLeaseDuration 1 s, renew
// deadline 750 ms, retry 200 ms); the standby's caches are warm. The leader is
// killed with SIGKILL, so it releases nothing, and a PCR is created at
// once. s-failover is the time from the kill to that PCR seen Issued, by
// the standby (target ≤ 2 s).
func BenchmarkFailover(b *testing.B) {
	ctx := testContext(b)
	suffix := uniqueName(b, "fo")
	name := "keyward.dev/fo-" + suffix
	keyURI, caFile, _ := newCA(b, all.Options{}, fileKeyURI(b), "ca-"+suffix)
	cfg := baseConfig(b, signerConfig(b, name, config.ProfilePodIdentity, keyURI, caFile))
	on := true
	cfg.LeaderElection = config.LeaderElection{Enabled: &on, Namespace: signerNamespace, LeaseName: "fo-" + suffix}
	cfg.Default()

	leader := startSignerProcess(b, cfg, "replica-a")
	waitOutput(b, leader, "Leading")
	standby := startSignerProcess(b, cfg, "replica-b")
	waitOutput(b, standby, "Standing by")
	waitOutput(b, standby, "Caches warm")
	w := podOnNode(b, ctx, uniqueName(b, "node"), name)
	// The leader issues (its caches are synced) before it is killed.
	p, _ := createPCR(b, ctx, w, name, pcrOptions{})
	if c := condition(waitTerminal(b, ctx, p, 30*time.Second)); c.Type != "Issued" {
		b.Fatalf("before the kill: %s/%s %q", c.Type, c.Reason, c.Message)
	}

	leader.Kill()
	killed := time.Now()
	p, _ = createPCR(b, ctx, w, name, pcrOptions{})
	got := waitTerminal(b, ctx, p, time.Minute)
	took := time.Since(killed)
	if c := condition(got); c.Type != "Issued" {
		b.Fatalf("after the kill: %s/%s %q", c.Type, c.Reason, c.Message)
	}
	if !strings.Contains(standby.Output(), "Leading") {
		b.Fatalf("the PCR was issued but replica-b never led:\n%s", standby.Output())
	}
	b.ReportMetric(took.Seconds(), "s-failover")
	b.ReportMetric(cfg.LeaderElection.LeaseDuration.Seconds(), "s-lease")
}

// fileKeyURI is a file: key URI in a fresh directory. Not b.TempDir's: it
// is named after the sub-benchmark, and the "=" of key=... is not allowed
// in a file: key URI's path.
func fileKeyURI(b *testing.B) string {
	dir, err := os.MkdirTemp("", "keyward-bench-ca-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return "file:" + filepath.Join(dir, "ca.key")
}

// waitOutput waits up to 30 s for a replica to log want.
func waitOutput(b testing.TB, p *signerProcess, want string) {
	b.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.Output(), want) {
		if time.Now().After(deadline) {
			b.Fatalf("the replica never logged %q:\n%s", want, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkTrustPropagation: keyward node trust (the node agent's trust
// projector, with its node's identity) follows a signer's live
// ClusterTrustBundle; the bundle is changed 20 times, each time to a new
// set of CAs, and each change is timed from the apiserver accepting the
// update to the node's file holding the new bundle, read from disk (target
// ≤ 2 s for the slowest).
func BenchmarkTrustPropagation(b *testing.B) {
	const changes = 20
	ctx := testContext(b)
	suffix := uniqueName(b, "tp")
	signer := "keyward.dev/" + suffix
	admin := cp.AdminClient()
	node := suffix
	if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}, metav1.CreateOptions{}); err != nil {
		b.Fatalf("creating Node %s: %v", node, err)
	}
	b.Cleanup(func() { _ = admin.CoreV1().Nodes().Delete(context.Background(), node, metav1.DeleteOptions{}) })
	cas := make([]string, changes+1)
	for i := range cas {
		cas[i] = newTestCA(b).pem
	}
	// The admin stands in for the trust publisher: what is timed is the
	// node's side, from the change being stored.
	publisher := admin
	ctb, err := publisher.CertificatesV1().ClusterTrustBundles().Create(ctx, &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll(signer, "/", ":") + ":live",
			Labels: map[string]string{"keyward.dev/cluster-trust-bundle-version": "live"}},
		Spec: certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: cas[0]},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = admin.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), ctb.Name, metav1.DeleteOptions{})
	})

	dir := b.TempDir()
	p, err := trust.New(trust.Options{Client: nodeClient(b, node), SignerName: signer, NodeName: node,
		NodeLabel: "keyward.dev/trust-bundle", Dir: dir, UID: -1, GID: -1})
	if err != nil {
		b.Fatal(err)
	}
	// Quiet: a log line on the benchmark's stream splits its result line.
	runCtx, stop := context.WithCancel(klog.NewContext(ctx, logr.Discard()))
	done := make(chan error, 1)
	go func() { done <- p.Run(runCtx) }()
	b.Cleanup(func() { stop(); <-done })

	file := filepath.Join(dir, trust.DefaultFileName)
	waitFile := func(want string) {
		wantData := trust.Merge([]byte(want))
		deadline := time.Now().Add(30 * time.Second)
		for {
			if got, err := os.ReadFile(file); err == nil && bytes.Equal(got, wantData) {
				return
			}
			if time.Now().After(deadline) {
				b.Fatalf("%s never held the bundle", file)
			}
			time.Sleep(time.Millisecond)
		}
	}
	waitFile(cas[0])
	var lat []time.Duration
	for i := 1; i <= changes; i++ {
		// Alternating one and two CAs: every change rewrites the file.
		bundle := cas[i]
		if i%2 == 0 {
			bundle += cas[i-1]
		}
		ctb.Spec.TrustBundle = bundle
		if ctb, err = publisher.CertificatesV1().ClusterTrustBundles().Update(ctx, ctb, metav1.UpdateOptions{}); err != nil {
			b.Fatal(err)
		}
		accepted := time.Now()
		waitFile(bundle)
		lat = append(lat, time.Since(accepted))
	}
	reportLatencies(b, "", lat)
	var worst time.Duration
	for _, d := range lat {
		worst = max(worst, d)
	}
	b.ReportMetric(worst.Seconds(), "s-propagation-max")
}
