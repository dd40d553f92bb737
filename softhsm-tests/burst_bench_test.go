package softhsmtests

import (
	"bufio"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/profile"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// Run with (make bench does, into docs/bench/burst.txt):
//
//	go build -o bin/keyward ./cmd/keyward
//	KEYWARD_BURST_BINARY=$PWD/bin/keyward go test -run '^$' -bench Burst10k -benchtime 1x -timeout 60m ./softhsm-tests/
//
// KEYWARD_BURST_N sets the number of PCRs (default 10 000); without
// KEYWARD_BURST_BINARY the benchmark builds ./cmd/keyward itself.
// KEYWARD_BURST_CPUPROFILE=<file> turns on the signer's profiling and
// writes a CPU profile of its first 20 seconds of the burst there (read
// it with go tool pprof <binary> <file>) and the minimal signer's, of its
// whole run, to <file>.minimal; KEYWARD_BURST_HEAPPROFILE=<file>
// saves its heap profile (in use with N PCRs cached, and alloc_space
// since it started) after the burst, and <file>.restart that of the
// restarted signer once settled. KEYWARD_BURST_MINIMAL_BINARY is the
// minimal signer (softhsm-tests/internal/minimalsigner), built by the
// benchmark when unset.
const (
	envBurstN       = "KEYWARD_BURST_N"
	envBurstBinary  = "KEYWARD_BURST_BINARY"
	envBurstCPU     = "KEYWARD_BURST_CPUPROFILE"
	envBurstHeap    = "KEYWARD_BURST_HEAPPROFILE"
	envBurstMinimal = "KEYWARD_BURST_MINIMAL_BINARY"

	burstDefaultN = 10000
	burstNodes    = 10
	// Each node creates its share with this many concurrent Creates.
	burstPerNode   = 8
	burstWorkers   = 8
	burstRawLeaves = 2000
	// How long the signer is left alone before RSS is read, so that the
	// garbage of the burst is collected (the Go runtime forces a GC at
	// least every 2 minutes; the burst's own GCs and the scavenger do the
	// rest sooner).
	burstSettle = 15 * time.Second
)

// BenchmarkBurst10k: the real keyward binary (bin/keyward signer --config),
// with a file CA key (ECDSA P-256), 8 workers and a client at QPS 500 /
// burst 1000, issues N PCRs (default 10 000) created by 10 nodes at once,
// each node with its own system:node identity and pod. Before it, in the
// same run, the minimal client-go signer (softhsm-tests/internal/
// minimalsigner, a process of its own with the same CA key) issues N PCRs
// of another signer name created the same way. It reports, in one run:
// throughput (first Create to the last Issued seen by a watch), each
// signer's RSS before the burst (empty cache), its peak and after it (N
// cached PCRs), their CPU per issuance and its ratio to
// x509.CreateCertificate of the same leaf with the same CA key in this
// process, the Events on the PCRs that reached the apiserver per terminal
// outcome, and (s-startup-10k) how long a restarted keyward takes to be
// ready with the N PCRs in the apiserver, none of which it may issue
// again, and its RSS once it has settled.
func BenchmarkBurst10k(b *testing.B) {
	if testing.Short() {
		b.Skip("a burst of 10 000 PCRs takes minutes")
	}
	n := burstSize(b)
	binary := burstBinary(b)
	minimalBinary := burstMinimalBinary(b)
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Minute)
	defer cancel()

	suffix := uniqueName(b, "b")
	name := "keyward.dev/burst-" + suffix
	minimalName := "keyward.dev/minimal-" + suffix
	keyPath := filepath.Join(b.TempDir(), "ca.key")
	keyURI, caFile, caCert := newCA(b, all.Options{}, "file:"+keyPath, "ca-"+suffix)
	sc := signerConfig(b, name, config.ProfilePodIdentity, keyURI, caFile)
	cfg := baseConfig(b, sc)
	cfg.Workers = burstWorkers
	cfg.KubeClient.QPS, cfg.KubeClient.Burst = 500, 1000
	cfg.MetricsAddress, cfg.HealthAddress = freeAddr(b), freeAddr(b)
	// KEYWARD_BURST_EVENTS_ISSUED=true records an Event per issuance (off by
	// default), to see the Event rate limit at work.
	cfg.Events.Issued = os.Getenv("KEYWARD_BURST_EVENTS_ISSUED") == "true"
	profilePath, heapPath := os.Getenv(envBurstCPU), os.Getenv(envBurstHeap)
	cfg.Profiling = profilePath != "" || heapPath != ""

	// Ten nodes for each signer, each with a pod; every PCR is built (key,
	// proof of possession) before the clock starts.
	workloads, pcrs := burstRequests(b, name, n)
	minimalWorkloads, minimalPCRs := burstRequests(b, minimalName, n)

	// The raw cost, in this process while nothing else runs in it.
	rawCPU := rawIssuanceCPU(b, keyPath, caCert, sc, workloads[0])

	// The floor: the minimal signer, same CA key, same client identity and
	// limits, its own signer name.
	minimalHealth := freeAddr(b)
	args := []string{"--kubeconfig", cfg.KubeClient.Kubeconfig, "--signer-name", minimalName,
		"--ca-cert", caFile, "--ca-key", keyPath, "--health-address", minimalHealth, "--workers", strconv.Itoa(burstWorkers)}
	if profilePath != "" {
		// Its whole life: start, burst, settle.
		args = append(args, "--cpuprofile", profilePath+".minimal")
	}
	mp := startBurstProcess(b, "minimal", minimalBinary, args...)
	if err := waitReady(minimalHealth); err != nil {
		b.Fatalf("minimal signer not ready: %v\n%s", err, mp.logTail())
	}
	time.Sleep(burstSettle)
	minimalEmpty := mp.rss(b)
	minimalCtx, minimalDone := context.WithCancel(ctx)
	minimal := runBurst(b, minimalCtx, mp, minimalName, minimalWorkloads, minimalPCRs, func() {
		// As long as keyward's wait for its Events below, at least.
		time.Sleep(10 * time.Second)
	})
	minimalDone()
	mp.stop()
	if b.Failed() {
		return
	}

	sp := startBurstSigner(b, binary, cfg)
	if err := waitReady(cfg.HealthAddress); err != nil {
		b.Fatalf("signer not ready: %v\n%s", err, sp.logTail())
	}
	time.Sleep(burstSettle)
	emptyRSS := sp.rss(b)
	emptyMetrics := scrapeMetrics(b, cfg.MetricsAddress)

	var profiles sync.WaitGroup
	if profilePath != "" {
		profiles.Add(1)
		go func() {
			defer profiles.Done()
			fetchProfile(b, "http://"+cfg.MetricsAddress+"/debug/pprof/profile?seconds=20", profilePath)
		}()
	}
	var events int
	kw := runBurst(b, ctx, sp, name, workloads, pcrs, func() {
		// Events are written after the status, asynchronously: wait until
		// their count stops moving, then take the CPU the burst cost.
		events = settledEventCount(b, ctx, workloads, n)
	})
	profiles.Wait()
	if b.Failed() {
		return
	}
	fullRSS := kw.settled
	fullMetrics := scrapeMetrics(b, cfg.MetricsAddress)
	if heapPath != "" {
		fetchProfile(b, "http://"+cfg.MetricsAddress+"/debug/pprof/heap", heapPath)
	}

	outcomes := fullMetrics.sum("keyward_pcr_outcomes_total")
	if outcomes < float64(n) {
		b.Errorf("keyward_pcr_outcomes_total is %g after %d PCRs were Issued", outcomes, n)
	}
	cpuPerIssueMetric := (fullMetrics.sum("process_cpu_seconds_total") - emptyMetrics.sum("process_cpu_seconds_total")) / float64(n)
	b.Logf("minimal signer: %d PCRs in %s, CPU per issuance %.3f ms; RSS empty %.1f MiB, peak %.1f MiB (anon %.1f, file %.1f), with %d PCRs %.1f MiB (anon %.1f, file %.1f)",
		n, minimal.elapsed.Round(time.Millisecond), minimal.cpuPerIssue*1e3, minimalEmpty.total, minimal.peak.total, minimal.peak.anon, minimal.peak.file,
		n, minimal.settled.total, minimal.settled.anon, minimal.settled.file)
	b.Logf("%d PCRs from %d nodes in %s; signer pid %d", n, burstNodes, kw.elapsed.Round(time.Millisecond), sp.cmd.Process.Pid)
	b.Logf("RSS empty: /proc %.1f MiB, metric %.1f MiB; peak %.1f MiB (anon %.1f, file %.1f); with %d PCRs: /proc %.1f MiB, metric %.1f MiB",
		emptyRSS.total, emptyMetrics.sum("process_resident_memory_bytes")/(1<<20), kw.peak.total, kw.peak.anon, kw.peak.file,
		n, fullRSS.total, fullMetrics.sum("process_resident_memory_bytes")/(1<<20))
	b.Logf("CPU per issuance: /proc %.3f ms, metric %.3f ms; minimal signer %.3f ms; raw x509.CreateCertificate %.3f ms",
		kw.cpuPerIssue*1e3, cpuPerIssueMetric*1e3, minimal.cpuPerIssue*1e3, rawCPU*1e3)
	b.Logf("Events on PCRs: %d for %g outcomes", events, outcomes)
	for _, s := range fullMetrics.series {
		if strings.HasPrefix(s, "keyward_") && strings.Contains(strings.ToLower(s), "event") {
			b.Logf("metric %s", s)
		}
	}

	// A restart with the N PCRs already Issued: the new process lists them
	// all before it is ready, and must not issue any of them again.
	sp.stop()
	restarted := time.Now()
	sp = startBurstSigner(b, binary, cfg)
	if err := waitReady(cfg.HealthAddress); err != nil {
		b.Fatalf("restarted signer not ready: %v\n%s", err, sp.logTail())
	}
	startup := time.Since(restarted)
	time.Sleep(2 * time.Second)
	if again := scrapeMetrics(b, cfg.MetricsAddress).sum("keyward_pcr_outcomes_total"); again != 0 {
		b.Errorf("the restarted signer recorded %g outcomes for %d PCRs that were all Issued already", again, n)
	}
	// Its steady state with the N cached, read as after the burst.
	time.Sleep(burstSettle - 2*time.Second)
	restartRSS := sp.rss(b)
	if heapPath != "" {
		fetchProfile(b, "http://"+cfg.MetricsAddress+"/debug/pprof/heap", heapPath+".restart")
	}
	b.Logf("restart with %d Issued PCRs: ready in %s; RSS %.1f MiB (anon %.1f, file %.1f), peak %.1f MiB",
		n, startup.Round(time.Millisecond), restartRSS.total, restartRSS.anon, restartRSS.file, restartRSS.hwm)

	b.ReportMetric(startup.Seconds(), "s-startup-10k")
	b.ReportMetric(float64(n), "PCRs")
	b.ReportMetric(kw.rate, "PCR/s")
	b.ReportMetric(minimal.rate, "minimal-PCR/s")
	b.ReportMetric(fullRSS.total, "MiB-rss-10k")
	b.ReportMetric(fullRSS.anon, "MiB-rss-anon-10k")
	b.ReportMetric(fullRSS.file, "MiB-rss-file-10k")
	b.ReportMetric(fullMetrics.sum("process_resident_memory_bytes")/(1<<20), "MiB-rss-10k-metric")
	b.ReportMetric(emptyRSS.total, "MiB-rss-empty")
	b.ReportMetric(emptyRSS.anon, "MiB-rss-anon-empty")
	b.ReportMetric(emptyRSS.file, "MiB-rss-file-empty")
	b.ReportMetric(emptyMetrics.sum("process_resident_memory_bytes")/(1<<20), "MiB-rss-empty-metric")
	b.ReportMetric(kw.peak.total, "MiB-rss-peak")
	b.ReportMetric(kw.peak.anon, "MiB-rss-anon-peak")
	b.ReportMetric(kw.peak.file, "MiB-rss-file-peak")
	b.ReportMetric(restartRSS.total, "MiB-rss-restart")
	b.ReportMetric(restartRSS.anon, "MiB-rss-anon-restart")
	b.ReportMetric(restartRSS.file, "MiB-rss-file-restart")
	b.ReportMetric(minimalEmpty.total, "minimal-MiB-rss-empty")
	b.ReportMetric(minimal.peak.total, "minimal-MiB-rss-peak")
	b.ReportMetric(minimal.peak.anon, "minimal-MiB-rss-anon-peak")
	b.ReportMetric(minimal.peak.file, "minimal-MiB-rss-file-peak")
	b.ReportMetric(minimal.settled.total, "minimal-MiB-rss-10k")
	b.ReportMetric(minimal.settled.anon, "minimal-MiB-rss-anon-10k")
	b.ReportMetric(minimal.settled.file, "minimal-MiB-rss-file-10k")
	b.ReportMetric(kw.peak.total/minimal.peak.total, "rss-of-minimal")
	b.ReportMetric(kw.peak.anon/minimal.peak.anon, "rss-anon-of-minimal")
	b.ReportMetric(restartRSS.total/fullRSS.total, "restart-of-steady")
	b.ReportMetric(kw.cpuPerIssue*1e3, "ms-cpu/issue")
	b.ReportMetric(cpuPerIssueMetric*1e3, "ms-cpu/issue-metric")
	b.ReportMetric(minimal.cpuPerIssue*1e3, "minimal-ms-cpu/issue")
	b.ReportMetric(rawCPU*1e3, "ms-cpu/raw")
	b.ReportMetric(kw.cpuPerIssue/rawCPU, "cpu-ratio")
	b.ReportMetric(kw.cpuPerIssue/minimal.cpuPerIssue, "cpu-of-minimal")
	b.ReportMetric(float64(events)/outcomes, "events/outcome")
	// Every Event keyward recorded must reach the apiserver; what the rate
	// refused is counted, never dropped silently.
	recorded := fullMetrics.values["keyward_events_total"]
	b.ReportMetric(fullMetrics.values["keyward_events_dropped_total"], "events-dropped")
	b.ReportMetric(recorded, "events-recorded")
	b.ReportMetric(recorded-float64(events), "events-lost")
	b.ReportMetric(fullMetrics.sum("go_memstats_heap_inuse_bytes")/(1<<20), "MiB-heap-10k")
}

