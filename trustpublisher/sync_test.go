package trustpublisher

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
)

func (h *harness) annotate(value string) {
	h.t.Helper()
	a := h.authority()
	a.Annotations = map[string]string{v1alpha1.OverrideAnnotation: value}
	if err := h.w.store.Update(a); err != nil {
		h.t.Fatal(err)
	}
}

func (h *harness) condition(typ string) *metav1.Condition {
	return meta.FindStatusCondition(h.authority().Status.Conditions, typ)
}

// Overrides that cannot be used are removed, each with a Warning Event
// saying why, and move nothing.
func TestUnusableOverridesAreRemovedWithAnEvent(t *testing.T) {
	cases := []struct {
		name, value, reason string
	}{
		{"an override for a phase spec no longer asks for", `{"reason":"r","generations":{"new":"Active"}}`, EventOverrideStale},
		{"an override for a generation not in spec", `{"reason":"r","generations":{"ghost":"Promoted"}}`, EventOverrideStale},
		{"an override without a reason", `{"generations":{"new":"Promoted"}}`, EventOverrideInvalid},
		{"an override that is not JSON", `promote it`, EventOverrideInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, _, next := bootstrapped(t)
			addNew(a, next, v1alpha1.PhaseStaged)
			h := newHarness(t, a)
			h.settle()
			h.setSpecPhase("new", v1alpha1.PhasePromoted)
			h.annotate(tc.value)
			h.settle()
			if _, ok := h.authority().Annotations[v1alpha1.OverrideAnnotation]; ok {
				t.Fatal("the annotation is still there")
			}
			if e := h.event(tc.reason); !strings.Contains(e, corev1.EventTypeWarning) {
				t.Fatalf("no Warning %s Event", tc.reason)
			}
			if h.phase("new") != v1alpha1.PhaseStaged {
				t.Fatalf("new = %s, want still Staged", h.phase("new"))
			}
		})
	}
}

// An override held by a gate no override skips (the key is not ready)
// stays until the generation can move.
func TestOverrideWaitsForAReadyKey(t *testing.T) {
	a, _, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhasePromoted)
	h := newHarness(t, a)
	h.settle()
	h.clock.Step(2 * time.Minute)
	h.settle()
	h.setSpecPhase("new", v1alpha1.PhaseActive)
	h.setSpecPhase("old", v1alpha1.PhasePromoted)
	h.annotate(`{"reason":"r","generations":{"new":"Active"}}`)
	h.settle()
	if _, ok := h.authority().Annotations[v1alpha1.OverrideAnnotation]; !ok || h.phase("new") != v1alpha1.PhasePromoted {
		t.Fatalf("annotation present=%v new=%s: want kept, new held by KeyNotReady", ok, h.phase("new"))
	}
	h.keyReady("new")
	h.settle()
	if _, ok := h.authority().Annotations[v1alpha1.OverrideAnnotation]; ok || h.phase("new") != v1alpha1.PhaseActive {
		t.Fatalf("annotation present=%v new=%s: want removed, new Active", ok, h.phase("new"))
	}
}

// A cache that has not yet seen the controller's own write is not acted
// on: an override is reported once, not once per stale look.
func TestStaleCacheAfterOwnWriteIsNotActedOn(t *testing.T) {
	a, _, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhaseStaged)
	h := newHarness(t, a)
	h.settle()
	h.setSpecPhase("new", v1alpha1.PhasePromoted)
	h.annotate(`{"reason":"r","generations":{"new":"Promoted"}}`)
	stale := h.authority()
	if err := h.sync(); err != nil {
		t.Fatal(err)
	}
	if h.event(EventGateOverridden) == "" {
		t.Fatal("no GateOverridden Event")
	}
	// The watch has not delivered the write yet.
	if err := h.w.store.Update(stale); err != nil {
		t.Fatal(err)
	}
	applies := h.w.applies
	if err := h.sync(); err != nil {
		t.Fatal(err)
	}
	if e := h.event(EventGateOverridden); e != "" || h.w.applies != applies {
		t.Fatalf("acted on a stale cache: event %q, %d writes", e, h.w.applies-applies)
	}
}

