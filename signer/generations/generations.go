// Package generations tells the signer which CA generation of each signer
// name issues: it watches Authority objects (keyward.dev/v1alpha1), keeps
// the key of every generation that is Staged, Promoted or Active (desired or
// recorded) open, and offers, per signer name, the generation the trust
// publisher's record calls Active as an issuer.Issuer. The record is the
// annotation on the signer name's canary and live ClusterTrustBundles
// (kubeclient/authority/record), which only the signer's identity may
// write; a status phase, which any holder of authorities/status may write,
// is never acted on alone (docs/trustpublisher.md, "Whose phase is it"). While leading it records
// each generation's keyCheck and, before a signature could outlive it,
// raises lastIssuedNotAfter (docs/rotation.md).
package generations

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/uri"
	"github.com/keyward/keyward/internal/kubemsg"
	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/prometheus/client_golang/prometheus"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// ReservationMargin is added to a reservation beyond the longest leaf the
// signer name issues (ROTATION.md: now + maxLifetime + 10m).
const ReservationMargin = 10 * time.Minute

// Defaults of Options.
const (
	defaultOpenTimeout  = 30 * time.Second
	defaultCloseDelay   = 45 * time.Second
	defaultWriteTimeout = 10 * time.Second
	workers             = 2
)

// StatusWriter applies the signer's status fields of an Authority
// (client.Client does).
type StatusWriter interface {
	ApplyStatus(ctx context.Context, name string, status any, fieldManager string) (*v1alpha1.Authority, error)
}

// Policy is what the configuration says about a signer name that matters
// here.
type Policy struct {
	Name string
	// MaxLifetime is the longest leaf the signer name issues.
	MaxLifetime time.Duration
}

// Options configure New.
type Options struct {
	// Writer writes the signer's status fields (only while leading).
	Writer StatusWriter
	// Informer is an Authority informer (client.NewInformer); the caller
	// runs it.
	Informer cache.SharedIndexInformer
	// Bundles is a ClusterTrustBundle informer (record.NewInformer) over
	// at least the trust publisher's bundles; the caller runs it. The
	// trust publisher's record on them says which generation is Active.
	Bundles cache.SharedIndexInformer
	// Open opens a key URI. The returned key is closed by the Manager.
	Open func(ctx context.Context, keyURI string) (backends.Signer, error)
	// Signers are the configured signer names.
	Signers []Policy
	// CANotAfter, if set, gets the expiry of every generation whose key
	// is open, labelled signer and generation.
	CANotAfter *prometheus.GaugeVec
	Clock      clock.Clock
	// OpenTimeout bounds one key opening (default 30s).
	OpenTimeout time.Duration
	// CloseDelay is how long a key no longer needed stays open, so that a
	// signature that took it just before stays valid (default 45s, longer
	// than a signature's timeout).
	CloseDelay time.Duration
}

// Manager keeps the generations of every configured signer name. Build it
// with New, run it with Run; Issuer gives each name's issuer.Issuer.
type Manager struct {
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[string]
	signers map[string]*signerGens
	order   []string
	leading atomic.Bool
	synced  atomic.Bool
	// noAPI: the latest Authority list was answered 404 (watchError).
	noAPI atomic.Bool

	closeMu sync.Mutex
	closing map[backends.Signer]*time.Timer
	stopped bool
}

