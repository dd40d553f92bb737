package trust

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	testingclock "k8s.io/utils/clock/testing"
)

const testSigner = "keyward.dev/pods"

func signerBundle(name, version, bundle string) *certv1.ClusterTrustBundle {
	return &certv1.ClusterTrustBundle{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"keyward.dev/cluster-trust-bundle-version": version}},
		Spec:       certv1.ClusterTrustBundleSpec{SignerName: testSigner, TrustBundle: bundle},
	}
}

// outcomes collects a projector's passes; next waits for one that matches.
type outcomes struct {
	ch chan Outcome
}

func newOutcomes() *outcomes { return &outcomes{ch: make(chan Outcome, 1000)} }

func (o *outcomes) synced(out Outcome) { o.ch <- out }

func (o *outcomes) next(t *testing.T, what string, match func(Outcome) bool) Outcome {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case out := <-o.ch:
			if match(out) {
				return out
			}
		case <-timeout:
			t.Fatalf("no pass with %s", what)
		}
	}
}

func manyPEM(t *testing.T, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(pemOf(testCert(t, "c"+string(rune('a'+i%26))), nil))
	}
	return b.String()
}

// Anyone with attest on the signer name may create <signer>:attacker with
// the live label: the projection merges keyward's <signer>:live only, and
// names the one it left out; an additional name merges it.
func TestOnlyKeywardsBundleNamesAreMerged(t *testing.T) {
	live, evil := pemOf(testCert(t, "live"), nil), pemOf(testCert(t, "attacker"), nil)
	tests := []struct {
		name        string
		additional  []string
		want        string
		wantIgnored []string
	}{
		{name: "by default the attacker's bundle is ignored", want: live, wantIgnored: []string{"keyward.dev:pods:attacker"}},
		{name: "a bundle named in AdditionalBundleNames is merged", additional: []string{"keyward.dev:pods:attacker"}, want: live + evil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBE_FEATURE_WatchListClient", "false")
			client := fake.NewClientset(signerBundle("keyward.dev:pods:live", "live", live), signerBundle("keyward.dev:pods:attacker", "live", evil),
				signerBundle("keyward.dev:pods:canary", "canary", evil))
			got := newOutcomes()
			runProjector(t, Options{Client: client, SignerName: testSigner, AdditionalBundleNames: tc.additional,
				Dir: filepath.Join(t.TempDir(), "trust"), Synced: got.synced})
			o := got.next(t, "the file written", func(o Outcome) bool { return o.Written })
			if !bytes.Equal(o.Data, Merge([]byte(tc.want))) {
				t.Errorf("trust file holds %d certificates, want %d", bytes.Count(o.Data, []byte("BEGIN")), strings.Count(tc.want, "BEGIN"))
			}
			if strings.Join(o.Ignored, ",") != strings.Join(tc.wantIgnored, ",") {
				t.Errorf("ignored %v, want %v", o.Ignored, tc.wantIgnored)
			}
		})
	}
}

func TestAdditionalBundleNamesMustCarryTheSignersPrefix(t *testing.T) {
	_, err := New(Options{Client: fake.NewClientset(), SignerName: testSigner, Dir: "/d", AdditionalBundleNames: []string{"other:attacker"}})
	if err == nil || !strings.Contains(err.Error(), `"keyward.dev:pods:"`) {
		t.Fatalf("got %v, want a refusal naming the prefix", err)
	}
}

// A selection over a cap leaves the last good file in place and says which
// cap; within the caps again, the file follows.
func TestCapsKeepTheLastGoodFile(t *testing.T) {
	ok := pemOf(testCert(t, "ok"), nil)
	tests := []struct {
		name      string
		opts      Options
		tooMuch   string
		wantLimit string
	}{
		{name: "more certificates than MaxCertificates", opts: Options{MaxCertificates: 3}, tooMuch: manyPEM(t, 4), wantLimit: "maxCertificates"},
		{name: "more certificates than the default cap", tooMuch: manyPEM(t, DefaultMaxCertificates+1), wantLimit: "maxCertificates"},
		{name: "more bytes than MaxBytes", opts: Options{MaxBytes: 1500}, tooMuch: manyPEM(t, 4), wantLimit: "maxBytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("KUBE_FEATURE_WatchListClient", "false")
			client := fake.NewClientset(signerBundle("keyward.dev:pods:live", "live", ok))
			got := newOutcomes()
			opts := tc.opts
			opts.Client, opts.SignerName, opts.Dir, opts.Synced = client, testSigner, filepath.Join(t.TempDir(), "trust"), got.synced
			runProjector(t, opts)
			got.next(t, "the first write", func(o Outcome) bool { return o.Written })

			update(t, client, "keyward.dev:pods:live", tc.tooMuch)
			o := got.next(t, "the cap broken", func(o Outcome) bool { return o.OverLimit != "" || o.Written })
			if o.Written || !strings.Contains(o.OverLimit, tc.wantLimit) {
				t.Fatalf("got %+v, want the file kept and %s named", o, tc.wantLimit)
			}
			if data, err := os.ReadFile(filepath.Join(opts.Dir, DefaultFileName)); err != nil || !bytes.Equal(data, Merge([]byte(ok))) {
				t.Fatalf("over the cap the file holds %q (%v), want the last good file", data, err)
			}
			update(t, client, "keyward.dev:pods:live", ok+pemOf(testCert(t, "next"), nil))
			got.next(t, "the file written again", func(o Outcome) bool { return o.Written })
		})
	}
}