// burstRequests makes ten nodes with a pod each for signerName and builds
// n PCRs among them.
func burstRequests(b *testing.B, signerName string, n int) ([]*controlplane.WorkloadObjects, [][]*certv1.PodCertificateRequest) {
	workloads := make([]*controlplane.WorkloadObjects, burstNodes)
	pcrs := make([][]*certv1.PodCertificateRequest, burstNodes)
	for i := range workloads {
		workloads[i] = podOnNode(b, testContext(b), uniqueName(b, fmt.Sprintf("node%d", i)), signerName)
		for range share(n, i) {
			p, _ := newPCR(b, workloads[i], signerName)
			pcrs[i] = append(pcrs[i], p)
		}
	}
	return workloads, pcrs
}

// burstRun is what one signer process did in one burst.
type burstRun struct {
	rate        float64 // PCR/s
	elapsed     time.Duration
	cpuPerIssue float64 // seconds
	// peak is the highest RSS from the first Create to settled: total is
	// the kernel's VmHWM, anon and file the highest of samples every 100 ms.
	peak rssMiB
	// settled is the RSS after the burst and burstSettle of idling.
	settled rssMiB
}

// runBurst has the workloads' nodes create pcrs (signerName's) all at
// once and waits until p has issued every one; then it calls settle,
// takes p's CPU, idles burstSettle and takes its RSS.
func runBurst(b *testing.B, ctx context.Context, p *burstSigner, signerName string, workloads []*controlplane.WorkloadObjects, pcrs [][]*certv1.PodCertificateRequest, settle func()) burstRun {
	n := 0
	for _, ps := range pcrs {
		n += len(ps)
	}
	iw := watchIssued(b, ctx, signerName, n)
	cpuBefore := p.cpuSeconds(b)
	var peak rssMiB
	sampling, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			if r, ok := p.tryRSS(); ok {
				peak.anon, peak.file = max(peak.anon, r.anon), max(peak.file, r.file)
			}
			select {
			case <-sampling:
				return
			case <-t.C:
			}
		}
	}()
	start := time.Now()
	var wg sync.WaitGroup
	for i, w := range workloads {
		node := nodeClient(b, w.Node.Name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			parallel(len(pcrs[i]), burstPerNode, func(j int) {
				p := pcrs[i][j]
				if _, err := node.CertificatesV1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
					b.Errorf("node %s creating PCR %d: %v", w.Node.Name, j, err)
				}
			})
		}()
	}
	wg.Wait()
	if b.Failed() {
		close(sampling)
		return burstRun{}
	}
	// At least 20 PCR/s, or something is badly wrong.
	timeout := max(2*time.Minute, time.Duration(n/20)*time.Second)
	var last time.Time
	iw.wait(b, timeout)
	iw.mu.Lock()
	for _, at := range iw.seen {
		if at.After(last) {
			last = at
		}
	}
	iw.mu.Unlock()
	settle()
	cpuAfter := p.cpuSeconds(b)
	time.Sleep(burstSettle)
	close(sampling)
	<-sampled
	r := burstRun{
		rate: float64(n) / last.Sub(start).Seconds(), elapsed: last.Sub(start),
		cpuPerIssue: (cpuAfter - cpuBefore) / float64(n),
		settled:     p.rss(b),
	}
	peak.total = r.settled.hwm
	r.peak = peak
	return r
}

