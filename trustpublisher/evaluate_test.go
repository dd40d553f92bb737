package trustpublisher

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	phaserecord "github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

// newCA makes a CA certificate valid over [from, to), signed by parent (a
// self-signed root when parent is nil).
func newCA(t *testing.T, cn string, parent *testCA, from, to time.Time) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: from, NotAfter: to, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	issuer, signer := tmpl, key
	if parent != nil {
		issuer, signer = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, issuer, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))}
}

func rootCA(t *testing.T, cn string) *testCA {
	return newCA(t, cn, nil, t0.Add(-24*time.Hour), t0.Add(365*24*time.Hour))
}

// fixture builds Authorities for the tests.
type fixture struct {
	a *v1alpha1.Authority
}

func newFixture(soak, window time.Duration) *fixture {
	return &fixture{a: &v1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: "example"},
		Spec: v1alpha1.AuthoritySpec{SignerName: "example.com/workload", TrustBundleLabelDomain: "keyward.dev",
			Gates: v1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: soak}, PropagationWindow: &metav1.Duration{Duration: window}}},
	}}
}

// gen adds a generation desired at phase, observed at observed since since
// (observed "" leaves it out of status).
func (f *fixture) gen(name string, ca *testCA, desired, observed v1alpha1.Phase, since time.Time) *fixture {
	f.a.Spec.Generations = append(f.a.Spec.Generations, v1alpha1.Generation{Name: name, KeyURI: "file:/" + name, CertificatePEM: ca.pem, Phase: desired})
	if observed != "" {
		s := metav1.NewTime(since)
		f.a.Status.Generations = append(f.a.Status.Generations, v1alpha1.GenerationStatus{Name: name, Phase: observed, Since: &s})
	}
	return f
}

func (f *fixture) status(name string) *v1alpha1.GenerationStatus {
	for i := range f.a.Status.Generations {
		if f.a.Status.Generations[i].Name == name {
			return &f.a.Status.Generations[i]
		}
	}
	f.a.Status.Generations = append(f.a.Status.Generations, v1alpha1.GenerationStatus{Name: name})
	return &f.a.Status.Generations[len(f.a.Status.Generations)-1]
}

func (f *fixture) keyReady(name string) *fixture {
	f.status(name).KeyCheck = readyCheck(f.a, name)
	return f
}

func (f *fixture) issuedUntil(name string, t time.Time) *fixture {
	f.status(name).LastIssuedNotAfter = &metav1.Time{Time: t}
	return f
}

// published records both bundles as holding what the observed phases put
// in them, last changed at changed.
func (f *fixture) published(changed time.Time) *fixture {
	canary, live := BundleContents(f.a)
	ct := metav1.NewTime(changed)
	f.a.Status.Bundles = []v1alpha1.BundleStatus{
		{Version: v1alpha1.BundleCanary, Digest: BundleDigest(canary), Published: true, LastChangeTime: &ct},
		{Version: v1alpha1.BundleLive, Digest: BundleDigest(live), Published: true, LastChangeTime: &ct},
	}
	return f
}

func (f *fixture) health(ok bool, since time.Time) *fixture {
	f.a.Spec.Gates.CanaryHealth = &v1alpha1.CanaryHealth{URL: "http://canary.example/healthz"}
	st := metav1.ConditionFalse
	if ok {
		st = metav1.ConditionTrue
	}
	f.a.Status.Conditions = append(f.a.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionCanaryHealthy, Status: st,
		Reason: "Checked", Message: "GET answered 503", LastTransitionTime: metav1.NewTime(since)})
	return f
}

func (f *fixture) override(reason string, gens map[string]v1alpha1.Phase) *fixture {
	b, _ := json.Marshal(v1alpha1.Override{Reason: reason, Generations: gens})
	f.a.Annotations = map[string]string{v1alpha1.OverrideAnnotation: string(b)}
	return f
}

