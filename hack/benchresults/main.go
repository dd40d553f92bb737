// Command benchresults turns the raw output of `make bench` (docs/bench/*.txt)
// into docs/bench/results.json — every benchmark's rounds, median, lowest and
// highest, the machine, and each target of docs/bench/targets.yaml judged
// met, missed or not run — and writes the targets table of
// docs/benchmarks.md between its markers. `make bench` runs it last; `make
// bench-results` runs it alone.
//
//	go run ./hack/benchresults -commit $(git rev-parse --short HEAD)
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

func main() {
	dir := flag.String("dir", "docs/bench", "folder of go test -bench output files (*.txt)")
	targets := flag.String("targets", "docs/bench/targets.yaml", "the targets to judge")
	out := flag.String("out", "docs/bench/results.json", "the results file to write")
	doc := flag.String("doc", "docs/benchmarks.md", "the document whose targets table is rewritten")
	commit := flag.String("commit", "", "the commit measured, for the record")
	flag.Parse()
	if err := run(*dir, *targets, *out, *doc, *commit); err != nil {
		fmt.Fprintln(os.Stderr, "benchresults:", err)
		os.Exit(1)
	}
}

func run(dir, targetsFile, out, docFile, commit string) error {
	series, config, err := readSeries(dir)
	if err != nil {
		return err
	}
	ts, err := readTargets(targetsFile)
	if err != nil {
		return err
	}
	r := Results{
		Generated: time.Now().UTC().Format(time.RFC3339),
		Commit:    commit,
		Machine:   machine(config),
		Targets:   check(ts, series),
		Series:    series,
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("writing results: %w", err)
	}
	d, err := os.ReadFile(docFile)
	if err != nil {
		return fmt.Errorf("reading %s: %w", docFile, err)
	}
	updated, err := splice(string(d), table(r))
	if err != nil {
		return fmt.Errorf("%s: %w", docFile, err)
	}
	if err := os.WriteFile(docFile, []byte(updated), 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", docFile, err)
	}
	counts := map[string]int{}
	for _, v := range r.Targets {
		counts[v.Status]++
	}
	fmt.Printf("benchresults: %d series; targets: %d met, %d missed, %d not run; wrote %s and %s\n",
		len(series), counts["met"], counts["missed"], counts["not run"], out, docFile)
	return nil
}

// machine describes where the benchmarks ran: the CPU go test printed and
// what this machine says of itself (run benchresults where make bench ran).
func machine(config map[string]string) map[string]string {
	m := map[string]string{
		"cpu":   config["cpu"],
		"cores": strconv.Itoa(runtime.NumCPU()),
		"go":    runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					m["memory"] = fmt.Sprintf("%.0f GiB", kb/(1<<20))
				}
			}
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m["os"] = strings.Trim(v, `"`)
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m["kernel"] = strings.TrimSpace(string(b))
	}
	return m
}
