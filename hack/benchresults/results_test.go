package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `control plane https://127.0.0.1:1 ready in 3s
goos: linux
goarch: amd64
pkg: github.com/keyward/keyward/softhsm-tests
cpu: Test CPU
BenchmarkPCRThroughput/key=softhsm-2   	       1	9000000000 ns/op	       350.0 PCR/s	       360.0 bare-PCR/s	         0.97 of-bare
BenchmarkPCRThroughput/key=softhsm-2   	       1	9000000000 ns/op	       340.0 PCR/s	       360.0 bare-PCR/s	         0.94 of-bare
BenchmarkPCRThroughput/key=softhsm-2   	       1	9000000000 ns/op	       355.0 PCR/s	       360.0 bare-PCR/s	         0.99 of-bare
BenchmarkPCRLatency/rate=50/key=softhsm-2  	1	10000000000 ns/op	 6.0 p50-ms	 30.0 p99-ms
BenchmarkPCRLatency/rate=50/key=softhsm-2  	1	10000000000 ns/op	 7.0 p50-ms	 22.0 p99-ms
PASS
ok  	github.com/keyward/keyward/softhsm-tests	40.0s
`

func TestRoundsAreGroupedAndJudgedByTheirMedian(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "signer.txt"), []byte(sample), 0o644); err != nil {
		t.Fatal(err)
	}
	series, config, err := readSeries(dir)
	if err != nil {
		t.Fatal(err)
	}
	if config["cpu"] != "Test CPU" {
		t.Errorf("cpu = %q, want the file's", config["cpu"])
	}
	ts := []Target{
		{Benchmark: "BenchmarkPCRThroughput/key=softhsm", Unit: "of-bare", Op: ">=", Value: 0.95},
		{Benchmark: "BenchmarkPCRLatency/rate=50/key=softhsm", Unit: "p99-ms", Op: "<=", Value: 25},
		{Benchmark: "BenchmarkPCRLatency/rate=50/key=softhsm", Unit: "p50-ms", Op: "<=", Value: 6},
		{Benchmark: "BenchmarkFailover", Unit: "s-failover", Op: "<=", Value: 20},
	}
	got := check(ts, series)
	want := []struct {
		status string
		median float64
		rounds int
	}{{"met", 0.97, 3}, {"missed", 26, 2}, {"missed", 6.5, 2}, {"not run", 0, 0}}
	for i, w := range want {
		v := got[i]
		if v.Status != w.status || v.Rounds != w.rounds || (v.Median != nil && *v.Median != w.median) {
			t.Errorf("%s %s: status %s, rounds %d, median %v; want %s, %d, %v", v.Benchmark, v.Unit, v.Status, v.Rounds, v.Median, w.status, w.rounds, w.median)
		}
	}
	for _, s := range series {
		if s.Unit == "ns/op" {
			t.Errorf("Go's ns/op was kept: %+v", s)
		}
	}
}

func TestATargetsFileWithAWrongOperatorIsRefusedNamingTheEntry(t *testing.T) {
	p := filepath.Join(t.TempDir(), "targets.yaml")
	if err := os.WriteFile(p, []byte("- {benchmark: BenchmarkX, unit: a, op: '>', value: 1, claim: c}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := readTargets(p)
	if err == nil || !strings.Contains(err.Error(), "BenchmarkX") {
		t.Fatalf("readTargets = %v, want an error naming the entry", err)
	}
}

func TestSpliceNeedsBothMarkers(t *testing.T) {
	if _, err := splice("no markers here", "x"); err == nil {
		t.Fatal("splice accepted a document without markers")
	}
	doc := "head\n" + beginMark + "\nold\n" + endMark + "\ntail\n"
	got, err := splice(doc, "new\n")
	if err != nil {
		t.Fatal(err)
	}
	if want := "head\n" + beginMark + "\nnew\n" + endMark + "\ntail\n"; got != want {
		t.Errorf("splice = %q, want %q", got, want)
	}
}

// The targets file in the repository parses and names only benchmarks
// that exist in the code, so a renamed benchmark cannot leave its target
// forever "not run".
func TestTheRepositoryTargetsNameRealBenchmarks(t *testing.T) {
	ts, err := readTargets("../../docs/bench/targets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	files, _ := filepath.Glob("../../softhsm-tests/*_test.go")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	for _, tg := range ts {
		base, sub, _ := strings.Cut(tg.Benchmark, "/")
		if !strings.Contains(src.String(), "func "+base+"(") {
			t.Errorf("target %s: no func %s in softhsm-tests", tg.Benchmark, base)
		}
		for _, part := range strings.Split(sub, "/") {
			if part != "" && !strings.Contains(src.String(), strings.SplitN(part, "=", 2)[0]) {
				t.Errorf("target %s: sub-benchmark key %q appears nowhere in softhsm-tests", tg.Benchmark, part)
			}
		}
		if !strings.Contains(src.String(), `"`+tg.Unit+`"`) {
			t.Errorf("target %s: unit %q is reported nowhere in softhsm-tests", tg.Benchmark, tg.Unit)
		}
	}
}

func TestRejoinSplitResults(t *testing.T) {
	in := "BenchmarkA-2   \t       1\t 5 ns/op\t 2.0 x/s\n" +
		"BenchmarkB/k=v-2 \tI1127 21:35:40.311439 12532 kubeclient.go:79] \"Warning\"\n" +
		"I1127 another log line\n" +
		"       1\t6279144413 ns/op\t 230.3 PCR/s\n" +
		"       1\t1 ns/op\n"
	want := "BenchmarkA-2   \t       1\t 5 ns/op\t 2.0 x/s\n" +
		"BenchmarkB/k=v-2 \tI1127 21:35:40.311439 12532 kubeclient.go:79] \"Warning\"\n" +
		"I1127 another log line\n" +
		"BenchmarkB/k=v-2\t       1\t6279144413 ns/op\t 230.3 PCR/s\n" +
		"       1\t1 ns/op\n"
	if got := string(rejoinSplitResults([]byte(in))); got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