// New validates opts. It starts nothing.
func New(opts Options) (*Manager, error) {
	if opts.Writer == nil || opts.Informer == nil || opts.Bundles == nil || opts.Open == nil || len(opts.Signers) == 0 {
		return nil, errors.New("generations needs a status writer, an Authority informer, a ClusterTrustBundle informer, a key opener and at least one signer name")
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.OpenTimeout <= 0 {
		opts.OpenTimeout = defaultOpenTimeout
	}
	if opts.CloseDelay <= 0 {
		opts.CloseDelay = defaultCloseDelay
	}
	m := &Manager{
		opts:    opts,
		signers: map[string]*signerGens{},
		closing: map[backends.Signer]*time.Timer{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](500*time.Millisecond, time.Minute),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "keyward-generations"}),
	}
	for _, p := range opts.Signers {
		if p.Name == "" || p.MaxLifetime <= 0 {
			return nil, fmt.Errorf("signer %q needs a name and a positive maximum lifetime", p.Name)
		}
		if _, dup := m.signers[p.Name]; dup {
			return nil, fmt.Errorf("signer %s given twice", p.Name)
		}
		s := &signerGens{m: m, name: p.Name, maxLifetime: p.MaxLifetime, keys: map[string]*genKey{},
			reserved: map[string]time.Time{}, flights: map[string]*flight{}, checks: map[string]v1alpha1.KeyCheck{},
			written: map[string]v1alpha1.KeyCheck{}}
		s.current.Store(&snapshot{err: fmt.Errorf("%w: signer %s: Authority objects not read yet", issuer.ErrUnavailable, p.Name)})
		m.signers[p.Name] = s
		m.order = append(m.order, p.Name)
	}
	// Fails only once the informer runs: the caller runs it after New.
	if err := opts.Informer.SetWatchErrorHandlerWithContext(m.watchError); err != nil {
		return nil, fmt.Errorf("handling the Authority informer's watch errors: %w", err)
	}
	return m, nil
}

// Issuer returns the issuer.Issuer of a configured signer name, or nil.
func (m *Manager) Issuer(name string) issuer.Issuer {
	if s, ok := m.signers[name]; ok {
		return s
	}
	return nil
}

// Err is nil when every configured signer name has a generation that
// issues; otherwise it says, per name, why not (for /readyz).
func (m *Manager) Err() error {
	if m.noAPI.Load() {
		return ErrNoAuthorityAPI
	}
	var errs []error
	for _, name := range m.order {
		if err := m.signers[name].current.Load().err; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Witness is what this process itself knows of a generation, for the trust
// publisher running beside it: the keyCheck it made (ok false when it keeps
// no check of the generation) and the latest reservation it knows
// (lastIssuedNotAfter it wrote or read; zero when none). Status can be
// written by any holder of authorities/status; these cannot.
func (m *Manager) Witness(signerName, generation string) (kc v1alpha1.KeyCheck, reserved time.Time, ok bool) {
	s := m.signers[signerName]
	if s == nil {
		return kc, reserved, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	kc, ok = s.checks[generation]
	return kc, s.reserved[generation], ok
}

// Keys are the keys open now, of every signer name and generation.
func (m *Manager) Keys() []backends.Signer {
	var out []backends.Signer
	for _, name := range m.order {
		s := m.signers[name]
		s.keysMu.Lock()
		for _, k := range s.keys {
			if k.key != nil {
				out = append(out, k.key)
			}
		}
		s.keysMu.Unlock()
	}
	return out
}

// Run handles the informer's events until ctx ends, then closes every key.
// The informer must be running (Run waits for its cache).
func (m *Manager) Run(ctx context.Context) error {
	defer utilruntime.HandleCrash()
	defer m.closeAll()
	defer m.queue.ShutDown()
	handle := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if a, ok := obj.(*v1alpha1.Authority); ok {
			m.apiServed(ctx)
			if _, mine := m.signers[a.Spec.SignerName]; mine {
				m.queue.Add(a.Spec.SignerName)
			}
		}
	}
	reg, err := m.opts.Informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    handle,
		UpdateFunc: func(_, obj any) { handle(obj) },
		DeleteFunc: handle,
	})
	if err != nil {
		return fmt.Errorf("watching Authority objects: %w", err)
	}
	defer func() { _ = m.opts.Informer.RemoveEventHandler(reg) }()
	// A change of the trust publisher's record (a bundle's annotation)
	// moves the Active generation as a status change would.
	bundle := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if b, ok := obj.(*certv1.ClusterTrustBundle); ok {
			if _, mine := m.signers[b.Spec.SignerName]; mine {
				m.queue.Add(b.Spec.SignerName)
			}
		}
	}
	breg, err := m.opts.Bundles.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    bundle,
		UpdateFunc: func(_, obj any) { bundle(obj) },
		DeleteFunc: bundle,
	})
	if err != nil {
		return fmt.Errorf("watching ClusterTrustBundles: %w", err)
	}
	defer func() { _ = m.opts.Bundles.RemoveEventHandler(breg) }()
	if !cache.WaitForCacheSync(ctx.Done(), reg.HasSynced, breg.HasSynced) {
		return nil
	}
	m.synced.Store(true)
	m.apiServed(ctx) // a list succeeded
	// A signer name no Authority names gets no event: look at each once.
	for _, name := range m.order {
		m.queue.Add(name)
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { wait.UntilWithContext(ctx, m.runWorker, time.Second) })
	}
	<-ctx.Done()
	m.queue.ShutDown()
	wg.Wait()
	return nil
}

