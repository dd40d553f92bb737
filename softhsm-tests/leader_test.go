package softhsmtests

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/kubeclient"
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
		}, func(lctx context.Context) {
			close(leading)
			<-lctx.Done()
			time.Sleep(500 * time.Millisecond) // a worker finishing its request
			drained.Store(true)
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
