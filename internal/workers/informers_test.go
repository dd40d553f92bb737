package workers

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// newListInformer is an informer whose list answers resourceVersion rv
// and whose watch never sends anything.
func newListInformer(rv string) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (runtime.Object, error) {
			return &corev1.ConfigMapList{ListMeta: metav1.ListMeta{ResourceVersion: rv}}, nil
		},
		WatchFuncWithContext: func(_ context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if o.SendInitialEvents != nil {
				// As an apiserver without watch-list: the reflector lists.
				return nil, errors.New("watch-list not served")
			}
			return watch.NewFake(), nil
		},
	}
	return cache.NewSharedIndexInformer(lw, &corev1.ConfigMap{}, 0, cache.Indexers{})
}

// Start makes and runs each informer once, calls warm once all have
// synced, and a takeover's mark keeps an informer "behind" until it has
// seen the marked resourceVersion, for good when the read failed.
func TestInformersStartOnceWarmAndMark(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var made, handlers atomic.Int32
	in := NewInformers([]string{"b", "a"}, func(string) cache.SharedIndexInformer {
		made.Add(1)
		return newListInformer("7")
	}, func(string) cache.ResourceEventHandler {
		handlers.Add(1)
		return cache.ResourceEventHandlerFuncs{}
	})
	if in.Started() || in.Warm() || in.Get("a") != nil || in.Synced() != nil {
		t.Fatal("informers look started before Start")
	}
	warmed := make(chan struct{}, 2)
	for range 2 {
		if err := in.Start(ctx, func() { warmed <- struct{}{} }); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-warmed:
	case <-time.After(time.Minute):
		t.Fatal("warm was never called")
	}
	if !in.Warm() || made.Load() != 2 || handlers.Load() != 2 || len(in.Synced()) != 2 || len(warmed) != 0 {
		t.Fatalf("warm=%v made=%d handlers=%d synced=%d extra warm calls=%d; want one start of two informers",
			in.Warm(), made.Load(), handlers.Load(), len(in.Synced()), len(warmed))
	}
	if !in.Get("a").Fresh() {
		t.Fatal("an informer never marked is not fresh")
	}
	in.MarkCatchUp(ctx, func(_ context.Context, name string) (string, error) {
		if name == "a" {
			return "9", nil
		}
		return "", errors.New("apiserver down")
	})
	if in.Get("a").Fresh() {
		t.Error(`informer "a" at resourceVersion 7 is fresh against a mark of 9`)
	}
	if in.Get("b").Fresh() {
		t.Error(`informer "b", whose mark could not be read, is fresh`)
	}
	in.MarkCatchUp(ctx, func(context.Context, string) (string, error) { return "7", nil })
	if !in.Get("a").Fresh() || !in.Get("b").Fresh() {
		t.Error("informers at resourceVersion 7 are not fresh against a mark of 7")
	}
}

// A mark whose read failed is read again in the background until it
// succeeds: the informer is behind meanwhile, and fresh once it has caught
// up with the mark finally read.
func TestAFailedMarkIsRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := NewInformers([]string{"a"}, func(string) cache.SharedIndexInformer { return newListInformer("7") },
		func(string) cache.ResourceEventHandler { return cache.ResourceEventHandlerFuncs{} })
	in.markRetry = 10 * time.Millisecond
	if err := in.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if !cache.WaitForCacheSync(ctx.Done(), in.Synced()...) {
		t.Fatal("not synced")
	}
	var reads atomic.Int32
	in.MarkCatchUp(ctx, func(context.Context, string) (string, error) {
		if reads.Add(1) <= 3 {
			return "", errors.New("apiserver slow")
		}
		return "7", nil
	})
	if in.Get("a").Fresh() {
		t.Fatal("fresh right after a failed mark")
	}
	deadline := time.Now().Add(time.Minute)
	for !in.Get("a").Fresh() {
		if time.Now().After(deadline) {
			t.Fatalf("still behind after %d reads", reads.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := reads.Load(); n != 4 {
		t.Errorf("%d reads, want 4 (three failures, then the mark)", n)
	}
}