func TestEvaluate(t *testing.T) {
	old, next := rootCA(t, "old root"), rootCA(t, "new root")
	const soak, window = time.Hour, 5 * time.Minute
	type want struct {
		gen     string
		next    v1alpha1.Phase
		gate    string
		opensAt time.Time
		message string // a substring
		forced  bool
	}
	cases := []struct {
		name string
		f    *fixture
		now  time.Time
		want []want
	}{{
		name: "a new generation is staged at once",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhaseStaged, "", t0).published(t0.Add(-48 * time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseActive}, {gen: "b", next: v1alpha1.PhaseStaged}},
	}, {
		name: "a staged generation waits out the canary soak, with the numbers named",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-20*time.Minute)).published(t0.Add(-20 * time.Minute)),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GateCanarySoak, opensAt: t0.Add(40 * time.Minute), message: "canary soak 20m0s of 1h0m0s"}},
	}, {
		name: "a soaked generation still waits out the propagation window of a later bundle change",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-2*time.Hour)).published(t0.Add(-2 * time.Minute)),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GatePropagationWindow, opensAt: t0.Add(3 * time.Minute)}},
	}, {
		name: "a soaked generation is promoted once the window has passed",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseStaged, t0.Add(-2*time.Hour)).published(t0.Add(-2 * time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseActive}, {gen: "b", next: v1alpha1.PhasePromoted}},
	}, {
		name: "a bundle not yet published holds the next step",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-2*time.Hour)),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GateBundleNotPublished, message: "canary bundle does not hold"}},
	}, {
		name: "activation waits for the signer to report the key ready",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhasePromoted, t0.Add(-time.Hour)).published(t0.Add(-time.Hour)),
		now: t0,
		want: []want{{gen: "b", next: v1alpha1.PhasePromoted, gate: v1alpha1.GateKeyNotReady},
			{gen: "a", next: v1alpha1.PhaseActive, gate: v1alpha1.GateKeyNotReady, message: "stays Active until b becomes Active"}},
	}, {
		name: "activation of one generation moves the Active one back to Promoted in the same step",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhasePromoted, t0.Add(-time.Hour)).keyReady("b").published(t0.Add(-time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhasePromoted}, {gen: "b", next: v1alpha1.PhaseActive}},
	}, {
		name: "the Active generation does not leave Active without a successor",
		f:    newFixture(soak, window).gen("a", old, v1alpha1.PhaseRetiring, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").published(t0.Add(-48 * time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseActive, gate: v1alpha1.GateNoSuccessor}},
	}, {
		name: "an old root leaves the canary bundle only after its last leaf has expired",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseRetiring, v1alpha1.PhasePromoted, t0.Add(-time.Hour)).issuedUntil("a", t0.Add(23*time.Hour)).
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-time.Hour)).keyReady("b").published(t0.Add(-2 * time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhasePromoted, gate: v1alpha1.GateLeavesValid, opensAt: t0.Add(23 * time.Hour), message: "valid until 2026-11-24T11:00:00Z"}},
	}, {
		name: "an old root whose leaves have expired starts retiring",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseRetired, v1alpha1.PhasePromoted, t0.Add(-25*time.Hour)).issuedUntil("a", t0.Add(-time.Minute)).
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-25*time.Hour)).keyReady("b").published(t0.Add(-25 * time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseRetiring}},
	}, {
		name: "a retiring root leaves the live bundle after another canary soak",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseRetired, v1alpha1.PhaseRetiring, t0.Add(-30*time.Minute)).
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-25*time.Hour)).keyReady("b").published(t0.Add(-30 * time.Minute)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseRetiring, gate: v1alpha1.GateCanarySoak, opensAt: t0.Add(30 * time.Minute)}},
	}, {
		name: "a root retired early by an override does not leave the live bundle while its leaves are valid",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseRetired, v1alpha1.PhaseRetiring, t0.Add(-2*time.Hour)).issuedUntil("a", t0.Add(20*time.Hour)).
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-25*time.Hour)).keyReady("b").published(t0.Add(-2 * time.Hour)),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseRetiring, gate: v1alpha1.GateLeavesValid, opensAt: t0.Add(20 * time.Hour)}},
	}, {
		name: "the first generation of a new Authority becomes Active at once once its key is ready",
		f:    newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, "", t0).keyReady("a"),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseActive}},
	}, {
		name: "the first generation waits for its key",
		f:    newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, "", t0),
		now:  t0,
		want: []want{{gen: "a", next: "", gate: v1alpha1.GateKeyNotReady}},
	}, {
		name: "failing canary health holds a soaked generation",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-2*time.Hour)).published(t0.Add(-2*time.Hour)).health(false, t0.Add(-time.Minute)),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GateCanaryHealth, message: "GET answered 503"}},
	}, {
		name: "canary health that recovered restarts the soak from its recovery",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-2*time.Hour)).published(t0.Add(-2*time.Hour)).health(true, t0.Add(-10*time.Minute)),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GateCanarySoak, opensAt: t0.Add(50 * time.Minute)}},
	}, {
		name: "an override skips the soak and the window",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-time.Minute)).published(t0.Add(-time.Minute)).
			override("change window closes", map[string]v1alpha1.Phase{"b": v1alpha1.PhasePromoted}),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhasePromoted, forced: true}},
	}, {
		name: "an override for another phase than spec asks for is not used",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhasePromoted, v1alpha1.PhaseStaged, t0.Add(-time.Minute)).published(t0.Add(-time.Minute)).
			override("stale", map[string]v1alpha1.Phase{"b": v1alpha1.PhaseActive}),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GateCanarySoak}},
	}, {
		name: "an override does not activate a key the signer cannot use",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseStaged, t0.Add(-time.Minute)).published(t0.Add(-time.Minute)).
			override("hurry", map[string]v1alpha1.Phase{"b": v1alpha1.PhaseActive}),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseStaged, gate: v1alpha1.GateKeyNotReady}, {gen: "a", next: v1alpha1.PhaseActive, gate: v1alpha1.GateKeyNotReady}},
	}, {
		name: "the emergency path activates the new key and pulls the compromised root from both bundles at once",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseRetired, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").issuedUntil("a", t0.Add(20*time.Hour)).
			gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhaseStaged, t0.Add(-time.Minute)).keyReady("b").published(t0.Add(-time.Minute)).
			override("key a compromised", map[string]v1alpha1.Phase{"a": v1alpha1.PhaseRetired, "b": v1alpha1.PhaseActive}),
		now:  t0,
		want: []want{{gen: "a", next: v1alpha1.PhaseRetired, forced: true}, {gen: "b", next: v1alpha1.PhaseActive, forced: true}},
	}, {
		name: "a certificate that is not a CA is never staged",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", &testCA{pem: "-----BEGIN CERTIFICATE-----\nTUlJQg==\n-----END CERTIFICATE-----\n"}, v1alpha1.PhaseStaged, "", t0),
		now:  t0,
		want: []want{{gen: "b", next: "", gate: v1alpha1.GateInvalidCertificate, message: "certificatePEM"}},
	}, {
		name: "an expired CA certificate is never staged",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", newCA(t, "expired", nil, t0.Add(-48*time.Hour), t0.Add(-time.Hour)), v1alpha1.PhaseStaged, "", t0),
		now:  t0,
		want: []want{{gen: "b", next: "", gate: v1alpha1.GateInvalidCertificate, message: "expired"}},
	}, {
		name: "a CA certificate that starts in the future is staged but not activated before it starts",
		f:    newFixture(soak, window).gen("a", newCA(t, "future", nil, t0.Add(time.Hour), t0.Add(48*time.Hour)), v1alpha1.PhaseActive, "", t0).keyReady("a"),
		now:  t0,
		want: []want{{gen: "a", next: "", gate: v1alpha1.GateNotYetValid, opensAt: t0.Add(time.Hour)}},
	}, {
		name: "a staged generation that never issued is withdrawn at once",
		f: newFixture(soak, window).gen("a", old, v1alpha1.PhaseActive, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").
			gen("b", next, v1alpha1.PhaseRetired, v1alpha1.PhaseStaged, t0.Add(-time.Minute)).published(t0.Add(-time.Minute)),
		now:  t0,
		want: []want{{gen: "b", next: v1alpha1.PhaseRetired}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			plan := Evaluate(tc.f.a, tc.now)
			for _, w := range tc.want {
				s, ok := plan.Step(w.gen)
				if !ok {
					t.Fatalf("no step for %s in %+v", w.gen, plan.Steps)
				}
				if s.Next != w.next || s.Gate != w.gate || s.Forced != w.forced {
					t.Errorf("%s: next %q gate %q forced %v (%s), want next %q gate %q forced %v", w.gen, s.Next, s.Gate, s.Forced, s.Message, w.next, w.gate, w.forced)
				}
				if !w.opensAt.IsZero() && (s.OpensAt == nil || !s.OpensAt.Equal(w.opensAt)) {
					t.Errorf("%s: opens at %v, want %v", w.gen, s.OpensAt, w.opensAt)
				}
				if !strings.Contains(s.Message, w.message) {
					t.Errorf("%s: message %q does not say %q", w.gen, s.Message, w.message)
				}
			}
		})
	}
}