// burstSize is KEYWARD_BURST_N, or 10 000.
func burstSize(b *testing.B) int { return envCount(b, envBurstN, burstDefaultN, burstNodes) }

// share is node i's part of n PCRs.
func share(n, i int) int {
	s := n / burstNodes
	if i < n%burstNodes {
		s++
	}
	return s
}

// burstBinary is KEYWARD_BURST_BINARY, or ./cmd/keyward built into a
// temporary directory.
func burstBinary(b *testing.B) string {
	return binaryOf(b, envBurstBinary, "github.com/keyward/keyward/cmd/keyward")
}

// burstMinimalBinary is KEYWARD_BURST_MINIMAL_BINARY, or the minimal
// signer built into a temporary directory.
func burstMinimalBinary(b *testing.B) string {
	return binaryOf(b, envBurstMinimal, "github.com/keyward/keyward/softhsm-tests/internal/minimalsigner")
}

// binaryOf is the binary the variable env names, or pkg built into a
// temporary directory.
func binaryOf(b *testing.B, env, pkg string) string {
	if p := os.Getenv(env); p != "" {
		return p
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(b.TempDir(), filepath.Base(pkg))
	cmd := exec.Command(goTool, "build", "-o", out, pkg)
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building %s: %v\n%s", pkg, err, msg)
	}
	return out
}

