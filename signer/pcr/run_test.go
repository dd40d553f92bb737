package pcr

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// A shutdown (SIGTERM) before the caches synced is a normal exit, not an
// error that would make the process exit non-zero.
func TestShutdownBeforeCachesSyncIsNotAnError(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select { // an apiserver that never answers the list
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	client, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := testSigner(t)
	metrics, _ := NewMetrics(prometheus.NewRegistry())
	c, err := New(Options{Client: client, Signers: []*Signer{s}, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	time.Sleep(100 * time.Millisecond) // the informer is listing
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a shutdown before sync: %v, want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}
