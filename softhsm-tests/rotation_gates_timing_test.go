package softhsmtests

import (
	"bytes"
	"context"
	"encoding/pem"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/backends/all"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/pcr"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/tools/cache"
)

// nodeTimeline is what one node sees of a signer's ClusterTrustBundles,
// through its own watch as system:node:<name> (as kubelet's
// ClusterTrustBundle manager does), with the moment each event arrived;
// and, through an admin watch of the Authority, when status first showed
// each generation in each phase.
type nodeTimeline struct {
	mu sync.Mutex
	// bundles[version]: the roots (DER) of each state of the bundle, in
	// the order the watch delivered them.
	bundles map[string][]rootsAt
	phases  map[string]time.Time // "gen/Phase" → first seen
}

type rootsAt struct {
	at    time.Time
	roots [][]byte
}

func watchAsNode(t *testing.T, ctx context.Context, node, signer string, ac *authclient.Client) *nodeTimeline {
	t.Helper()
	tl := &nodeTimeline{bundles: map[string][]rootsAt{}, phases: map[string]time.Time{}}
	factory := informers.NewSharedInformerFactoryWithOptions(nodeClient(t, node), 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.signerName", signer).String()
	}))
	record := func(obj any, deleted bool) {
		now := time.Now()
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		b, ok := obj.(*certv1.ClusterTrustBundle)
		if !ok {
			return
		}
		version := b.Labels[kwv1alpha1.BundleVersionLabel("keyward.dev")]
		var roots [][]byte
		if !deleted {
			rest := []byte(b.Spec.TrustBundle)
			for {
				var blk *pem.Block
				if blk, rest = pem.Decode(rest); blk == nil {
					break
				}
				roots = append(roots, blk.Bytes)
			}
		}
		tl.mu.Lock()
		tl.bundles[version] = append(tl.bundles[version], rootsAt{at: now, roots: roots})
		tl.mu.Unlock()
	}
	inf := factory.Certificates().V1().ClusterTrustBundles().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { record(obj, false) },
		UpdateFunc: func(_, obj any) { record(obj, false) },
		DeleteFunc: func(obj any) { record(obj, true) },
	}); err != nil {
		t.Fatal(err)
	}
	auths := authclient.NewInformer(ac, 0)
	phase := func(obj any) {
		now := time.Now()
		a, ok := obj.(*kwv1alpha1.Authority)
		if !ok || a.Spec.SignerName != signer {
			return
		}
		tl.mu.Lock()
		defer tl.mu.Unlock()
		for _, g := range a.Status.Generations {
			key := g.Name + "/" + string(g.Phase)
			if _, ok := tl.phases[key]; !ok && g.Phase != "" {
				tl.phases[key] = now
			}
		}
	}
	if _, err := auths.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    phase,
		UpdateFunc: func(_, obj any) { phase(obj) },
	}); err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	go auths.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced, auths.HasSynced) {
		t.Fatalf("the node's ClusterTrustBundle watch (as system:node:%s) never synced", node)
	}
	return tl
}

func has(roots [][]byte, root []byte) bool {
	for _, r := range roots {
		if bytes.Equal(r, root) {
			return true
		}
	}
	return false
}

// entered is when the node first saw root in version's bundle.
func (tl *nodeTimeline) entered(version string, root []byte) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, s := range tl.bundles[version] {
		if has(s.roots, root) {
			return s.at, true
		}
	}
	return time.Time{}, false
}

// left is when the node first saw version's bundle without root, after
// having seen it with.
func (tl *nodeTimeline) left(version string, root []byte) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	in := false
	for _, s := range tl.bundles[version] {
		switch h := has(s.roots, root); {
		case h:
			in = true
		case in:
			return s.at, true
		}
	}
	return time.Time{}, false
}

func (tl *nodeTimeline) phase(gen string, p kwv1alpha1.Phase) (time.Time, bool) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	at, ok := tl.phases[gen+"/"+string(p)]
	return at, ok
}