func update(t *testing.T, client *fake.Clientset, name, bundle string) {
	t.Helper()
	c := client.CertificatesV1().ClusterTrustBundles()
	ctb, err := c.Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ctb.Spec.TrustBundle = bundle
	if _, err := c.Update(context.Background(), ctb, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// 31 edits of the bundle within the debounce make 31 writes and one hook
// run, after the debounce, with the last content; an edit after that run
// gets a run of its own, not before the debounce has passed again.
func TestHookRunsOncePerDebounceWithTheLastContent(t *testing.T) {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	const debounce = time.Minute
	clk := testingclock.NewFakeClock(time.Now())
	first := pemOf(testCert(t, "first"), nil)
	client := fake.NewClientset(signerBundle("keyward.dev:pods:live", "live", first))
	dir := filepath.Join(t.TempDir(), "trust")
	var runs atomic.Int32
	var mu sync.Mutex
	var hooked []byte
	got := newOutcomes()
	runProjector(t, Options{Client: client, SignerName: testSigner, Dir: dir, Clock: clk, OnChangeDebounce: debounce, Synced: got.synced,
		OnChange: func(context.Context) error {
			data, err := os.ReadFile(filepath.Join(dir, DefaultFileName))
			mu.Lock()
			hooked = data
			mu.Unlock()
			runs.Add(1)
			return err
		}})
	got.next(t, "the first write", func(o Outcome) bool { return o.Written })
	var last string
	for i := range 31 {
		last = first + pemOf(testCert(t, "edit"), nil)
		update(t, client, "keyward.dev:pods:live", last)
		got.next(t, "edit written", func(o Outcome) bool { return o.Written && bytes.Equal(o.Data, Merge([]byte(last))) })
		clk.Step(debounce / 64) // 31 edits take less than the debounce
		if n := runs.Load(); n != 0 {
			t.Fatalf("the hook ran %d times by edit %d, before the debounce passed", n, i+1)
		}
	}
	clk.Step(debounce - 31*(debounce/64))
	waitRuns(t, &runs, 1)
	mu.Lock()
	if !bytes.Equal(hooked, Merge([]byte(last))) {
		t.Errorf("the hook saw %q, want the last edit", hooked)
	}
	mu.Unlock()

	final := first + pemOf(testCert(t, "after"), nil)
	update(t, client, "keyward.dev:pods:live", final)
	got.next(t, "edit written", func(o Outcome) bool { return o.Written && bytes.Equal(o.Data, Merge([]byte(final))) })
	waitTimer(t, clk)
	clk.Step(debounce - time.Second)
	time.Sleep(50 * time.Millisecond) // room for a premature run (none may come)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the hook ran %d times before the second debounce passed, want 1", n)
	}
	clk.Step(time.Second)
	waitRuns(t, &runs, 2)
}

func waitRuns(t *testing.T, runs *atomic.Int32, want int32) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); runs.Load() < want; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the hook ran %d times, want %d", runs.Load(), want)
		}
	}
	time.Sleep(50 * time.Millisecond) // room for an extra run (none may come)
	if n := runs.Load(); n != want {
		t.Fatalf("the hook ran %d times, want %d", n, want)
	}
}

func waitTimer(t *testing.T, clk *testingclock.FakeClock) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !clk.HasWaiters(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the projector set no timer for the hook")
		}
	}
}

// A projector stopped while a hook run is due runs it before Run returns:
// the written change is not left without its hook.
func TestStoppingWithAHookDueRunsIt(t *testing.T) {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false")
	client := fake.NewClientset(signerBundle("keyward.dev:pods:live", "live", pemOf(testCert(t, "a"), nil)))
	var runs atomic.Int32
	got := newOutcomes()
	cancel, wait := runProjector(t, Options{Client: client, SignerName: testSigner, Dir: filepath.Join(t.TempDir(), "trust"),
		Clock: testingclock.NewFakeClock(time.Now()), Synced: got.synced,
		OnChange: func(context.Context) error { runs.Add(1); return nil }})
	got.next(t, "the first write", func(o Outcome) bool { return o.Written })
	if n := runs.Load(); n != 0 {
		t.Fatalf("the hook ran %d times before the debounce", n)
	}
	cancel()
	if err := wait(); err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("the hook ran %d times after the projector stopped with a run due, want 1", n)
	}
}