func TestBundleContents(t *testing.T) {
	root := rootCA(t, "shared root")
	i1 := newCA(t, "intermediate 1", root, t0.Add(-time.Hour), t0.Add(90*24*time.Hour))
	i2 := newCA(t, "intermediate 2", root, t0.Add(-time.Hour), t0.Add(90*24*time.Hour))
	other := rootCA(t, "other root")
	f := newFixture(time.Hour, time.Minute)
	f.a.Spec.Generations = []v1alpha1.Generation{
		{Name: "x", CertificatePEM: other.pem},
		{Name: "i1", CertificatePEM: i1.pem, ChainPEM: root.pem},
		{Name: "i2", CertificatePEM: i2.pem, ChainPEM: root.pem},
		{Name: "gone", CertificatePEM: rootCA(t, "retired root").pem},
	}
	f.a.Status.Generations = []v1alpha1.GenerationStatus{
		{Name: "i2", Phase: v1alpha1.PhaseActive}, {Name: "i1", Phase: v1alpha1.PhaseRetiring},
		{Name: "x", Phase: v1alpha1.PhaseStaged}, {Name: "gone", Phase: v1alpha1.PhaseRetired},
	}
	canary, live := BundleContents(f.a)
	names := func(ms []Member) (out []string) {
		for _, m := range ms {
			out = append(out, m.Root.Subject.CommonName+"="+strings.Join(m.Generations, "+"))
		}
		return out
	}
	if got, want := strings.Join(names(canary), ","), "other root=x,shared root=i2"; got != want {
		t.Errorf("canary = %s, want %s", got, want)
	}
	if got, want := strings.Join(names(live), ","), "shared root=i1+i2"; got != want {
		t.Errorf("live = %s (intermediates' shared root once, in spec order), want %s", got, want)
	}
	if BundleDigest(nil) != "" || BundleDigest(live) == BundleDigest(canary) {
		t.Error("digest: empty bundle must be \"\" and different contents must differ")
	}
	if n := strings.Count(BundlePEM(live), "BEGIN CERTIFICATE"); n != 1 {
		t.Errorf("live PEM holds %d certificates, want 1", n)
	}
}