// Lead writes the signer's status fields until ctx ends: keyCheck when it
// changes, and the reservations Reserve asks for. Only the leader runs it.
func (m *Manager) Lead(ctx context.Context) error {
	for _, s := range m.signers {
		s.wmu.Lock()
		clear(s.written)
		s.wmu.Unlock()
	}
	m.leading.Store(true)
	defer m.leading.Store(false)
	for _, name := range m.order {
		m.queue.Add(name)
	}
	<-ctx.Done()
	return nil
}

func (m *Manager) runWorker(ctx context.Context) {
	for {
		name, quit := m.queue.Get()
		if quit {
			return
		}
		err := m.signers[name].sync(ctx)
		if err != nil && ctx.Err() == nil {
			klog.FromContext(ctx).V(2).Info("Retrying CA generations", "signer", name, "err", err)
			m.queue.AddRateLimited(name)
		} else {
			m.queue.Forget(name)
		}
		m.queue.Done(name)
	}
}

// closeLater closes k after CloseDelay (at once once Run has ended).
func (m *Manager) closeLater(k backends.Signer) {
	m.closeMu.Lock()
	defer m.closeMu.Unlock()
	if m.stopped {
		go func() { _ = k.Close() }()
		return
	}
	m.closing[k] = time.AfterFunc(m.opts.CloseDelay, func() {
		m.closeMu.Lock()
		_, mine := m.closing[k]
		delete(m.closing, k)
		m.closeMu.Unlock()
		if mine {
			_ = k.Close()
		}
	})
}

// closeAll closes every key, open or waiting to be closed, all at once.
func (m *Manager) closeAll() {
	var keys []backends.Signer
	m.closeMu.Lock()
	m.stopped = true
	for k, t := range m.closing {
		t.Stop()
		keys = append(keys, k)
	}
	clear(m.closing)
	m.closeMu.Unlock()
	for _, s := range m.signers {
		s.keysMu.Lock()
		for g, k := range s.keys {
			if k.key != nil {
				keys = append(keys, k.key)
			}
			s.dropMetric(g)
		}
		clear(s.keys)
		s.keysMu.Unlock()
	}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Go(func() { _ = k.Close() })
	}
	wg.Wait()
}

// snapshot is what Current returns for a signer name.
type snapshot struct {
	auth       *authority.Authority
	generation string
	// object is the Authority's name (the status writes go there).
	object string
	err    error
}

// genKey is one generation's opened key and what was checked about it.
type genKey struct {
	keyURI, certPEM, chainPEM string
	key                       backends.Signer // nil: opening failed
	// noRetry: opening failed on the PIN; not tried again with this key
	// URI (a refused PIN counts toward the token's lockout).
	noRetry bool
	auth    *authority.Authority
	check   v1alpha1.KeyCheck // without Time
}

// flight is one reservation write under way; waiters read err after done.
type flight struct {
	done chan struct{}
	want time.Time
	err  error
}

