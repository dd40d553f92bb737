package pcr

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// scriptedIssuer is an Issuer whose Current and Reserve answer as set, and
// that records each reservation asked for.
type scriptedIssuer struct {
	auth       *authority.Authority
	currentErr error
	reserveErr error
	reserved   []time.Time
}

func (s *scriptedIssuer) Current() (*authority.Authority, string, error) {
	if s.currentErr != nil {
		return nil, "", s.currentErr
	}
	return s.auth, "g1", nil
}

func (s *scriptedIssuer) Reserve(_ context.Context, generation string, notAfter time.Time) error {
	if generation != "g1" {
		panic("reserve for " + generation)
	}
	s.reserved = append(s.reserved, notAfter)
	return s.reserveErr
}

// Without a generation that may issue, or when the reservation cannot be
// recorded, nothing is signed and the request waits (never Failed, even
// with failAfter); with both, the reservation asked for covers the leaf.
func TestIssuerGatesEverySignature(t *testing.T) {
	unavailable := errors.New("no Active generation")
	cases := []struct {
		name                   string
		currentErr, reserveErr error
		wantWait               bool
		wantErr                bool
		wantSigned             int32
	}{
		{"no generation may issue", errors.Join(issuer.ErrUnavailable, unavailable), nil, true, false, 0},
		{"the reservation is not written", nil, errors.Join(issuer.ErrUnavailable, unavailable), false, true, 0},
		{"a generation issues and the reservation is written", nil, nil, false, false, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, counting := testSigner(t)
			iss := &scriptedIssuer{auth: authorityOf(s), currentErr: tc.currentErr, reserveErr: tc.reserveErr}
			s.Issuer = iss
			p := testPCR(t, s.Name)
			client := fake.NewClientset(p)
			metrics, _ := NewMetrics(prometheus.NewRegistry())
			c, err := New(Options{Client: client, Signers: []*Signer{s}, Metrics: metrics, FailAfter: time.Nanosecond})
			if err != nil {
				t.Fatal(err)
			}
			_ = prepareInformer(c, s.Name).GetIndexer().Add(p)
			c.enqueue(s.Name, p)
			before := time.Now()
			wait, err := c.sync(context.Background(), queueKey{signer: s.Name, namespace: p.Namespace, name: p.Name})
			if (err != nil) != tc.wantErr || (wait > 0) != tc.wantWait {
				t.Fatalf("sync = %s, %v; want a wait %v, an error %v", wait, err, tc.wantWait, tc.wantErr)
			}
			if err != nil && Classify(err) != Transient {
				t.Fatalf("sync error %v is %s, want transient", err, Classify(err))
			}
			if n := counting.Signatures(); n != tc.wantSigned {
				t.Fatalf("the CA key signed %d times, want %d", n, tc.wantSigned)
			}
			got, _ := client.CertificatesV1().PodCertificateRequests(p.Namespace).Get(context.Background(), p.Name, metav1.GetOptions{})
			if tc.wantSigned == 0 {
				if len(got.Status.Conditions) != 0 {
					t.Fatalf("status written: %+v", got.Status.Conditions)
				}
				return
			}
			if len(iss.reserved) != 1 || got.Status.NotAfter == nil || got.Status.NotAfter.After(iss.reserved[0]) || iss.reserved[0].Before(before) {
				t.Fatalf("reserved %v, leaf notAfter %v: the reservation must cover the leaf", iss.reserved, got.Status.NotAfter)
			}
		})
	}
}
