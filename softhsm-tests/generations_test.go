package softhsmtests

import (
	"context"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/backends/pkcs11"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// signCounts counts, per key fingerprint, the signatures that reached the
// backend, across every registry that shares it.
type signCounts struct {
	mu sync.Mutex
	n  map[string]*atomic.Int64
}

func (c *signCounts) of(fingerprint string) *atomic.Int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]*atomic.Int64{}
	}
	if c.n[fingerprint] == nil {
		c.n[fingerprint] = &atomic.Int64{}
	}
	return c.n[fingerprint]
}

// countingProvider counts the signatures of every key it opens.
type countingProvider struct {
	backends.Provider
	counts *signCounts
}

func (p countingProvider) Open(ctx context.Context, req backends.OpenRequest) (backends.Signer, error) {
	k, err := p.Provider.Open(ctx, req)
	if err != nil {
		return nil, err
	}
	return &countingKey{Signer: k, n: p.counts.of(k.Fingerprint())}, nil
}

type countingKey struct {
	backends.Signer
	n *atomic.Int64
}

func (k *countingKey) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	k.n.Add(1)
	return k.Signer.SignContext(ctx, digest, opts)
}

func (k *countingKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), digest, opts)
}

// countingRegistry is a registry with the pkcs11 and file backends whose
// keys count their signatures in counts.
func countingRegistry(t testing.TB, counts *signCounts) *backends.Registry {
	t.Helper()
	p11, err := pkcs11.New(pkcs11.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := backends.NewRegistry(file.New(), countingProvider{Provider: p11, counts: counts})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// tokenCA is a CA key in the run's token with its root.
type tokenCA struct {
	uri  string
	pem  string
	root *x509.Certificate
	fp   string
}

func newTokenCA(t *testing.T, label string) tokenCA {
	t.Helper()
	uri, file, root := caInToken(t, label)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := backends.Fingerprint(root.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return tokenCA{uri: uri, pem: string(b), root: root, fp: fp}
}

// signedBy reports whether the leaf of an issued PCR was signed by ca.
func signedBy(t *testing.T, p *certv1.PodCertificateRequest, ca tokenCA) bool {
	t.Helper()
	if c := condition(p); c.Type != "Issued" {
		t.Fatalf("PCR %s/%s: %s/%s: %s", p.Namespace, p.Name, c.Type, c.Reason, c.Message)
	}
	b, _ := pem.Decode([]byte(p.Status.CertificateChain))
	if b == nil {
		t.Fatal("issued chain holds no certificate")
	}
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return leaf.CheckSignatureFrom(ca.root) == nil
}

// readyz returns the signer's /readyz status code and body.
func readyz(t *testing.T, rs *runningSigner) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + rs.HealthAddr + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// stillPending fails the test if p got a status within a few seconds (long
// enough for a signer that wrongly signs it).
func stillPending(t *testing.T, ctx context.Context, p *certv1.PodCertificateRequest) {
	t.Helper()
	time.Sleep(3 * time.Second)
	got, err := cp.AdminClient().CertificatesV1().PodCertificateRequests(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Status.Conditions) > 0 || got.Status.CertificateChain != "" {
		t.Fatalf("PCR got a status while no generation may issue: %+v", got.Status)
	}
}

// generationStatus waits until Authority name's status of generation
// satisfies cond, and returns it.
func generationStatus(t *testing.T, ctx context.Context, name, generation string, cond func(kwv1alpha1.GenerationStatus) bool) kwv1alpha1.GenerationStatus {
	t.Helper()
	var last kwv1alpha1.GenerationStatus
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		a, err := authorities(t).Get(ctx, name)
		if err != nil {
			return false, err
		}
		for _, g := range a.Status.Generations {
			if g.Name == generation {
				last = g
				return cond(g), nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("status of generation %s of Authority %s: %v (last %+v)", generation, name, err, last)
	}
	return last
}

// Two signer replicas (leader election) switch issuing key when the
// observed Active generation moves, without a restart; once the switch is
// seen, no leaf is signed with the old key, by the leader or by the
// standby that takes over (signatures counted on the backend side).
func TestActivationSwitchesTheIssuingKeyOnBothReplicas(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	suffix := uniqueName(t, "s")
	name := "keyward.dev/switch-" + suffix
	oldCA, newCA := newTokenCA(t, "old-"+suffix), newTokenCA(t, "new-"+suffix)
	ac := authorities(t)
	obj := authorityName(name)
	if _, err := ac.Create(ctx, &kwv1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: obj},
		Spec: kwv1alpha1.AuthoritySpec{SignerName: name, Generations: []kwv1alpha1.Generation{
			{Name: "old", KeyURI: oldCA.uri, CertificatePEM: oldCA.pem, Phase: kwv1alpha1.PhaseActive},
			{Name: "new", KeyURI: newCA.uri, CertificatePEM: newCA.pem, Phase: kwv1alpha1.PhasePromoted},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.SetObservedPhases(ctx, ac, cp.AdminClient(), obj, map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "new": kwv1alpha1.PhasePromoted}); err != nil {
		t.Fatal(err)
	}

	var counts signCounts
	lease := uniqueName(t, "lease")
	replicas := map[string]*runningSigner{}
	for _, id := range []string{"replica-a", "replica-b"} {
		cfg := baseConfig(t, config.Signer{Name: name, Profile: config.ProfilePodIdentity})
		on := true
		cfg.LeaderElection = config.LeaderElection{Enabled: &on, Namespace: signerNamespace, LeaseName: lease,
			LeaseDuration: metav1.Duration{Duration: 6 * time.Second}, RenewDeadline: metav1.Duration{Duration: 4 * time.Second},
			RetryPeriod: metav1.Duration{Duration: 500 * time.Millisecond}}
		rs := startSignerRegistry(t, cfg, id, pcr.V1, countingRegistry(t, &counts), 0)
		if err := waitReady(rs.HealthAddr); err != nil {
			t.Fatalf("%s not ready: %v", id, err)
		}
		replicas[id] = rs
	}
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	issue := func() *certv1.PodCertificateRequest {
		p, _ := createPCR(t, ctx, w, name, pcrOptions{})
		return waitTerminal(t, ctx, p, 30*time.Second)
	}
	if !signedBy(t, issue(), oldCA) {
		t.Fatal("before activation, a leaf was not signed by the old generation")
	}

	// `keyward trust activate`, then the trust publisher's status write:
	// new Active and old back to Promoted, in one write each.
	a, err := ac.Get(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	a.Spec.Generations[0].Phase, a.Spec.Generations[1].Phase = kwv1alpha1.PhasePromoted, kwv1alpha1.PhaseActive
	if _, err := ac.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.SetObservedPhases(ctx, ac, cp.AdminClient(), obj, map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhasePromoted, "new": kwv1alpha1.PhaseActive}); err != nil {
		t.Fatal(err)
	}
	// The leader has seen the switch once a leaf is signed by the new key.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		return signedBy(t, issue(), newCA), nil
	})
	if err != nil {
		t.Fatalf("no leaf signed by the new generation after activation: %v", err)
	}
	oldSignatures := counts.of(oldCA.fp).Load()
	newBefore := counts.of(newCA.fp).Load()
	for range 5 {
		if !signedBy(t, issue(), newCA) {
			t.Fatal("after the switch, a leaf was not signed by the new generation")
		}
	}

	// The leader goes; the standby, which read the same switch, takes over.
	l, err := cp.AdminClient().CoordinationV1().Leases(signerNamespace).Get(ctx, lease, metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil || replicas[*l.Spec.HolderIdentity] == nil {
		t.Fatalf("lease %s: %v (%+v)", lease, err, l.Spec)
	}
	replicas[*l.Spec.HolderIdentity].Stop()
	for range 5 {
		if !signedBy(t, issue(), newCA) {
			t.Fatal("after failover, a leaf was not signed by the new generation")
		}
	}
	if n := counts.of(oldCA.fp).Load(); n != oldSignatures {
		t.Fatalf("the old key signed %d times after the switch was seen, want 0", n-oldSignatures)
	}
	if n := counts.of(newCA.fp).Load() - newBefore; n < 10 {
		t.Fatalf("the new key signed %d times for 10 leaves", n)
	}
}

// lastIssuedNotAfter, written by the signer before it signs, is at least
// the notAfter of every leaf it issued; keyCheck reports the key ready.
func TestLastIssuedNotAfterCoversEveryLeaf(t *testing.T) {
	ctx := testContext(t)
	name := "keyward.dev/reserve-" + uniqueName(t, "s")
	keyURI, caFile, _ := caInToken(t, "ca-"+uniqueName(t, "r"))
	runSigner(t, baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile)), "replica-0")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	var latest time.Time
	for _, secs := range []*int32{ptr(int32(3600)), nil, ptr(int32(7862400))} {
		p, _ := createPCR(t, ctx, w, name, pcrOptions{maxExpirationSeconds: secs})
		got := waitTerminal(t, ctx, p, 30*time.Second)
		if c := condition(got); c.Type != "Issued" {
			t.Fatalf("%s/%s: %s", c.Type, c.Reason, c.Message)
		}
		if got.Status.NotAfter.After(latest) {
			latest = got.Status.NotAfter.Time
		}
	}
	g := generationStatus(t, ctx, authorityName(name), testGeneration, func(g kwv1alpha1.GenerationStatus) bool {
		return g.KeyCheck != nil && g.LastIssuedNotAfter != nil
	})
	if g.LastIssuedNotAfter.Time.Before(latest) {
		t.Fatalf("lastIssuedNotAfter %s is before a leaf's notAfter %s", g.LastIssuedNotAfter.UTC(), latest.UTC())
	}
	if !g.KeyCheck.Ready || g.KeyCheck.KeyVersion == "" || g.KeyCheck.Time == nil {
		t.Fatalf("keyCheck = %+v, want ready with a key version and a time", *g.KeyCheck)
	}
	if g.Phase != kwv1alpha1.PhaseActive {
		t.Fatalf("the signer's write changed the observed phase: %+v", g)
	}
}

func ptr[T any](v T) *T { return &v }

// An Active generation whose certificate is not for its key: keyCheck says
// so naming both, /readyz says so, nothing is signed and the request
// waits; the root cannot be swapped in place, and once the Authority is
// recreated with the right certificate, it is issued.
func TestMismatchedActiveGenerationIssuesNothingUntilFixed(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "s")
	name := "keyward.dev/mismatch-" + suffix
	keyCA, otherCA := newTokenCA(t, "key-"+suffix), newTokenCA(t, "other-"+suffix)
	ac := authorities(t)
	obj := authorityName(name)
	if _, err := controlplane.ActiveAuthority(ctx, ac, cp.AdminClient(), obj, name, testGeneration, keyCA.uri, otherCA.pem); err != nil {
		t.Fatal(err)
	}
	var counts signCounts
	rs := startSignerRegistry(t, baseConfig(t, config.Signer{Name: name, Profile: config.ProfilePodIdentity}), "replica-0", pcr.V1, countingRegistry(t, &counts), 0)

	g := generationStatus(t, ctx, obj, testGeneration, func(g kwv1alpha1.GenerationStatus) bool { return g.KeyCheck != nil })
	if g.KeyCheck.Ready || !strings.Contains(g.KeyCheck.Message, "CN=other-"+suffix) || !strings.Contains(g.KeyCheck.Message, "object=key-"+suffix) {
		t.Fatalf("keyCheck = %+v, want not ready, naming certificate CN=other-%s and key object=key-%s", *g.KeyCheck, suffix, suffix)
	}
	if code, body := readyz(t, rs); code == http.StatusOK || !strings.Contains(body, "cannot issue") {
		t.Fatalf("/readyz = %d %q, want it to say the Active generation cannot issue", code, body)
	}
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	p, _ := createPCR(t, ctx, w, name, pcrOptions{})
	stillPending(t, ctx, p)
	if n := counts.of(keyCA.fp).Load(); n != 0 {
		t.Fatalf("the key signed %d times with a certificate not its own", n)
	}

	// The root is in a bundle's phase (Active): the CRD refuses to swap
	// it in place (docs/rotation.md). A signer name that never issued is
	// fixed by recreating its Authority.
	a, err := ac.Get(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	a.Spec.Generations[0].CertificatePEM = keyCA.pem
	if _, err := ac.Update(ctx, a, metav1.UpdateOptions{}); !apierrors.IsInvalid(err) {
		t.Fatalf("swapping the certificate of an Active generation in place: %v, want Invalid", err)
	}
	if err := ac.Delete(ctx, obj, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := ac.Get(ctx, obj)
		return apierrors.IsNotFound(err), nil
	}); err != nil {
		t.Fatalf("Authority %s not gone: %v", obj, err)
	}
	if _, err := controlplane.ActiveAuthority(ctx, ac, cp.AdminClient(), obj, name, testGeneration, keyCA.uri, keyCA.pem); err != nil {
		t.Fatal(err)
	}
	if !signedBy(t, waitTerminal(t, ctx, p, 30*time.Second), keyCA) {
		t.Fatal("after the fix, the leaf was not signed by the generation's key")
	}
	generationStatus(t, ctx, obj, testGeneration, func(g kwv1alpha1.GenerationStatus) bool { return g.KeyCheck != nil && g.KeyCheck.Ready })
	if err := waitReady(rs.HealthAddr); err != nil {
		t.Fatalf("/readyz after the fix: %v", err)
	}
}

// A signer name no Authority names issues nothing, /readyz says why, and
// its requests wait until an Authority appears.
func TestNoAuthorityLeavesRequestsPending(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "s")
	name := "keyward.dev/none-" + suffix
	authorities(t) // the CRD is served; only the object is missing
	rs := startSigner(t, baseConfig(t, config.Signer{Name: name, Profile: config.ProfilePodIdentity}), "replica-0", pcr.V1, all.Options{})
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		code, body := readyz(t, rs)
		return code != http.StatusOK && strings.Contains(body, "no Authority"), nil
	})
	if err != nil {
		code, body := readyz(t, rs)
		t.Fatalf("/readyz = %d %q, want it to say no Authority names %s", code, body, name)
	}
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	p, _ := createPCR(t, ctx, w, name, pcrOptions{})
	stillPending(t, ctx, p)

	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	activeAuthority(t, name, keyURI, caFile)
	got := waitTerminal(t, ctx, p, 30*time.Second)
	parseChain(t, got.Status.CertificateChain, root)
}
