package gcpkms_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/backendtest"
	"github.com/keyward/keyward/backends/gcpkms"
	"github.com/keyward/keyward/testsupport/gcpkmsfake"
)

// BenchmarkSignAt20msLatency signs through the provider against the fake
// answering after 20 ms, at 1, 8 and 32 concurrent workers. It reports
// sigs/s and of-ideal, the rate over workers ÷ latency; the target is an
// of-ideal of at least 0.9.
func BenchmarkSignAt20msLatency(b *testing.B) {
	const latency = 20 * time.Millisecond
	alg := backends.ECDSAP256SHA256
	srv := startFake(b, gcpkmsfake.Options{})
	p := newProvider(b, srv, gcpkms.Options{})
	uri := addKey(b, srv, "bench", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
	s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
	if err != nil {
		b.Fatal(err)
	}
	srv.SetLatency(latency)
	digest := sha256.Sum256([]byte("keyward"))
	for _, workers := range []int{1, 8, 32} {
		b.Run(fmt.Sprintf("%s/workers=%d", alg, workers), func(b *testing.B) {
			rate := backendtest.Concurrent(b, workers, func() error {
				_, err := s.SignContext(context.Background(), digest[:], alg.SignerOpts())
				return err
			})
			b.ReportMetric(rate/(float64(workers)/latency.Seconds()), "of-ideal")
		})
	}
}

// BenchmarkSignWithoutLatency is the provider's and the fake's CPU cost per
// signature (both share the machine): gRPC, CRC32C, the fake's signing and
// the local verification, at 1 and 32 workers.
func BenchmarkSignWithoutLatency(b *testing.B) {
	alg := backends.ECDSAP256SHA256
	srv := startFake(b, gcpkmsfake.Options{})
	p := newProvider(b, srv, gcpkms.Options{})
	uri := addKey(b, srv, "bench", kmspb.CryptoKeyVersion_EC_SIGN_P256_SHA256)
	s, err := p.Open(context.Background(), backends.OpenRequest{URI: uri})
	if err != nil {
		b.Fatal(err)
	}
	digest := sha256.Sum256([]byte("keyward"))
	for _, workers := range []int{1, 32} {
		b.Run(fmt.Sprintf("%s/workers=%d", alg, workers), func(b *testing.B) {
			backendtest.Concurrent(b, workers, func() error {
				_, err := s.SignContext(context.Background(), digest[:], alg.SignerOpts())
				return err
			})
		})
	}
}