// Two Authorities for one signer: both get gate Conflict, nothing is
// published.
func TestTwoAuthoritiesForOneSignerPublishNothing(t *testing.T) {
	a, _, _ := bootstrapped(t)
	h := newHarness(t, a)
	twin := a.DeepCopy()
	twin.Name = "twin"
	if err := h.w.store.Add(twin); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"example", "twin"} {
		if err := h.c.sync(t.Context(), name); err != nil {
			t.Fatal(err)
		}
		got := h.w.get(name)
		if len(got.Status.Generations) != 1 || got.Status.Generations[0].Gate != v1alpha1.GateConflict || got.Status.Generations[0].Phase != "" {
			t.Fatalf("%s: %+v, want gate Conflict and no phase", name, got.Status.Generations)
		}
	}
	for _, act := range h.cs.Actions() {
		if act.GetResource().Resource == "clustertrustbundles" {
			t.Fatalf("a %s of ClusterTrustBundles during a conflict", act.GetVerb())
		}
	}
}

// An Authority for a signer name the process does not serve is not
// touched.
func TestAuthorityOfAnotherSignerIsIgnored(t *testing.T) {
	a, _, _ := bootstrapped(t)
	h := newHarness(t, a)
	h.c.signers = map[string]bool{"example.com/other": true}
	for range 2 {
		if err := h.sync(); err != nil {
			t.Fatal(err)
		}
	}
	if h.w.applies != 0 || len(h.cs.Actions()) != 2 { // the harness's own Lists
		t.Fatalf("%d status writes and %d API calls for a foreign signer", h.w.applies, len(h.cs.Actions())-2)
	}
}

// Without attest the write is refused: BundlesPublished=False names the
// missing grant, the sync fails (retried with backoff), and syncing again
// writes no status.
func TestMissingAttestIsNamedAndNotLooped(t *testing.T) {
	a, _, _ := bootstrapped(t)
	h := newHarness(t, a)
	h.cs.PrependReactor("patch", "clustertrustbundles", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "certificates.k8s.io", Resource: "clustertrustbundles"}, "example.com:workload:canary", errors.New("user not permitted to attest for signerName"))
	})
	h.cs.PrependReactor("create", "selfsubjectaccessreviews", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, &authzv1.SelfSubjectAccessReview{Status: authzv1.SubjectAccessReviewStatus{Allowed: false}}, nil
	})
	err := h.sync()
	var reported reportedError
	if !errors.As(err, &reported) || !apierrors.IsForbidden(err) {
		t.Fatalf("sync = %v, want a reported Forbidden error", err)
	}
	for range 2 {
		_ = h.sync()
	}
	applies := h.w.applies
	for range 3 {
		if err := h.sync(); !apierrors.IsForbidden(err) {
			t.Fatalf("sync = %v, want Forbidden", err)
		}
	}
	if h.w.applies != applies {
		t.Fatalf("%d status writes while the grant stays missing, want 0", h.w.applies-applies)
	}
	c := h.condition(v1alpha1.ConditionBundlesPublished)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonAttestForbidden {
		t.Fatalf("BundlesPublished = %+v, want False/%s", c, ReasonAttestForbidden)
	}
	if !strings.Contains(c.Message, "attest") || !strings.Contains(c.Message, "signers/example.com/workload") || !strings.Contains(c.Message, "example.com:workload:") {
		t.Fatalf("message %q does not name the grant (attest on signers/example.com/workload) and the bundle", c.Message)
	}
}

