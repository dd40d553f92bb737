package softhsmtests

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/signer/config"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	informerscertv1 "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/tools/cache"
)

// Run with: go test -run '^$' -bench PCR -benchtime 1x ./softhsm-tests/
// (make bench). Each benchmark is one measured run, not b.N loops: the
// numbers are rates and latencies of a whole burst.

const benchWorkers = 8

// issuedWatcher records when each request (PCRs of a namespace, CSRs of a
// label) an informer delivers is first seen with a terminal status.
type issuedWatcher struct {
	mu     sync.Mutex
	seen   map[string]time.Time
	failed atomic.Int32
	done   chan struct{}
	want   int
}

// outcome judges one object an informer delivered: its name, whether its
// status is terminal yet, and if so whether it was issued.
type outcome func(obj any) (name string, terminal, issued bool)

func pcrOutcome(obj any) (string, bool, bool) {
	p, ok := obj.(*certv1.PodCertificateRequest)
	if !ok || len(p.Status.Conditions) == 0 {
		return "", false, false
	}
	return p.Name, true, p.Status.Conditions[0].Type == "Issued"
}

func watchIssued(tb testing.TB, ctx context.Context, ns string, want int) *issuedWatcher {
	tb.Helper()
	inf := informerscertv1.NewPodCertificateRequestInformer(cp.AdminClient(), ns, 0, cache.Indexers{})
	return watchOutcomes(tb, ctx, inf, want, pcrOutcome)
}

// watchOutcomes runs inf until ctx ends and records judge's terminal
// outcomes; it returns once inf has synced.
func watchOutcomes(tb testing.TB, ctx context.Context, inf cache.SharedIndexInformer, want int, judge outcome) *issuedWatcher {
	tb.Helper()
	iw := &issuedWatcher{seen: map[string]time.Time{}, done: make(chan struct{}), want: want}
	record := func(obj any) {
		name, terminal, issued := judge(obj)
		if !terminal {
			return
		}
		now := time.Now()
		iw.mu.Lock()
		defer iw.mu.Unlock()
		if _, dup := iw.seen[name]; !dup {
			// Counted once per request: an informer may deliver a
			// terminal object again (resync, a later update).
			if !issued {
				iw.failed.Add(1)
			}
			iw.seen[name] = now
			if len(iw.seen) == iw.want {
				close(iw.done)
			}
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: record, UpdateFunc: func(_, obj any) { record(obj) },
	}); err != nil {
		tb.Fatal(err)
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		tb.Fatal("watcher did not sync")
	}
	return iw
}

// snapshot is a copy of when each request was seen terminal.
func (iw *issuedWatcher) snapshot() map[string]time.Time {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	return maps.Clone(iw.seen)
}

func (iw *issuedWatcher) wait(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	select {
	case <-iw.done:
	case <-time.After(timeout):
		iw.mu.Lock()
		defer iw.mu.Unlock()
		tb.Fatalf("only %d of %d requests reached a status in %s", len(iw.seen), iw.want, timeout)
	}
	if n := iw.failed.Load(); n > 0 {
		tb.Fatalf("%d requests were not issued", n)
	}
}

// benchSetup makes a workload for signerName and, if run, a keyward signer
// with a SoftHSM CA key.
func benchSetup(b *testing.B, name string, run bool) *controlplane.WorkloadObjects {
	ctx := testContext(b)
	if run {
		keyURI, caFile, _ := caInToken(b, "ca-"+uniqueName(b, "bench"))
		cfg := baseConfig(b, signerConfig(b, name, config.ProfilePodIdentity, keyURI, caFile))
		cfg.Workers = benchWorkers
		runSigner(b, cfg, "bench")
	}
	return podOnNode(b, ctx, uniqueName(b, "node"), name)
}

// BenchmarkPCRThroughput: N PCRs created by the node as fast as it can,
// time until all are Issued by keyward; against a bare client that creates
// each PCR and writes an Issued status itself (in-memory CA), in the same
// run on the same apiserver.
func BenchmarkPCRThroughput(b *testing.B) {
	const n = 400
	ctx := testContext(b)

	// Bare client: create + status, benchWorkers at a time.
	bareName := "keyward.dev/bare-" + uniqueName(b, "t")
	bw := benchSetup(b, bareName, false)
	ca := newTestCA(b)
	node := nodeClient(b, bw.Node.Name)
	sc := signerClient(b)
	start := time.Now()
	parallel(n, benchWorkers, func(int) {
		p, key := newPCR(b, bw, bareName)
		created, err := node.CertificatesV1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			b.Error(err)
			return
		}
		chain, leaf := ca.issue(b, key.Public(), time.Now().Add(-time.Minute), 24*time.Hour)
		created.Status = issuedStatus(chain, leaf)
		if _, err := sc.CertificatesV1().PodCertificateRequests(p.Namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			b.Error(err)
		}
	})
	bareRate := n / time.Since(start).Seconds()

	// keyward: the node creates, keyward issues.
	kwName := "keyward.dev/tput-" + uniqueName(b, "t")
	kw := benchSetup(b, kwName, true)
	node = nodeClient(b, kw.Node.Name)
	iw := watchIssued(b, ctx, kw.Pod.Namespace, n)
	start = time.Now()
	parallel(n, benchWorkers, func(int) {
		p, _ := newPCR(b, kw, kwName)
		if _, err := node.CertificatesV1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Error(err)
		}
	})
	iw.wait(b, 2*time.Minute)
	kwRate := n / time.Since(start).Seconds()

	b.ReportMetric(bareRate, "bare-pcr/s")
	b.ReportMetric(kwRate, "keyward-pcr/s")
	b.ReportMetric(kwRate/bareRate, "ratio")
}

// BenchmarkPCRLatencyAt50PerSecond: the node creates 50 PCRs a second for
// 10 seconds; latency is from the node calling Create to the Issued status
// arriving on a watch (it includes the create round trip, so it is the
// node's whole wait for its certificate).
func BenchmarkPCRLatencyAt50PerSecond(b *testing.B) {
	const rate, seconds = 50, 10
	const n = rate * seconds
	ctx := testContext(b)
	name := "keyward.dev/lat-" + uniqueName(b, "l")
	w := benchSetup(b, name, true)
	node := nodeClient(b, w.Node.Name)
	iw := watchIssued(b, ctx, w.Pod.Namespace, n)
	var mu sync.Mutex
	created := map[string]time.Time{}
	tick := time.NewTicker(time.Second / rate)
	defer tick.Stop()
	var wg sync.WaitGroup
	for range n {
		<-tick.C
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, _ := newPCR(b, w, name)
			asked := time.Now()
			got, err := node.CertificatesV1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				b.Error(err)
				return
			}
			mu.Lock()
			created[got.Name] = asked
			mu.Unlock()
		}()
	}
	wg.Wait()
	iw.wait(b, time.Minute)
	var lat []time.Duration
	iw.mu.Lock()
	for name, at := range iw.seen {
		if c, ok := created[name]; ok {
			lat = append(lat, at.Sub(c))
		}
	}
	iw.mu.Unlock()
	slices.Sort(lat)
	pct := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) / 1000 }
	b.ReportMetric(pct(0.50), "p50-ms")
	b.ReportMetric(pct(0.90), "p90-ms")
	b.ReportMetric(pct(0.99), "p99-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
}

// parallel runs f(i) for i in [0,n) on workers goroutines.
func parallel(n, workers int, f func(int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				f(int(i))
			}
		}()
	}
	wg.Wait()
}
