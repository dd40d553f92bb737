package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"

	"golang.org/x/perf/benchfmt"
	"sigs.k8s.io/yaml"
)

// Target is one claim of docs/benchmarks.md: a benchmark's unit compared
// with a bound.
type Target struct {
	// Benchmark is the full name without the -GOMAXPROCS suffix, e.g.
	// BenchmarkPCRThroughput/key=softhsm.
	Benchmark string `json:"benchmark"`
	Unit      string `json:"unit"`
	// Op is ">=" or "<=".
	Op    string  `json:"op"`
	Value float64 `json:"value"`
	// Claim says in words what is claimed, for the table.
	Claim string `json:"claim"`
}

// Series is every round of one benchmark's unit, in one package (the file
// and pkcs11 backends both have a BenchmarkSign).
type Series struct {
	Benchmark string    `json:"benchmark"`
	Package   string    `json:"package,omitempty"`
	Unit      string    `json:"unit"`
	File      string    `json:"file"`
	Values    []float64 `json:"values"`
	Median    float64   `json:"median"`
	Min       float64   `json:"min"`
	Max       float64   `json:"max"`
}

// Verdict is a target checked against its series.
type Verdict struct {
	Target
	// Status is met, missed or "not run" (no round of the benchmark in the
	// files read).
	Status string   `json:"status"`
	Median *float64 `json:"median,omitempty"`
	Min    *float64 `json:"min,omitempty"`
	Max    *float64 `json:"max,omitempty"`
	Rounds int      `json:"rounds"`
}

// Results is docs/bench/results.json.
type Results struct {
	Generated string            `json:"generated"`
	Commit    string            `json:"commit,omitempty"`
	Machine   map[string]string `json:"machine"`
	Targets   []Verdict         `json:"targets"`
	Series    []Series          `json:"series"`
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

// readSeries reads every *.txt in dir as go test -bench output and
// groups the values by benchmark and unit. Units Go adds on its own
// (ns/op and the allocation units) are dropped: each benchmark here is one
// measured run and says what it measured in its own units. It also returns
// the file configuration (goos, cpu, …) it saw.
func readSeries(dir string) ([]Series, map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.txt"))
	if err != nil {
		return nil, nil, err
	}
	if len(files) == 0 {
		return nil, nil, fmt.Errorf("reading benchmark output: no *.txt in %s (run make bench first)", dir)
	}
	sort.Strings(files)
	type key struct{ pkg, bench, unit string }
	byKey := map[key]*Series{}
	var order []key
	config := map[string]string{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		r := benchfmt.NewReader(bytes.NewReader(rejoinSplitResults(data)), filepath.Base(f))
		for r.Scan() {
			res, ok := r.Result().(*benchfmt.Result)
			if !ok {
				continue // a syntax error or a unit metadata line: not a result
			}
			for _, c := range res.Config {
				if c.File {
					config[c.Key] = string(c.Value)
				}
			}
			// benchfmt drops the "Benchmark" prefix; the targets use Go's names.
			name := "Benchmark" + procsSuffix.ReplaceAllString(string(res.Name.Full()), "")
			for _, v := range res.Values {
				if goUnit(v.Unit) {
					continue
				}
				pkg := res.GetConfig("pkg")
				k := key{pkg, name, v.Unit}
				s := byKey[k]
				if s == nil {
					s = &Series{Benchmark: name, Package: pkg, Unit: v.Unit, File: filepath.Base(f)}
					byKey[k] = s
					order = append(order, k)
				}
				s.Values = append(s.Values, v.Value)
			}
		}
		if err := r.Err(); err != nil && !errors.Is(err, io.EOF) {
			return nil, nil, fmt.Errorf("reading %s: %w", f, err)
		}
	}
	out := make([]Series, 0, len(order))
	for _, k := range order {
		s := byKey[k]
		s.Median, s.Min, s.Max = summarize(s.Values)
		out = append(out, *s)
	}
	return out, config, nil
}

func goUnit(u string) bool {
	return u == "ns/op" || u == "B/op" || u == "allocs/op" || u == "sec/op"
}

// summarize returns the median (the mean of the middle two for an even
// count), the lowest and the highest value.
func summarize(vs []float64) (median, lo, hi float64) {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		median = s[n/2]
	} else {
		median = (s[n/2-1] + s[n/2]) / 2
	}
	return median, s[0], s[n-1]
}

// readTargets reads the targets file strictly: an unknown field or a
// wrong operator is an error naming it.
func readTargets(path string) ([]Target, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading targets: %w", err)
	}
	var ts []Target
	if err := yaml.UnmarshalStrict(data, &ts); err != nil {
		return nil, fmt.Errorf("reading targets %s: %w", path, err)
	}
	for i, t := range ts {
		switch {
		case t.Benchmark == "" || t.Unit == "":
			return nil, fmt.Errorf("targets %s: entry %d: benchmark and unit are required", path, i)
		case t.Op != ">=" && t.Op != "<=":
			return nil, fmt.Errorf("targets %s: entry %d (%s %s): op %q must be \">=\" or \"<=\"", path, i, t.Benchmark, t.Unit, t.Op)
		}
	}
	return ts, nil
}