// freeAddr is a loopback address with a port nobody listened on a moment
// ago (the binary, unlike runSigner, cannot tell us the port it chose).
func freeAddr(b *testing.B) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// burstSigner is `keyward signer`, or the minimal signer, running as a
// child process.
type burstSigner struct {
	cmd     *exec.Cmd
	logPath string
	// stop ends the signer with SIGTERM (SIGKILL after 30 s); once.
	stop func()
}

func startBurstSigner(b *testing.B, binary string, cfg *config.SignerConfiguration) *burstSigner {
	data, err := yaml.Marshal(cfg)
	if err != nil {
		b.Fatal(err)
	}
	cfgPath := filepath.Join(b.TempDir(), "signer.yaml")
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		b.Fatal(err)
	}
	return startBurstProcess(b, "signer", binary, "signer", "--config", cfgPath, "--identity", "burst")
}

// startBurstProcess runs binary with args as a child process that logs
// to a file, and stops it when the benchmark ends.
func startBurstProcess(b *testing.B, what, binary string, args ...string) *burstSigner {
	sp := &burstSigner{logPath: filepath.Join(b.TempDir(), what+".log")}
	logFile, err := os.Create(sp.logPath)
	if err != nil {
		b.Fatal(err)
	}
	sp.cmd = exec.Command(binary, args...)
	sp.cmd.Stdout, sp.cmd.Stderr = logFile, logFile
	sp.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := sp.cmd.Start(); err != nil {
		b.Fatal(err)
	}
	sp.stop = sync.OnceFunc(func() {
		_ = sp.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = sp.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = sp.cmd.Process.Kill()
			<-done
		}
		logFile.Close()
		if b.Failed() {
			b.Logf("%s log (end):\n%s", what, sp.logTail())
		}
	})
	b.Cleanup(sp.stop)
	return sp
}