// signerGens is one signer name's generations.
type signerGens struct {
	m           *Manager
	name        string
	maxLifetime time.Duration
	current     atomic.Pointer[snapshot]

	// keys is changed only by sync (one at a time per name: the work
	// queue never hands one name to two workers); keysMu guards it against
	// readers (Keys).
	keysMu sync.Mutex
	keys   map[string]*genKey
	// logged is the last state logged at default verbosity; writeLogged
	// the last status write failure logged so.
	logged, writeLogged string

	// mu guards reserved, flights and checks.
	mu       sync.Mutex
	reserved map[string]time.Time         // lastIssuedNotAfter known written, by generation
	flights  map[string]*flight           // reservation writes under way
	checks   map[string]v1alpha1.KeyCheck // keyCheck to report, by generation (Time set when it changed)

	// wmu serialises status writes; written is the keyCheck last written
	// by this leader, by generation.
	wmu     sync.Mutex
	written map[string]v1alpha1.KeyCheck
}

// Current returns the generation whose observed phase is Active.
func (s *signerGens) Current() (*authority.Authority, string, error) {
	c := s.current.Load()
	if c.err != nil {
		return nil, "", c.err
	}
	return c.auth, c.generation, nil
}

// Reserve makes sure status lastIssuedNotAfter of generation is at least
// notAfter, writing now + maxLifetime + margin when it is not. Concurrent
// callers share one write per generation. A generation that no longer
// issues, or a write that fails, is an error matching issuer.ErrUnavailable.
func (s *signerGens) Reserve(ctx context.Context, generation string, notAfter time.Time) error {
	s.mu.Lock()
	for {
		if c := s.current.Load(); c.err != nil || c.generation != generation {
			s.mu.Unlock()
			return fmt.Errorf("%w: signer %s: generation %s no longer issues", issuer.ErrUnavailable, s.name, generation)
		}
		if !notAfter.After(s.reserved[generation]) {
			s.mu.Unlock()
			return nil
		}
		f := s.flights[generation]
		if f == nil {
			break
		}
		s.mu.Unlock()
		select {
		case <-f.done:
		case <-ctx.Done():
			return fmt.Errorf("%w: signer %s: waiting for the lastIssuedNotAfter of generation %s: %w", issuer.ErrUnavailable, s.name, generation, ctx.Err())
		}
		if f.err != nil && !notAfter.After(f.want) {
			return f.err
		}
		s.mu.Lock()
	}
	if !s.m.leading.Load() {
		s.mu.Unlock()
		return fmt.Errorf("%w: signer %s: not the leader, cannot record lastIssuedNotAfter", issuer.ErrUnavailable, s.name)
	}
	want := ceilSecond(later(s.m.opts.Clock.Now().Add(s.maxLifetime), notAfter).Add(ReservationMargin))
	f := &flight{done: make(chan struct{}), want: want}
	s.flights[generation] = f
	s.mu.Unlock()

	f.err = s.write(ctx, map[string]time.Time{generation: want})
	if f.err != nil {
		f.err = fmt.Errorf("%w: signer %s: recording lastIssuedNotAfter %s of generation %s: %w",
			issuer.ErrUnavailable, s.name, want.UTC().Format(time.RFC3339), generation, f.err)
	}
	s.mu.Lock()
	delete(s.flights, generation)
	if f.err == nil && want.After(s.reserved[generation]) {
		s.reserved[generation] = want
	}
	s.mu.Unlock()
	close(f.done)
	return f.err
}

// write applies every signer-owned status field of the Authority: each
// generation's lastIssuedNotAfter (the latest of the cache's, what this
// replica wrote, and raise) and the keyCheck of each generation whose key
// is kept open. A field left out would be removed (one field manager for
// every replica).
func (s *signerGens) write(ctx context.Context, raise map[string]time.Time) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	c := s.current.Load()
	a := s.authority(c.object)
	if a == nil {
		return fmt.Errorf("no single Authority names signer %s", s.name)
	}
	ctx, cancel := context.WithTimeout(ctx, defaultWriteTimeout)
	defer cancel()
	s.mu.Lock()
	body, checks := s.statusLocked(a, raise)
	s.mu.Unlock()
	if _, err := s.m.opts.Writer.ApplyStatus(ctx, a.Name, map[string]any{"generations": body}, v1alpha1.FieldManagerSigner); err != nil {
		return fmt.Errorf("applying the status of Authority %s: %w", a.Name, err)
	}
	s.written = checks
	return nil
}