// check judges each target by its series' median: met when the median is
// on the right side of the bound.
func check(ts []Target, series []Series) []Verdict {
	out := make([]Verdict, 0, len(ts))
	for _, t := range ts {
		v := Verdict{Target: t, Status: "not run"}
		for _, s := range series {
			if s.Benchmark != t.Benchmark || s.Unit != t.Unit {
				continue
			}
			med, lo, hi := s.Median, s.Min, s.Max
			v.Median, v.Min, v.Max, v.Rounds = &med, &lo, &hi, len(s.Values)
			met := med >= t.Value
			if t.Op == "<=" {
				met = med <= t.Value
			}
			v.Status = "missed"
			if met {
				v.Status = "met"
			}
		}
		out = append(out, v)
	}
	return out
}

const (
	beginMark = "<!-- targets:begin (written by make bench-results from docs/bench/results.json; do not edit) -->"
	endMark   = "<!-- targets:end -->"
)

// table renders the verdicts as the Markdown table of docs/benchmarks.md.
func table(r Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Written %s", r.Generated)
	if r.Commit != "" {
		fmt.Fprintf(&b, " at commit `%s`", r.Commit)
	}
	fmt.Fprintf(&b, " from `docs/bench/*.txt`; machine: %s.\n\n", machineLine(r.Machine))
	b.WriteString("| claim | benchmark | unit | target | median (lowest–highest round) | rounds | |\n")
	b.WriteString("|---|---|---|---|---|---|---|\n")
	for _, v := range r.Targets {
		got := "—"
		if v.Median != nil {
			got = fmt.Sprintf("%s (%s–%s)", num(*v.Median), num(*v.Min), num(*v.Max))
		}
		mark := map[string]string{"met": "met", "missed": "**missed**", "not run": "not run"}[v.Status]
		op := map[string]string{">=": "≥", "<=": "≤"}[v.Op]
		fmt.Fprintf(&b, "| %s | `%s` | `%s` | %s %s | %s | %d | %s |\n", v.Claim, v.Benchmark, v.Unit, op, num(v.Value), got, v.Rounds, mark)
	}
	return b.String()
}

func machineLine(m map[string]string) string {
	var parts []string
	for _, k := range []string{"cpu", "cores", "memory", "os", "go", "kernel"} {
		if v := m[k]; v != "" {
			parts = append(parts, k+" "+v)
		}
	}
	return strings.Join(parts, ", ")
}

// num prints a value with three significant digits, without exponent for
// the sizes seen here.
func num(f float64) string {
	switch a := math.Abs(f); {
	case a == 0:
		return "0"
	case a >= 100:
		return fmt.Sprintf("%.0f", f)
	case a >= 10:
		return fmt.Sprintf("%.1f", f)
	case a >= 1:
		return fmt.Sprintf("%.2f", f)
	default:
		return fmt.Sprintf("%.3g", f)
	}
}

// splice replaces the text between the markers of doc with body. The
// markers must be there, once each, in order.
func splice(doc, body string) (string, error) {
	i := strings.Index(doc, beginMark)
	j := strings.Index(doc, endMark)
	if i < 0 || j < 0 || j < i || strings.Count(doc, beginMark) != 1 || strings.Count(doc, endMark) != 1 {
		return "", fmt.Errorf("the document needs the lines %q and %q, once each, in that order", beginMark, endMark)
	}
	return doc[:i+len(beginMark)] + "\n" + body + doc[j:], nil
}

// rejoinSplitResults mends result lines a log line split. go test prints a
// benchmark's name, then runs it, then prints its figures; the test
// binary's stderr shares the stream, so a line logged while the benchmark
// runs lands between the two ("BenchmarkX-2 \tI1127 … log" and, lines
// later, "       1\t… ns/op …"). The name is put back in front of the
// figures; the log lines stay (benchfmt skips them).
func rejoinSplitResults(data []byte) []byte {
	lines := bytes.Split(data, []byte("\n"))
	var name []byte
	for i, l := range lines {
		if bytes.HasPrefix(l, []byte("Benchmark")) {
			n, rest, ok := bytes.Cut(l, []byte("\t"))
			name = nil
			if ok && !startsWithCount(rest) {
				name = bytes.TrimSpace(n)
			}
			continue
		}
		if name != nil && startsWithCount(l) {
			lines[i] = append(append(append([]byte{}, name...), '\t'), l...)
			name = nil
		}
	}
	return bytes.Join(lines, []byte("\n"))
}

// startsWithCount reports whether s is the figures part of a result line:
// blanks, then the iteration count, then a tab.
func startsWithCount(s []byte) bool {
	s = bytes.TrimLeft(s, " ")
	n := 0
	for n < len(s) && s[n] >= '0' && s[n] <= '9' {
		n++
	}
	return n > 0 && n < len(s) && s[n] == '\t'
}