// logTail is the last 40 lines the signer logged.
func (sp *burstSigner) logTail() string {
	data, _ := os.ReadFile(sp.logPath)
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-40):], "\n")
}

// fetchProfile saves what url answers to path.
func fetchProfile(b *testing.B, url, path string) {
	resp, err := http.Get(url)
	if err != nil {
		b.Errorf("fetching the signer's profile: %v", err)
		return
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, data)
	}
	if err == nil {
		err = os.WriteFile(path, data, 0o644)
	}
	if err != nil {
		b.Errorf("saving the signer's profile: %v", err)
	}
}

// rssMiB is a process's resident memory in MiB: all of it (VmRSS), its
// own (RssAnon: heap, stacks, runtime) and mapped from files (RssFile:
// mostly the binary's text and read-only data, shared and reclaimable,
// and larger when the binary is still in the page cache from its build),
// and the highest VmRSS so far (VmHWM).
type rssMiB struct{ total, anon, file, hwm float64 }

// rss reads the process's resident memory from /proc.
func (sp *burstSigner) rss(b *testing.B) rssMiB {
	r, err := readRSS(sp.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// tryRSS is rss for a sampler, which may not fail the benchmark.
func (sp *burstSigner) tryRSS() (rssMiB, bool) {
	r, err := readRSS(sp.cmd.Process.Pid)
	return r, err == nil
}

func readRSS(pid int) (rssMiB, error) {
	var r rssMiB
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return r, fmt.Errorf("reading the signer's status: %w", err)
	}
	fields := map[string]*float64{"VmRSS:": &r.total, "RssAnon:": &r.anon, "RssFile:": &r.file, "VmHWM:": &r.hwm}
	found := 0
	for _, line := range strings.Split(string(data), "\n") {
		for prefix, v := range fields {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				if err != nil {
					return r, fmt.Errorf("%s line %q: %w", prefix, line, err)
				}
				*v = kb / 1024
				found++
			}
		}
	}
	if found != len(fields) {
		return r, fmt.Errorf("the signer's /proc status lacks VmRSS, RssAnon, RssFile or VmHWM:\n%s", data)
	}
	return r, nil
}