// statusLocked builds the signer's status generations for a, in spec
// order. A generation gone from spec is left out: applying it again would
// keep its status entry alive forever (the trust publisher has dropped
// its fields), one more per rotation, until status.generations is full.
// s.mu is held.
func (s *signerGens) statusLocked(a *v1alpha1.Authority, raise map[string]time.Time) ([]map[string]any, map[string]v1alpha1.KeyCheck) {
	var names []string
	for _, g := range a.Spec.Generations {
		names = append(names, g.Name)
	}
	cached := map[string]v1alpha1.GenerationStatus{}
	for _, g := range a.Status.Generations {
		cached[g.Name] = g
	}
	var out []map[string]any
	checks := map[string]v1alpha1.KeyCheck{}
	for _, n := range names {
		e := map[string]any{"name": n}
		last := later(s.reserved[n], raise[n])
		if g, ok := cached[n]; ok && g.LastIssuedNotAfter != nil {
			last = later(last, g.LastIssuedNotAfter.Time)
		}
		if !last.IsZero() {
			e["lastIssuedNotAfter"] = metav1.NewTime(last)
		}
		if kc, ok := s.checks[n]; ok {
			e["keyCheck"] = kc
			checks[n] = kc
		}
		if len(e) > 1 {
			out = append(out, e)
		}
	}
	return out, checks
}

// authority is the cached Authority named name, if it still names s.
func (s *signerGens) authority(name string) *v1alpha1.Authority {
	if name == "" {
		return nil
	}
	obj, ok, err := s.m.opts.Informer.GetIndexer().GetByKey(name)
	if err != nil || !ok {
		return nil
	}
	a, _ := obj.(*v1alpha1.Authority)
	if a == nil || a.Spec.SignerName != s.name {
		return nil
	}
	return a
}

// wanted reports whether a generation's key must be open: its desired or
// observed phase is Staged, Promoted or Active.
func wanted(phases ...v1alpha1.Phase) bool {
	for _, p := range phases {
		switch p {
		case v1alpha1.PhaseStaged, v1alpha1.PhasePromoted, v1alpha1.PhaseActive:
			return true
		}
	}
	return false
}

