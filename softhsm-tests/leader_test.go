package softhsmtests

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/testsupport/controlplane"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RunLeader returns only after lead has returned: the signer closes its CA
// keys and its Event sink when RunLeader is back, so workers still
// finishing a request at shutdown must be done by then.
func TestRunLeaderReturnsAfterLead(t *testing.T) {
	ctx := testContext(t)
	ns := uniqueName(t, "lease")
	if err := controlplane.EnsureNamespace(ctx, cp.AdminClient(), ns); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	leading := make(chan struct{})
	var drained atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- kubeclient.RunLeader(runCtx, cp.AdminClient(), kubeclient.LeaderElection{
			Namespace: ns, Name: "keyward-signer", Identity: "replica-a",
			LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 500 * time.Millisecond,
		}, func(lctx context.Context) error {
			close(leading)
			<-lctx.Done()
			time.Sleep(500 * time.Millisecond) // a worker finishing its request
			drained.Store(true)
			return nil
		})
	}()
	select {
	case <-leading:
	case <-ctx.Done():
		t.Fatal("never became leader")
	}
	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunLeader after its context ended: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("RunLeader did not return")
	}
	if !drained.Load() {
		t.Fatal("RunLeader returned while lead was still running")
	}
}

// A leader whose work fails (or stops on its own) gives the Lease up at once
// and reports why, instead of renewing it while issuing nothing; a standby
// then takes over without waiting for the Lease to expire.
func TestRunLeaderReleasesTheLeaseWhenLeadFails(t *testing.T) {
	ctx := testContext(t)
	ns := uniqueName(t, "lease")
	if err := controlplane.EnsureNamespace(ctx, cp.AdminClient(), ns); err != nil {
		t.Fatal(err)
	}
	le := kubeclient.LeaderElection{
		Namespace: ns, Name: "keyward-signer",
		LeaseDuration: time.Minute, RenewDeadline: 30 * time.Second, RetryPeriod: 200 * time.Millisecond,
	}
	for _, tc := range []struct {
		name    string
		leadErr error
	}{
		{"lead fails", errors.New("controller could not start")},
		{"lead stops on its own", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			le.Identity = uniqueName(t, "replica")
			err := kubeclient.RunLeader(ctx, cp.AdminClient(), le, func(context.Context) error { return tc.leadErr })
			if err == nil || (tc.leadErr != nil && !errors.Is(err, tc.leadErr)) {
				t.Fatalf("RunLeader returned %v, want an error (wrapping %v)", err, tc.leadErr)
			}
			lease, err := cp.AdminClient().CoordinationV1().Leases(ns).Get(ctx, le.Name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if h := lease.Spec.HolderIdentity; h != nil && *h == le.Identity {
				t.Fatalf("the Lease is still held by %s, which no longer issues", *h)
			}
		})
	}
}
