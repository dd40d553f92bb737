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
// it with go tool pprof <binary> <file>).
const (
	envBurstN      = "KEYWARD_BURST_N"
	envBurstBinary = "KEYWARD_BURST_BINARY"
	envBurstCPU    = "KEYWARD_BURST_CPUPROFILE"

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
// each node with its own system:node identity and pod. It reports, in one
// run: throughput (first Create to the last Issued seen by a watch), the
// signer's RSS before the burst (empty cache) and after it (N cached
// PCRs), its CPU per issuance against x509.CreateCertificate of the same
// leaf with the same CA key in this process, the Events on the PCRs
// that reached the apiserver per terminal outcome, and (s-startup-10k) how
// long a restarted signer takes to be ready with the N PCRs in the
// apiserver, none of which it may issue again.
func BenchmarkBurst10k(b *testing.B) {
	if testing.Short() {
		b.Skip("a burst of 10 000 PCRs takes minutes")
	}
	n := burstSize(b)
	binary := burstBinary(b)
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Minute)
	defer cancel()

	suffix := uniqueName(b, "b")
	name := "keyward.dev/burst-" + suffix
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
	profilePath := os.Getenv(envBurstCPU)
	cfg.Profiling = profilePath != ""

	// Ten nodes, each with a pod; every PCR is built (key, proof of
	// possession) before the clock starts.
	workloads := make([]*controlplane.WorkloadObjects, burstNodes)
	pcrs := make([][]*certv1.PodCertificateRequest, burstNodes)
	for i := range workloads {
		workloads[i] = podOnNode(b, testContext(b), uniqueName(b, fmt.Sprintf("node%d", i)), name)
		for range share(n, i) {
			p, _ := newPCR(b, workloads[i], name)
			pcrs[i] = append(pcrs[i], p)
		}
	}

	// The raw cost, in this process while nothing else runs in it.
	rawCPU := rawIssuanceCPU(b, keyPath, caCert, sc, workloads[0])

	sp := startBurstSigner(b, binary, cfg)
	if err := waitReady(cfg.HealthAddress); err != nil {
		b.Fatalf("signer not ready: %v\n%s", err, sp.logTail())
	}
	time.Sleep(burstSettle)
	emptyRSS := sp.rss(b)
	emptyMetrics := scrapeMetrics(b, cfg.MetricsAddress)
	cpuBefore := sp.cpuSeconds(b)

	iw := watchIssued(b, ctx, name, n)
	start := time.Now()
	var wg sync.WaitGroup
	if profilePath != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			fetchProfile(b, "http://"+cfg.MetricsAddress+"/debug/pprof/profile?seconds=20", profilePath)
		}()
	}
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
		return
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
	rate := float64(n) / last.Sub(start).Seconds()

	// Events are written after the status, asynchronously: wait until their
	// count stops moving, then take the CPU the burst cost.
	events := settledEventCount(b, ctx, workloads, n)
	cpuAfter := sp.cpuSeconds(b)
	time.Sleep(burstSettle)
	fullRSS := sp.rss(b)
	fullMetrics := scrapeMetrics(b, cfg.MetricsAddress)

	outcomes := fullMetrics.sum("keyward_pcr_outcomes_total")
	if outcomes < float64(n) {
		b.Errorf("keyward_pcr_outcomes_total is %g after %d PCRs were Issued", outcomes, n)
	}
	cpuPerIssue := (cpuAfter - cpuBefore) / float64(n)
	cpuPerIssueMetric := (fullMetrics.sum("process_cpu_seconds_total") - emptyMetrics.sum("process_cpu_seconds_total")) / float64(n)
	b.Logf("%d PCRs from %d nodes in %s; signer pid %d", n, burstNodes, last.Sub(start).Round(time.Millisecond), sp.cmd.Process.Pid)
	b.Logf("RSS empty: /proc %.1f MiB, metric %.1f MiB; with %d PCRs: /proc %.1f MiB, metric %.1f MiB",
		emptyRSS.total, emptyMetrics.sum("process_resident_memory_bytes")/(1<<20), n, fullRSS.total, fullMetrics.sum("process_resident_memory_bytes")/(1<<20))
	b.Logf("CPU per issuance: /proc %.3f ms, metric %.3f ms; raw x509.CreateCertificate %.3f ms",
		cpuPerIssue*1e3, cpuPerIssueMetric*1e3, rawCPU*1e3)
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
	b.Logf("restart with %d Issued PCRs: ready in %s", n, startup.Round(time.Millisecond))

	b.ReportMetric(startup.Seconds(), "s-startup-10k")
	b.ReportMetric(float64(n), "PCRs")
	b.ReportMetric(rate, "PCR/s")
	b.ReportMetric(fullRSS.total, "MiB-rss-10k")
	b.ReportMetric(fullRSS.anon, "MiB-rss-anon-10k")
	b.ReportMetric(fullRSS.file, "MiB-rss-file-10k")
	b.ReportMetric(fullMetrics.sum("process_resident_memory_bytes")/(1<<20), "MiB-rss-10k-metric")
	b.ReportMetric(emptyRSS.total, "MiB-rss-empty")
	b.ReportMetric(emptyRSS.anon, "MiB-rss-anon-empty")
	b.ReportMetric(emptyRSS.file, "MiB-rss-file-empty")
	b.ReportMetric(emptyMetrics.sum("process_resident_memory_bytes")/(1<<20), "MiB-rss-empty-metric")
	b.ReportMetric(cpuPerIssue*1e3, "ms-cpu/issue")
	b.ReportMetric(cpuPerIssueMetric*1e3, "ms-cpu/issue-metric")
	b.ReportMetric(rawCPU*1e3, "ms-cpu/raw")
	b.ReportMetric(cpuPerIssue/rawCPU, "cpu-ratio")
	b.ReportMetric(float64(events)/outcomes, "events/outcome")
	// Every Event keyward recorded must reach the apiserver; what the rate
	// refused is counted, never dropped silently.
	recorded := fullMetrics.values["keyward_events_total"]
	b.ReportMetric(fullMetrics.values["keyward_events_dropped_total"], "events-dropped")
	b.ReportMetric(recorded, "events-recorded")
	b.ReportMetric(recorded-float64(events), "events-lost")
	b.ReportMetric(fullMetrics.sum("go_memstats_heap_inuse_bytes")/(1<<20), "MiB-heap-10k")
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
	if p := os.Getenv(envBurstBinary); p != "" {
		return p
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(b.TempDir(), "keyward")
	cmd := exec.Command(goTool, "build", "-o", out, "github.com/keyward/keyward/cmd/keyward")
	if msg, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("building cmd/keyward: %v\n%s", err, msg)
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

// burstSigner is `keyward signer` running as a child process.
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
	dir := b.TempDir()
	cfgPath := filepath.Join(dir, "signer.yaml")
	if err := os.WriteFile(cfgPath, data, 0o600); err != nil {
		b.Fatal(err)
	}
	sp := &burstSigner{logPath: filepath.Join(dir, "signer.log")}
	logFile, err := os.Create(sp.logPath)
	if err != nil {
		b.Fatal(err)
	}
	sp.cmd = exec.Command(binary, "signer", "--config", cfgPath, "--identity", "burst")
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
			b.Logf("signer log (end):\n%s", sp.logTail())
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
// and larger when the binary is still in the page cache from its build).
type rssMiB struct{ total, anon, file float64 }

// rss reads the signer's resident memory from /proc.
func (sp *burstSigner) rss(b *testing.B) rssMiB {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", sp.cmd.Process.Pid))
	if err != nil {
		b.Fatalf("reading the signer's status: %v", err)
	}
	var r rssMiB
	fields := map[string]*float64{"VmRSS:": &r.total, "RssAnon:": &r.anon, "RssFile:": &r.file}
	found := 0
	for _, line := range strings.Split(string(data), "\n") {
		for prefix, v := range fields {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
				if err != nil {
					b.Fatalf("%s line %q: %v", prefix, line, err)
				}
				*v = kb / 1024
				found++
			}
		}
	}
	if found != len(fields) {
		b.Fatalf("the signer's /proc status lacks VmRSS, RssAnon or RssFile:\n%s", data)
	}
	return r
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