// sync brings the open keys and the current generation in line with the
// cached Authority. It returns an error when a key must be opened again
// later.
func (s *signerGens) sync(ctx context.Context) error {
	logger := klog.FromContext(ctx).WithValues("signer", s.name)
	auths, err := client.BySignerName(s.m.opts.Informer, s.name)
	if err != nil {
		return err
	}
	var a *v1alpha1.Authority
	var state error
	switch len(auths) {
	case 0:
		state = fmt.Errorf("%w: signer %s: no Authority (keyward.dev/v1alpha1) names it; create one with keyward ca import (docs/rotation.md)", issuer.ErrUnavailable, s.name)
	case 1:
		a = auths[0]
	default:
		var names []string
		for _, x := range auths {
			names = append(names, x.Name)
		}
		slices.Sort(names)
		state = fmt.Errorf("%w: signer %s: Authorities %s all name it; delete all but one", issuer.ErrUnavailable, s.name, strings.Join(names, " and "))
	}

	// observed is the trust publisher's record, not the status: a status
	// phase is what any holder of authorities/status may write.
	observed := map[string]v1alpha1.Phase{}
	active, claimed := "", ""
	var recErr error
	if a != nil {
		if rec, err := record.Lookup(record.StoreGetter(s.m.opts.Bundles.GetStore()), a); err != nil {
			recErr = err
		} else {
			for _, g := range a.Spec.Generations {
				if p := rec.Phase(g); p != "" {
					observed[g.Name] = p
				}
			}
			active = record.Active(a, rec)
		}
		for _, g := range a.Status.Generations {
			if g.Phase == v1alpha1.PhaseActive {
				claimed = g.Name
			}
		}
	}
	keep := map[string]v1alpha1.Generation{}
	if a != nil {
		for _, g := range a.Spec.Generations {
			if wanted(g.Phase, observed[g.Name]) {
				keep[g.Name] = g
			}
		}
	}
	// Close what is no longer needed, or whose key URI changed.
	for name, k := range s.keys {
		if g, ok := keep[name]; !ok || g.KeyURI != k.keyURI {
			s.drop(name)
		}
	}
	var retry []error
	for _, g := range specOrder(a, keep) {
		k := s.keys[g.Name]
		if k != nil && k.key == nil && k.noRetry {
			// Kept as it is until the key URI changes (dropped above).
		} else if k == nil || k.key == nil {
			k = s.open(ctx, g)
			if k.key == nil && !k.noRetry {
				retry = append(retry, errors.New(k.check.Message))
			}
		} else if k.certPEM != g.CertificatePEM || k.chainPEM != g.ChainPEM {
			nk := *k
			nk.certPEM, nk.chainPEM = g.CertificatePEM, g.ChainPEM
			nk.auth, nk.check = build(g, k.key)
			k = &nk
		}
		s.keysMu.Lock()
		s.keys[g.Name] = k
		s.keysMu.Unlock()
		s.setMetric(g.Name, k)
	}

	snap := &snapshot{}
	if a != nil {
		snap.object = a.Name
	}
	switch {
	case state != nil:
		snap.err = state
	case recErr != nil:
		snap.err = fmt.Errorf("%w: signer %s: reading the trust publisher's record of Authority %s: %v", issuer.ErrUnavailable, s.name, a.Name, recErr)
	case active == "" && claimed != "":
		snap.err = fmt.Errorf("%w: signer %s: the status of Authority %s says generation %s is Active, but the trust publisher's record (annotation %s on ClusterTrustBundles %s and %s) does not; a phase the trust publisher did not move is never signed with (its PhasesTrusted condition says who wrote it)",
			issuer.ErrUnavailable, s.name, a.Name, claimed, record.Annotation, record.BundleName(s.name, v1alpha1.BundleCanary), record.BundleName(s.name, v1alpha1.BundleLive))
	case active == "":
		snap.err = fmt.Errorf("%w: signer %s: no generation of Authority %s is Active (the trust publisher's record); the trust publisher activates one", issuer.ErrUnavailable, s.name, a.Name)
	case s.keys[active] == nil:
		snap.err = fmt.Errorf("%w: signer %s: the Active generation %s of Authority %s is not in its spec", issuer.ErrUnavailable, s.name, active, a.Name)
	case s.keys[active].auth == nil:
		snap.err = fmt.Errorf("%w: signer %s: the Active generation %s cannot issue: %s", issuer.ErrUnavailable, s.name, active, s.keys[active].check.Message)
	default:
		snap.auth, snap.generation = s.keys[active].auth, active
	}
	s.current.Store(snap)
	if msg := describe(snap); msg != s.logged {
		s.logged = msg
		switch {
		case snap.err != nil && active == "" && state == nil && recErr == nil:
			// The normal moment before the trust publisher's first
			// activation (bootstrap) or a spec that asks for none yet: a
			// state to report, not an error. A status Active the record
			// lacks is reported here too: between the trust publisher's
			// bundle write and its status write the two caches may
			// disagree for a moment, and a foreign phase is the trust
			// publisher's to report (Warning Event, PhasesTrusted).
			logger.Info("Signer name issues nothing until a generation is Active; its requests wait", "reason", snap.err.Error())
		case snap.err != nil:
			logger.Error(snap.err, "Signer name issues nothing; its requests wait")
		default:
			logger.Info("Issuing with CA generation", "authority", snap.object, "generation", snap.generation,
				"key", snap.auth.Signer().URI(), "keyVersion", snap.auth.Signer().KeyVersion())
		}
	}

	s.updateChecks(ctx, a, keep)
	if a != nil && s.m.leading.Load() {
		if err := s.writeChecks(ctx, a); err != nil {
			// Logged once per change here (the retry logs at V(2) only):
			// without keyCheck nothing becomes Active, and the other line
			// at default verbosity blames the trust publisher.
			if msg := err.Error(); msg != s.writeLogged {
				s.writeLogged = msg
				hint := "check the signer's RBAC for authorities/status patch"
				if errors.Is(err, client.ErrStaleCRD) {
					hint = "update the Authority CRD (deploy/crds/)"
				}
				logger.Error(err, "Cannot write the signer's status fields of the Authority (keyCheck, lastIssuedNotAfter): no generation can be activated and no reservation recorded until it can; "+hint, "authority", a.Name)
			}
			retry = append(retry, err)
		} else {
			s.writeLogged = ""
		}
	}
	s.mu.Lock()
	if a != nil {
		// What was reserved for a generation gone from spec must not
		// count for a new generation given the same name later.
		inSpec := map[string]bool{}
		for _, g := range a.Spec.Generations {
			inSpec[g.Name] = true
		}
		for n := range s.reserved {
			if !inSpec[n] {
				delete(s.reserved, n)
			}
		}
		for _, g := range a.Status.Generations {
			if inSpec[g.Name] && g.LastIssuedNotAfter != nil && g.LastIssuedNotAfter.After(s.reserved[g.Name]) {
				s.reserved[g.Name] = g.LastIssuedNotAfter.Time
			}
		}
	}
	s.mu.Unlock()
	return errors.Join(retry...)
}