// Ready pods falling below the count at soak start hold the soak.
func TestReadyPodsDropHoldsTheSoak(t *testing.T) {
	a, _, next := bootstrapped(t)
	a.Spec.Gates.CanaryHealth = &v1alpha1.CanaryHealth{Pods: &v1alpha1.PodHealth{Namespace: "canary", Selector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "canary"}}}}
	addNew(a, next, v1alpha1.PhasePromoted)
	h := newHarness(t, a)
	pod := func(name string, ready corev1.ConditionStatus) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "canary", Labels: map[string]string{"app": "canary"}},
			Status: corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: ready}}}}
	}
	for _, p := range []*corev1.Pod{pod("a", corev1.ConditionTrue), pod("b", corev1.ConditionTrue), pod("c", corev1.ConditionFalse)} {
		if _, err := h.cs.CoreV1().Pods("canary").Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	h.settle()
	g := h.authority().Status.Generations[1]
	if g.Phase != v1alpha1.PhaseStaged || g.ReadyPodsAtSoakStart == nil || *g.ReadyPodsAtSoakStart != 2 {
		t.Fatalf("staged: %+v, want readyPodsAtSoakStart 2", g)
	}
	if _, err := h.cs.CoreV1().Pods("canary").UpdateStatus(t.Context(), pod("b", corev1.ConditionFalse), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	h.clock.Step(2 * time.Minute) // past the soak, and the check interval
	h.settle()
	c := h.condition(v1alpha1.ConditionCanaryHealthy)
	if g := h.authority().Status.Generations[1]; g.Phase != v1alpha1.PhaseStaged || g.Gate != v1alpha1.GateCanaryHealth || c.Reason != ReasonReadyPodsDropped {
		t.Fatalf("after a pod lost readiness: %+v, CanaryHealthy %+v", g, c)
	}
}

func TestMetricsReportPhasesGatesAndExpiry(t *testing.T) {
	a, old, next := bootstrapped(t)
	addNew(a, next, v1alpha1.PhasePromoted)
	h := newHarness(t, a)
	reg := prometheus.NewRegistry()
	m, err := newMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	h.c.metrics = m
	h.settle()
	cases := []struct {
		name string
		got  float64
		want float64
	}{
		{"old is Active", gauge(t, m.phase.WithLabelValues("example.com/workload", "old", "Active")), 1},
		{"old is not Staged", gauge(t, m.phase.WithLabelValues("example.com/workload", "old", "Staged")), 0},
		{"new is Staged", gauge(t, m.phase.WithLabelValues("example.com/workload", "new", "Staged")), 1},
		{"the soak opens in a minute", gauge(t, m.gateSeconds.WithLabelValues("example.com/workload", "new", v1alpha1.GateCanarySoak)), 60},
		{"old's CA notAfter", gauge(t, m.caNotAfter.WithLabelValues("example.com/workload", "old")), float64(old.cert.NotAfter.Unix())},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
	h.c.forget("example")
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if len(f.Metric) > 0 {
			t.Fatalf("%d series of %s left after the Authority was deleted", len(f.Metric), f.GetName())
		}
	}
}

func gauge(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// A bundle with no member is not created, and is deleted when its last
// member leaves (the apiserver refuses an empty one).
func TestEmptyBundleIsDeleted(t *testing.T) {
	ca := rootCA(t, "lonely")
	f := newFixture(time.Minute, 30*time.Second)
	f.gen("g", ca, v1alpha1.PhaseStaged, "", time.Time{})
	h := newHarness(t, f.a)
	h.settle()
	if h.bundle("canary") != ca.pem || h.bundle("live") != "" {
		t.Fatalf("staged: canary=%q live=%q, want only canary", h.bundle("canary"), h.bundle("live"))
	}
	h.setSpecPhase("g", v1alpha1.PhaseRetired)
	h.settle()
	if h.phase("g") != v1alpha1.PhaseRetired {
		t.Fatalf("g = %s, want Retired", h.phase("g"))
	}
	if _, err := h.cs.CertificatesV1().ClusterTrustBundles().Get(t.Context(), BundleName("example.com/workload", "canary"), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("canary bundle after its last member left: %v, want NotFound", err)
	}
	if !meta.IsStatusConditionTrue(h.authority().Status.Conditions, v1alpha1.ConditionBundlesPublished) {
		t.Fatalf("BundlesPublished not True: %+v", h.condition(v1alpha1.ConditionBundlesPublished))
	}
}

// New may be called again on the same registry (a new leadership term).
func TestNewTwiceOnOneRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if _, err := newMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
}