func TestPlanApplyKeepsTheSignersFields(t *testing.T) {
	old, next := rootCA(t, "old"), rootCA(t, "new")
	f := newFixture(time.Hour, time.Minute).gen("a", old, v1alpha1.PhasePromoted, v1alpha1.PhaseActive, t0.Add(-48*time.Hour)).keyReady("a").issuedUntil("a", t0.Add(time.Hour)).
		gen("b", next, v1alpha1.PhaseActive, v1alpha1.PhasePromoted, t0.Add(-time.Hour)).keyReady("b").published(t0.Add(-time.Hour))
	got := Evaluate(f.a, t0).Apply(f.a, t0)
	a, b := got.Status.Generations[0], got.Status.Generations[1]
	if a.Phase != v1alpha1.PhasePromoted || b.Phase != v1alpha1.PhaseActive {
		t.Fatalf("phases a=%s b=%s, want Promoted and Active", a.Phase, b.Phase)
	}
	if a.Since != nil || b.Since != nil {
		t.Errorf("since a=%v b=%v before the writes are confirmed, want none", a.Since, b.Since)
	}
	Confirm(got, t0.Add(1500*time.Millisecond))
	a, b = got.Status.Generations[0], got.Status.Generations[1]
	if want := t0.Add(2 * time.Second); !a.Since.Time.Equal(want) || !b.Since.Time.Equal(want) {
		t.Errorf("since a=%v b=%v, want the confirmation rounded up, %v", a.Since, b.Since, want)
	}
	if a.LastIssuedNotAfter == nil || a.KeyCheck == nil || !a.KeyCheck.Ready {
		t.Errorf("the signer's fields were dropped: %+v", a)
	}
	if f.a.Status.Generations[0].Phase != v1alpha1.PhaseActive {
		t.Error("Apply changed its input")
	}
}

// readyCheck is the keyCheck the signer writes for a's generation name
// when its key is ready: it names the keyURI and certificate it checked.
func readyCheck(a *v1alpha1.Authority, name string) *v1alpha1.KeyCheck {
	for _, g := range a.Spec.Generations {
		if g.Name == name {
			return &v1alpha1.KeyCheck{Ready: true, KeyURI: g.KeyURI, CertificateDigest: phaserecord.CertificateDigest(g)}
		}
	}
	return &v1alpha1.KeyCheck{Ready: true}
}