func describe(s *snapshot) string {
	if s.err != nil {
		return s.err.Error()
	}
	return s.object + "/" + s.generation + "/" + s.auth.Signer().KeyVersion()
}

// specOrder lists keep in a's spec order.
func specOrder(a *v1alpha1.Authority, keep map[string]v1alpha1.Generation) []v1alpha1.Generation {
	if a == nil {
		return nil
	}
	var out []v1alpha1.Generation
	for _, g := range a.Spec.Generations {
		if _, ok := keep[g.Name]; ok {
			out = append(out, keep[g.Name])
		}
	}
	return out
}

// open opens g's key (bounded by OpenTimeout) and checks it against g's
// certificate. A key that does not open gives a genKey without key.
func (s *signerGens) open(ctx context.Context, g v1alpha1.Generation) *genKey {
	k := &genKey{keyURI: g.KeyURI, certPEM: g.CertificatePEM, chainPEM: g.ChainPEM}
	octx, cancel := context.WithTimeout(ctx, s.m.opts.OpenTimeout)
	defer cancel()
	key, err := s.m.opts.Open(octx, g.KeyURI)
	if err != nil {
		msg := fmt.Sprintf("opening key %s: %v", uri.RedactURI(g.KeyURI), err)
		if errors.Is(err, backends.ErrLoginRefused) {
			// Every retry would be one more failed login, and HSMs lock
			// the PIN after a few.
			k.noRetry = true
			msg = "not retried (a refused PIN counts toward the token's lockout): fix the pin-source, then restart the signer or change the key URI: " + msg
		}
		k.check = named(v1alpha1.KeyCheck{Message: kubemsg.Truncate(msg, maxKeyCheckMessage)}, g)
		return k
	}
	k.key = key
	k.auth, k.check = build(g, key)
	return k
}

// named is kc naming what was checked: g's keyURI and certificate.
func named(kc v1alpha1.KeyCheck, g v1alpha1.Generation) v1alpha1.KeyCheck {
	kc.KeyURI, kc.CertificateDigest = g.KeyURI, record.CertificateDigest(g)
	return kc
}

// build parses g's certificate and chain and checks them against key.
func build(g v1alpha1.Generation, key backends.Signer) (*authority.Authority, v1alpha1.KeyCheck) {
	auth, kc := check(g, key)
	return auth, named(kc, g)
}

func check(g v1alpha1.Generation, key backends.Signer) (*authority.Authority, v1alpha1.KeyCheck) {
	fail := func(err error) (*authority.Authority, v1alpha1.KeyCheck) {
		return nil, v1alpha1.KeyCheck{KeyVersion: key.KeyVersion(), Message: kubemsg.Truncate(fmt.Sprintf("generation %s: %v", g.Name, err), maxKeyCheckMessage)}
	}
	certs, err := pemcert.Parse([]byte(g.CertificatePEM))
	if err != nil || len(certs) == 0 {
		return fail(fmt.Errorf("certificatePEM holds no certificate (%v)", err))
	}
	chain, err := pemcert.Parse([]byte(g.ChainPEM))
	if err != nil {
		return fail(fmt.Errorf("chainPEM: %w", err))
	}
	chain = append(certs[1:], chain...)
	auth, err := authority.New(certs[0], chain, key)
	if err != nil {
		return fail(err)
	}
	return auth, v1alpha1.KeyCheck{Ready: true, KeyVersion: key.KeyVersion()}
}

