package awskms_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/awskms"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/kmstest"
)

// BenchmarkSignAt20msLatency signs through the provider — the real SDK
// client, SigV4, JSON over HTTP/1.1, local verification — against the fake
// answering each call after 20 ms, at 1, 8 and 32 concurrent workers. It
// reports ops/s (signatures per second) and of-ideal, the rate over
// workers ÷ latency; the target is an of-ideal of at least 0.9. Each run
// starts with warm connections, one per worker, as a long-running signer
// has them: a round of concurrent signatures before the timer starts opens
// them, so short runs do not measure TCP set-up.
func BenchmarkSignAt20msLatency(b *testing.B) {
	const latency = 20 * time.Millisecond
	alg := backends.ECDSAP256SHA256
	srv := startFake(b, awskmsfake.Options{})
	p := newProvider(b, awskms.Options{})
	s := openKey(b, srv, p, alg)
	srv.SetLatency(latency)
	d := kmstest.Digest(alg, "keyward")
	for _, workers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("%s/workers=%d", alg, workers), func(b *testing.B) {
			warmUp(b, workers, func() error {
				_, err := s.SignContext(context.Background(), d, alg.SignerOpts())
				return err
			})
			rate := backendtest.Concurrent(b, workers, func() error {
				_, err := s.SignContext(context.Background(), d, alg.SignerOpts())
				return err
			})
			b.ReportMetric(rate/(float64(workers)/latency.Seconds()), "of-ideal")
		})
	}
}

// warmUp runs op once on each of workers goroutines at the same time.
func warmUp(b *testing.B, workers int, op func() error) {
	b.Helper()
	errs := make(chan error, workers)
	for range workers {
		go func() { errs <- op() }()
	}
	for range workers {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSignWithoutLatency is the provider's and the fake's CPU cost per
// signature: against a fake that answers at once, at 1 and 32 workers, the
// rate is bounded by the CPU (both sides share the machine), not by locks
// or connection limits.
func BenchmarkSignWithoutLatency(b *testing.B) {
	alg := backends.ECDSAP256SHA256
	srv := startFake(b, awskmsfake.Options{})
	p := newProvider(b, awskms.Options{})
	s := openKey(b, srv, p, alg)
	d := kmstest.Digest(alg, "keyward")
	for _, workers := range []int{1, 32} {
		b.Run(fmt.Sprintf("%s/workers=%d", alg, workers), func(b *testing.B) {
			backendtest.Concurrent(b, workers, func() error {
				_, err := s.SignContext(context.Background(), d, alg.SignerOpts())
				return err
			})
		})
	}
}
