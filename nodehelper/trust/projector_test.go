package trust

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// fakeClient holds one ClusterTrustBundle named "registry-ca". The fake
// clientset sends no watch-list bookmark, so streaming lists are off.
func fakeClient(t *testing.T) *fake.Clientset {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	return fake.NewClientset(&certv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: "registry-ca"},
		Spec: certv1.ClusterTrustBundleSpec{TrustBundle: pemOf(testCert(t, "registry ca"), nil)}})
}

// runProjector runs a projector until the test ends; wait returns Run's
// error once it has returned.
func runProjector(t *testing.T, opts Options) (cancel func(), wait func() error) {
	t.Helper()
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- p.Run(ctx) }()
	var once sync.Once
	var runErr error
	wait = func() error {
		once.Do(func() { runErr = <-ch })
		return runErr
	}
	t.Cleanup(func() { cancel(); _ = wait() })
	return cancel, wait
}

// Stopping a projector (the agent restarts it with a new client at each
// node identity rotation) while its change hook runs does not kill the
// hook: the file is already written, so the next projector sees no change
// and would never run the hook again (containerd never reloaded).
func TestStoppingTheProjectorLetsARunningHookFinish(t *testing.T) {
	started, release := make(chan context.Context), make(chan struct{})
	cancel, wait := runProjector(t, Options{Client: fakeClient(t), Name: "registry-ca", Dir: filepath.Join(t.TempDir(), "trust"),
		OnChangeDebounce: time.Millisecond,
		OnChange: func(ctx context.Context) error {
			started <- ctx
			<-release
			return ctx.Err()
		}})
	hookCtx := <-started
	cancel()
	if err := hookCtx.Err(); err != nil {
		t.Errorf("the hook's context ended with the projector's: %v", err)
	}
	close(release)
	if err := wait(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// The projector judges the selection only after its informer has listed:
// while the first list is under way nothing is said or written, in
// particular no "empty selection".
func TestNoPassBeforeTheInformerHasListed(t *testing.T) {
	client := fakeClient(t)
	listing, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	client.PrependReactor("list", "clustertrustbundles", func(k8stesting.Action) (bool, runtime.Object, error) {
		once.Do(func() { close(listing) })
		<-release
		return false, nil, nil
	})
	var mu sync.Mutex
	var outcomes []Outcome
	runProjector(t, Options{Client: client, Name: "registry-ca", Dir: filepath.Join(t.TempDir(), "trust"),
		Synced: func(o Outcome) {
			mu.Lock()
			outcomes = append(outcomes, o)
			mu.Unlock()
		}})
	<-listing
	time.Sleep(200 * time.Millisecond) // room for a premature pass (none may come)
	mu.Lock()
	early := len(outcomes)
	mu.Unlock()
	close(release)
	if early != 0 {
		t.Fatalf("%d passes before the informer listed: %+v", early, outcomes)
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n := len(outcomes)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(errors.New("no pass after the list"))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if o := outcomes[0]; o.Empty || !o.Written {
		t.Errorf("first pass %+v, want the bundle written", o)
	}
}