// Run after run, every rotation gate holds at least its configured time
// as a node sees the bundles through its own watch: a root sits in canary
// for canarySoak before it reaches live; the new generation becomes
// Active propagationWindow after its root reached live; the old root
// leaves live canarySoak after it left canary. Only lower bounds are
// asserted (a loaded machine only makes the intervals longer, apart from
// watch delivery, which both ends of each interval share).
func TestRotationGatesHoldAsANodeSeesThem(t *testing.T) {
	const soak, window, runs = 2 * time.Second, time.Second, 3
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	r := newE2ERotation(t, ctx, "gatetime")
	r.soak = soak // caInit sets e2eWindow (1s) as the propagation window
	if e2eWindow != window {
		t.Fatalf("e2eWindow is %s; this test's numbers assume %s", e2eWindow, window)
	}
	startSigner(t, r.signerConfig(), "replica-0", pcr.V1, all.Options{})
	keyPrefix := strings.TrimPrefix(r.signer, "keyward.dev/")
	r.caInit("g0", tokenKeyURI(keyPrefix+"-g0"), "--subject", "CN=gate timing root 0")
	r.waitPhases("g0 Active by bootstrap", map[string]kwv1alpha1.Phase{"g0": kwv1alpha1.PhaseActive})
	tl := watchAsNode(t, ctx, uniqueName(t, "node"), r.signer, r.c)

	var failures []string
	for run := 1; run <= runs; run++ {
		prev, gen := fmt.Sprintf("g%d", run-1), fmt.Sprintf("g%d", run)
		r.caInit(gen, tokenKeyURI(keyPrefix+"-"+gen), "--subject", "CN=gate timing root "+gen[1:])
		// The whole rotation declared at once: the controller alone
		// times every step.
		r.edit(func(a *kwv1alpha1.Authority) {
			for i := range a.Spec.Generations {
				switch a.Spec.Generations[i].Name {
				case gen:
					a.Spec.Generations[i].Phase = kwv1alpha1.PhaseActive
				case prev:
					a.Spec.Generations[i].Phase = kwv1alpha1.PhaseRetired
				}
			}
		})
		r.waitPhases(gen+" Active, "+prev+" Retired", map[string]kwv1alpha1.Phase{gen: kwv1alpha1.PhaseActive, prev: kwv1alpha1.PhaseRetired})
		newRoot, oldRoot := r.ca(gen).root.Raw, r.ca(prev).root.Raw
		// The node's watch may deliver the last change a moment after
		// status shows it.
		var canaryIn, liveIn, active, canaryOut, liveOut time.Time
		deadline := time.Now().Add(20 * time.Second)
		for {
			var ok [5]bool
			canaryIn, ok[0] = tl.entered(kwv1alpha1.BundleCanary, newRoot)
			liveIn, ok[1] = tl.entered(kwv1alpha1.BundleLive, newRoot)
			active, ok[2] = tl.phase(gen, kwv1alpha1.PhaseActive)
			canaryOut, ok[3] = tl.left(kwv1alpha1.BundleCanary, oldRoot)
			liveOut, ok[4] = tl.left(kwv1alpha1.BundleLive, oldRoot)
			if ok == [5]bool{true, true, true, true, true} {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("run %d: the node never saw every step (canary in, live in, Active, canary out, live out: %v)", run, ok)
			}
			time.Sleep(50 * time.Millisecond)
		}
		for _, c := range []struct {
			what     string
			from, to time.Time
			least    time.Duration
		}{
			{"new root in canary before live (canarySoak)", canaryIn, liveIn, soak},
			{"new root in live before its generation is Active (propagationWindow)", liveIn, active, window},
			{"old root out of canary before it left live (canarySoak)", canaryOut, liveOut, soak},
		} {
			got := c.to.Sub(c.from)
			t.Logf("run %d, %s: %s (configured %s)", run, c.what, got.Round(time.Millisecond), c.least)
			if got < c.least {
				failures = append(failures, fmt.Sprintf("run %d, %s: %s, want at least %s", run, c.what, got.Round(time.Millisecond), c.least))
			}
		}
	}
	for _, f := range failures {
		t.Error(f)
	}
}
