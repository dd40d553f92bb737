package kubeclient

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// RunLeader promises "no two replicas ever issue at once" and that it
// returns only after lead returned. The Lease, though, is released
// (ReleaseOnCancel) as soon as ctx ends, while lead is still finishing its
// work (the PCR controller finishes requests in flight on a context that
// ignores the cancellation, and today drains its whole queue): a standby
// acquires the Lease and issues the same requests. The Lease must stay held
// until lead has returned.
func TestTheLeaseIsHeldUntilLeadReturns(t *testing.T) {
	client := fake.NewClientset()
	ctx, cancel := context.WithCancel(context.Background())
	var leadReturned atomic.Bool
	leading := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- RunLeader(ctx, client, LeaderElection{
			Namespace: "keyward", Name: "signer", Identity: "a",
			LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 100 * time.Millisecond,
		}, func(lctx context.Context) error {
			close(leading)
			<-lctx.Done()
			time.Sleep(2 * time.Second) // finishing the requests in flight
			leadReturned.Store(true)
			return nil
		})
	}()
	select {
	case <-leading:
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !leadReturned.Load() {
		l, err := client.CoordinationV1().Leases("keyward").Get(context.Background(), "signer", metav1.GetOptions{})
		// Read after the Get: a lead that returned in between may rightly
		// have released the Lease.
		returned := leadReturned.Load()
		if err == nil && !returned && (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "a") {
			holder := "<nil>"
			if l.Spec.HolderIdentity != nil {
				holder = *l.Spec.HolderIdentity
			}
			t.Fatalf("the Lease was released (holder %q) while lead was still running: a standby may issue now", holder)
		}
		time.Sleep(20 * time.Millisecond)
	}
	<-done
}
