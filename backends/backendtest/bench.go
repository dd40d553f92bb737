package backendtest

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Concurrent runs op b.N times spread over exactly workers goroutines,
// reports the rate as "ops/s" and returns it. (b.RunParallel scales goroutines with
// GOMAXPROCS; a benchmark of a signer at 1, 2, 4, 16 workers needs exact
// counts.)
func Concurrent(b *testing.B, workers int, op func() error) float64 {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	b.ResetTimer()
	start := time.Now()
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				if err := op(); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	if err := failed.Load(); err != nil {
		b.Fatal(*err)
	}
	rate := float64(b.N) / elapsed.Seconds()
	b.ReportMetric(rate, "ops/s")
	return rate
}
