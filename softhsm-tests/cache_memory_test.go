package softhsmtests

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	informerscertv1beta1 "k8s.io/client-go/informers/certificates/v1beta1"
	"k8s.io/client-go/tools/cache"
)

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// waitAllTerminal watches signerName's requests until n have a terminal
// condition, keeping only their names.
func waitAllTerminal(b *testing.B, ctx context.Context, signerName string, n int, timeout time.Duration) {
	b.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pcrs := cp.AdminClient().CertificatesV1().PodCertificateRequests(metav1.NamespaceAll)
	sel := fields.OneTermEqualSelector("spec.signerName", signerName).String()
	done := map[string]bool{}
	for len(done) < n {
		list, err := pcrs.List(ctx, metav1.ListOptions{FieldSelector: sel})
		if err != nil {
			b.Fatalf("listing: %v (%d of %d terminal)", err, len(done), n)
		}
		for _, p := range list.Items {
			if len(p.Status.Conditions) > 0 {
				done[p.Name] = true
			}
		}
		if len(done) >= n {
			return
		}
		w, err := pcrs.Watch(ctx, metav1.ListOptions{FieldSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			b.Fatalf("watching: %v", err)
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*certv1.PodCertificateRequest); ok && ev.Type != watch.Deleted && len(p.Status.Conditions) > 0 {
				done[p.Name] = true
				if len(done) >= n {
					break
				}
			}
		}
		w.Stop()
	}
}

// BenchmarkPCRCacheMemory: 10 000 PCRs issued by an in-process signer
// (discovery: v1beta1 here); the live heap the signer keeps for them,
// against what a plain informer (no transform) over the same requests
// keeps. Run with: go test -run '^$' -bench PCRCacheMemory -benchtime 1x ./softhsm-tests/
func BenchmarkPCRCacheMemory(b *testing.B) {
	const n = 10000
	ctx := testContext(b)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Minute)
	defer cancel()
	name := "keyward.dev/mem-" + uniqueName(b, "m")
	w := podOnNode(b, ctx, uniqueName(b, "node"), name)
	node := nodeClient(b, w.Node.Name)
	keyURI, caFile, _ := caInToken(b, "ca-"+uniqueName(b, "mem"))
	cfg := baseConfig(b, signerConfig(b, name, config.ProfilePodIdentity, keyURI, caFile))
	cfg.Workers = benchCreators

	base := heapInUse()
	s := runSigner(b, cfg, "mem")
	parallel(n, benchCreators, func(int) {
		p, _ := newPCR(b, w, name)
		if _, err := node.CertificatesV1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	})
	waitAllTerminal(b, ctx, name, n, 10*time.Minute)
	time.Sleep(2 * time.Second) // the signer's informer sees the last writes
	withSigner := heapInUse()
	s.Stop()
	without := heapInUse()

	inf := informerscertv1beta1.NewFilteredPodCertificateRequestInformer(cp.AdminClient(), metav1.NamespaceAll, 0, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", name).String()
		})
	stop := make(chan struct{})
	go inf.Run(stop)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("plain informer did not sync")
	}
	if got := len(inf.GetStore().ListKeys()); got != n {
		b.Fatalf("plain informer holds %d requests, want %d", got, n)
	}
	plain := heapInUse()
	runtime.KeepAlive(inf)
	close(stop)

	mb := func(v uint64, from uint64) float64 { return (float64(v) - float64(from)) / 1e6 }
	b.ReportMetric(mb(withSigner, base), "signer-heap-MB")
	b.ReportMetric(mb(plain, without), "plain-informer-heap-MB")
	b.ReportMetric(mb(without, base), "after-stop-MB")
}