// cpuSeconds is the signer's user + system CPU time so far.
func (sp *burstSigner) cpuSeconds(b *testing.B) float64 {
	return procCPU(b, sp.cmd.Process.Pid).Seconds()
}

// rawIssuanceCPU is the CPU seconds per x509.CreateCertificate of the leaf
// keyward issues for w's pod (the profile's template, completed as
// authority.Sign completes it), signed with the same CA key parsed from
// its file, measured with getrusage over burstRawLeaves leaves.
func rawIssuanceCPU(b *testing.B, keyPath string, caCert *x509.Certificate, sc config.Signer, w *controlplane.WorkloadObjects) float64 {
	data, err := os.ReadFile(keyPath)
	if err != nil {
		b.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		b.Fatalf("%s holds no PEM block", keyPath)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		b.Fatalf("parsing the CA key: %v", err)
	}
	caKey, ok := parsed.(crypto.Signer)
	if !ok {
		b.Fatalf("CA key is a %T, not a crypto.Signer", parsed)
	}
	subject, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		b.Fatal(err)
	}
	prof, err := profile.New(sc)
	if err != nil {
		b.Fatal(err)
	}
	ref := podRef(w)
	tmpl, err := prof.Template(profile.Request{
		SignerName: sc.Name, Namespace: ref.Namespace, PodName: ref.Name, PodUID: string(ref.UID),
		ServiceAccountName: ref.ServiceAccountName, ServiceAccountUID: string(ref.ServiceAccountUID),
		NodeName: ref.NodeName, NodeUID: string(ref.NodeUID), PublicKey: subject.Public(),
	})
	if err != nil {
		b.Fatal(err)
	}
	limit := new(big.Int).Lsh(big.NewInt(1), 128)
	runtime.GC()
	before := selfCPU(b).Seconds()
	for range burstRawLeaves {
		serial, err := rand.Int(rand.Reader, limit)
		if err != nil {
			b.Fatal(err)
		}
		t := *tmpl
		t.SerialNumber = serial
		t.NotBefore = time.Now().Add(-5 * time.Minute).Truncate(time.Second)
		t.NotAfter = t.NotBefore.Add(24 * time.Hour)
		t.SignatureAlgorithm = x509.ECDSAWithSHA256
		t.BasicConstraintsValid = true
		if _, err := x509.CreateCertificate(rand.Reader, &t, caCert, subject.Public(), caKey); err != nil {
			b.Fatal(err)
		}
	}
	return (selfCPU(b).Seconds() - before) / burstRawLeaves
}

