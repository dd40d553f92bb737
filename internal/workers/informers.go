package workers

import (
	"context"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// Informers are a controller's informers, one per signer name. Start runs
// them once, on a context that lasts as long as the process: a standby
// starts them before it leads, so that taking over needs no LIST, and its
// caches are then marked (MarkCatchUp) because they may trail what the
// previous leader wrote.
type Informers struct {
	names   []string
	make    func(name string) cache.SharedIndexInformer
	handler func(name string) cache.ResourceEventHandler

	once    sync.Once
	err     error
	started atomic.Bool
	// byName is written once, in Start, before any informer runs.
	byName map[string]*Informer
	// markRetry is the first wait before a failed mark is read again.
	markRetry time.Duration
}

// Informer is one signer name's informer and its catch-up mark.
type Informer struct {
	cache.SharedIndexInformer
	catchUp CatchUp
}

// Fresh reports whether the informer's store holds every write made
// before its mark (CatchUp.Fresh); an informer never marked is fresh.
func (i *Informer) Fresh() bool { return i.catchUp.Fresh(i.GetIndexer()) }

// Handlers is the usual handler of a controller's informers: adds and
// updates are enqueued under their signer name, deletes forgotten.
func Handlers(enqueue func(signer string, obj any), forget func(obj any)) func(signer string) cache.ResourceEventHandler {
	return func(signer string) cache.ResourceEventHandler {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { enqueue(signer, obj) },
			UpdateFunc: func(_, obj any) { enqueue(signer, obj) },
			DeleteFunc: forget,
		}
	}
}

// NewInformers returns the informers of names, each made by newInformer
// and given handler(name)'s events when started.
func NewInformers(names []string, newInformer func(name string) cache.SharedIndexInformer, handler func(name string) cache.ResourceEventHandler) *Informers {
	names = append([]string(nil), names...)
	sort.Strings(names)
	return &Informers{names: names, make: newInformer, handler: handler, markRetry: markRetry}
}

// Start makes and runs every informer on ctx, once; later calls return
// the first one's error. Once all have synced, warm is called (from a
// goroutine of its own). It returns at once.
func (in *Informers) Start(ctx context.Context, warm func()) error {
	in.once.Do(func() {
		byName := make(map[string]*Informer, len(in.names))
		for _, name := range in.names {
			inf := &Informer{SharedIndexInformer: in.make(name)}
			if _, err := inf.AddEventHandler(in.handler(name)); err != nil {
				in.err = err
				return
			}
			byName[name] = inf
		}
		in.byName = byName
		for _, inf := range byName {
			go inf.Run(ctx.Done())
		}
		in.started.Store(true)
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), in.Synced()...) && warm != nil {
				warm()
			}
		}()
	})
	return in.err
}

// Started reports whether Start has run successfully.
func (in *Informers) Started() bool { return in.started.Load() }

// Warm reports whether Start has run and every informer has synced: a
// standby that could take over without a LIST (for /readyz).
func (in *Informers) Warm() bool {
	if !in.Started() {
		return false
	}
	for _, inf := range in.byName {
		if !inf.HasSynced() {
			return false
		}
	}
	return true
}

// Synced is every informer's HasSynced; nil before Start.
func (in *Informers) Synced() []cache.InformerSynced {
	if !in.Started() {
		return nil
	}
	out := make([]cache.InformerSynced, 0, len(in.byName))
	for _, name := range in.names {
		out = append(out, in.byName[name].HasSynced)
	}
	return out
}

// Get is name's informer; nil before Start or for a name not given.
func (in *Informers) Get(name string) *Informer {
	if !in.Started() {
		return nil
	}
	return in.byName[name]
}

// MarkCatchUp marks every informer with the resourceVersion rv reads for
// its name (a quorum LIST), the names in parallel, each read bounded by
// MarkTimeout: a slow apiserver must not hold up a takeover. An informer
// whose read failed stays behind (every request is read again before it
// is signed) while the read is retried in the background with backoff
// until it succeeds or ctx ends; the failure is logged at default
// verbosity, once, and so is the success that ends it.
func (in *Informers) MarkCatchUp(ctx context.Context, rv func(ctx context.Context, name string) (string, error)) {
	logger := klog.FromContext(ctx)
	var wg sync.WaitGroup
	for _, name := range in.names {
		inf := in.byName[name]
		read := func(ctx context.Context) (string, error) {
			ctx, cancel := context.WithTimeout(ctx, MarkTimeout)
			defer cancel()
			return rv(ctx, name)
		}
		wg.Go(func() {
			err := inf.catchUp.Mark(ctx, read)
			if err == nil {
				return
			}
			logger.Error(err, "Reading the current resourceVersion after taking over; until a retry succeeds every request is read again before it is signed", "signer", name)
			go func() {
				delay := in.markRetry
				for {
					select {
					case <-ctx.Done():
						return
					case <-time.After(delay):
					}
					if err := inf.catchUp.Mark(ctx, read); err == nil {
						logger.Info("Read the current resourceVersion after taking over", "signer", name)
						return
					}
					delay = min(2*delay, maxMarkRetry)
				}
			}()
		})
	}
	wg.Wait()
}

// The backoff of MarkCatchUp's retries.
const (
	markRetry    = time.Second
	maxMarkRetry = 30 * time.Second
)

// Prepared returns Informers that count as started, holding infs as they
// are: none is run (unit tests fill their stores by hand).
func Prepared(infs map[string]cache.SharedIndexInformer) *Informers {
	in := &Informers{byName: map[string]*Informer{}, markRetry: markRetry}
	for name, inf := range infs {
		in.names = append(in.names, name)
		in.byName[name] = &Informer{SharedIndexInformer: inf}
	}
	sort.Strings(in.names)
	in.once.Do(func() {})
	in.started.Store(true)
	return in
}
