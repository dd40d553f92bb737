package softhsmtests

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// cpuMeter reads the CPU time this test process (the in-process signer,
// the creating nodes and the watches), kube-apiserver and etcd have used,
// and how busy the whole machine has been, so that a benchmark can say
// per request where the CPU went and whether the CPU was what bounded it.
type cpuMeter struct {
	self, apiserver, etcd time.Duration
	busy, all             uint64 // machine jiffies from /proc/stat
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every
// Linux architecture Go builds for.
const clockTicks = 100

func readCPU(tb testing.TB) cpuMeter {
	tb.Helper()
	var m cpuMeter
	m.self = selfCPU(tb)
	api, etcd := cp.PIDs()
	m.apiserver = procCPU(tb, api)
	m.etcd = procCPU(tb, etcd)
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		tb.Fatal(err)
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	// cpu user nice system idle iowait irq softirq steal ...
	for i, f := range strings.Fields(string(line))[1:] {
		v, _ := strconv.ParseUint(f, 10, 64)
		m.all += v
		if i != 3 && i != 4 {
			m.busy += v
		}
	}
	return m
}

// selfCPU is this process's user + system time.
func selfCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// procCPU is user + system time of process pid.
func procCPU(tb testing.TB, pid int) time.Duration {
	tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// The fields after the command name, which may hold spaces, in
	// parentheses: state is the first, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(f) < 13 {
		tb.Fatalf("unexpected /proc/%d/stat %q", pid, b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		tb.Fatalf("unexpected /proc/%d/stat %q", pid, b)
	}
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// cpuUse is what n requests cost between two readings.
type cpuUse struct {
	selfMS, apiserverMS, etcdMS float64 // CPU milliseconds per request
	busy                        float64 // share of the machine's CPU time in use, 0–1
}

func (m cpuMeter) since(start cpuMeter, n int) cpuUse {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(n) }
	u := cpuUse{selfMS: per(m.self - start.self), apiserverMS: per(m.apiserver - start.apiserver), etcdMS: per(m.etcd - start.etcd)}
	if all := m.all - start.all; all > 0 {
		u.busy = float64(m.busy-start.busy) / float64(all)
	}
	return u
}

// mean is the average of two uses (the ceiling's runs before and after).
func (u cpuUse) mean(o cpuUse) cpuUse {
	return cpuUse{(u.selfMS + o.selfMS) / 2, (u.apiserverMS + o.apiserverMS) / 2, (u.etcdMS + o.etcdMS) / 2, (u.busy + o.busy) / 2}
}

// report reports u with its units prefixed with prefix, per what ("PCR",
// "CSR").
func (u cpuUse) report(b *testing.B, prefix, what string) {
	b.ReportMetric(u.selfMS, prefix+"test-cpu-ms/"+what)
	b.ReportMetric(u.apiserverMS, prefix+"apiserver-cpu-ms/"+what)
	b.ReportMetric(u.etcdMS, prefix+"etcd-cpu-ms/"+what)
	b.ReportMetric(100*u.busy, prefix+"busy-%")
}