// rusageSeconds is this process's user + system CPU time so far.
// settledEventCount waits until the number of Events about
// PodCertificateRequests in the workloads' namespaces reaches want or stops
// changing for 10 seconds, and returns it.
func settledEventCount(b *testing.B, ctx context.Context, workloads []*controlplane.WorkloadObjects, want int) int {
	count := func() int {
		total := 0
		for _, w := range workloads {
			opts := metav1.ListOptions{FieldSelector: "involvedObject.kind=PodCertificateRequest", Limit: 500}
			for {
				evs, err := cp.AdminClient().CoreV1().Events(w.Pod.Namespace).List(ctx, opts)
				if err != nil {
					b.Fatalf("listing Events: %v", err)
				}
				total += len(evs.Items)
				if evs.Continue == "" {
					break
				}
				opts.Continue = evs.Continue
			}
		}
		return total
	}
	last, stable := -1, 0
	for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(2 * time.Second) {
		c := count()
		if c >= want {
			return c
		}
		if c == last {
			if stable++; stable == 5 {
				return c
			}
		} else {
			last, stable = c, 0
		}
	}
	return last
}

// burstMetrics is one scrape of the signer's /metrics.
type burstMetrics struct {
	// values sums every series of a metric name.
	values map[string]float64
	series []string
}

func (m burstMetrics) sum(name string) float64 { return m.values[name] }

func scrapeMetrics(b *testing.B, addr string) burstMetrics {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		b.Fatalf("scraping the signer: %v", err)
	}
	defer resp.Body.Close()
	m := burstMetrics{values: map[string]float64{}}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		name := line[:i]
		if j := strings.IndexByte(name, '{'); j >= 0 {
			name = name[:j]
		}
		m.values[name] += v
		m.series = append(m.series, line)
	}
	if err := sc.Err(); err != nil && err != io.EOF {
		b.Fatalf("reading /metrics: %v", err)
	}
	slices.Sort(m.series)
	return m
}