// drop forgets a generation's key and closes it after CloseDelay.
func (s *signerGens) drop(name string) {
	s.keysMu.Lock()
	k := s.keys[name]
	delete(s.keys, name)
	s.keysMu.Unlock()
	s.dropMetric(name)
	if k != nil && k.key != nil {
		s.m.closeLater(k.key)
	}
}

func (s *signerGens) setMetric(gen string, k *genKey) {
	if m := s.m.opts.CANotAfter; m != nil {
		if k.auth == nil {
			m.DeleteLabelValues(s.name, gen)
			return
		}
		m.WithLabelValues(s.name, gen).Set(float64(k.auth.Certificate().NotAfter.Unix()))
	}
}

func (s *signerGens) dropMetric(gen string) {
	if m := s.m.opts.CANotAfter; m != nil {
		m.DeleteLabelValues(s.name, gen)
	}
}

// updateChecks sets the keyCheck each kept generation reports; Time moves
// only when the result changes. A change is logged once.
func (s *signerGens) updateChecks(ctx context.Context, a *v1alpha1.Authority, keep map[string]v1alpha1.Generation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for name := range s.checks {
		if _, ok := keep[name]; !ok {
			delete(s.checks, name)
		}
	}
	for name := range keep {
		k := s.keys[name]
		kc := k.check
		old, ok := s.checks[name]
		if ok && sameCheck(old, kc) {
			continue
		}
		now := metav1.NewTime(s.m.opts.Clock.Now().Truncate(time.Second))
		kc.Time = &now
		s.checks[name] = kc
		logger := klog.FromContext(ctx).WithValues("signer", s.name, "authority", a.Name, "generation", name)
		if kc.Ready {
			logger.Info("CA generation key ready", "key", uri.RedactURI(k.keyURI), "keyVersion", kc.KeyVersion)
		} else {
			logger.Info("CA generation key not usable", "message", kc.Message)
		}
	}
}

// writeChecks applies keyCheck when what this replica would report differs
// from both the cached status and what it last wrote.
func (s *signerGens) writeChecks(ctx context.Context, a *v1alpha1.Authority) error {
	s.mu.Lock()
	want := maps.Clone(s.checks)
	s.mu.Unlock()
	cached := map[string]v1alpha1.KeyCheck{}
	for _, g := range a.Status.Generations {
		if g.KeyCheck != nil {
			cached[g.Name] = *g.KeyCheck
		}
	}
	s.wmu.Lock()
	same := sameChecks(want, cached) || sameChecks(want, s.written)
	s.wmu.Unlock()
	if same {
		return nil
	}
	return s.write(ctx, nil)
}

// sameChecks compares keyChecks without their Time.
func sameChecks(a, b map[string]v1alpha1.KeyCheck) bool {
	if len(a) != len(b) {
		return false
	}
	for n, x := range a {
		y, ok := b[n]
		if !ok || !sameCheck(x, y) {
			return false
		}
	}
	return true
}

// sameCheck compares two keyChecks without their Time.
func sameCheck(x, y v1alpha1.KeyCheck) bool {
	return x.Ready == y.Ready && x.Message == y.Message && x.KeyVersion == y.KeyVersion && x.KeyURI == y.KeyURI && x.CertificateDigest == y.CertificateDigest
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func ceilSecond(t time.Time) time.Time {
	if r := t.Truncate(time.Second); r.Before(t) {
		return r.Add(time.Second)
	}
	return t
}

// maxKeyCheckMessage is the CRD's limit on a keyCheck message.
const maxKeyCheckMessage = 1024
