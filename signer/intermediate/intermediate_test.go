package intermediate_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/intermediate"
	"github.com/keyward/keyward/signer/issuer"
	testingclock "k8s.io/utils/clock/testing"
)

var epoch = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

const (
	maxLifetime = time.Hour
	renewBefore = 2 * time.Hour
	validity    = 6 * time.Hour
)

// countingKey is a CA key (a file key standing in for the KMS) that counts
// its signatures and fails while down is set.
type countingKey struct {
	backends.Signer
	signs atomic.Int32
	down  atomic.Bool
	// hold makes a signature wait for its context to end.
	hold atomic.Bool
}

var errKMSDown = &backends.Error{Kind: backends.ErrTransient, Op: "sign", URI: "awskms:fake", Err: errors.New("ServiceUnavailableException")}

func (k *countingKey) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	if k.down.Load() {
		return nil, errKMSDown
	}
	if k.hold.Load() {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	k.signs.Add(1)
	return k.Signer.SignContext(ctx, digest, opts)
}

func (k *countingKey) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return k.SignContext(context.Background(), digest, opts)
}

// generation is a CA generation: a root of pathLen (valid 30 days from
// epoch) and its counting key.
type generation struct {
	key  *countingKey
	root *x509.Certificate
	auth *authority.Authority
}

func newGeneration(t *testing.T, name string, pathLen int) *generation {
	t.Helper()
	k, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), name+".pem"), Algorithm: backends.ECDSAP256SHA256,
	})
	if err != nil {
		t.Fatal(err)
	}
	key := &countingKey{Signer: k}
	root, err := ca.SelfSign(context.Background(), k, ca.Options{
		Subject: pkix.Name{CommonName: "root " + name}, Lifetime: 30 * 24 * time.Hour, PathLen: pathLen,
		Now: func() time.Time { return epoch.Add(-time.Hour) },
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authority.New(root, nil, key)
	if err != nil {
		t.Fatal(err)
	}
	return &generation{key: key, root: root, auth: a}
}

// generations is the wrapped Issuer: whichever generation is Active, and
// the reservations asked of it.
type generations struct {
	mu       sync.Mutex
	active   *generation
	name     string
	reserved map[string]time.Time
}

func (g *generations) set(gen *generation, name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active, g.name = gen, name
}

func (g *generations) Current() (*authority.Authority, string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.active == nil {
		return nil, "", issuer.ErrUnavailable
	}
	return g.active.auth, g.name, nil
}

func (g *generations) Reserve(_ context.Context, gen string, notAfter time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gen != g.name {
		return fmt.Errorf("%w: generation %s no longer issues", issuer.ErrUnavailable, gen)
	}
	if g.reserved == nil {
		g.reserved = map[string]time.Time{}
	}
	if notAfter.After(g.reserved[gen]) {
		g.reserved[gen] = notAfter
	}
	return nil
}

type setup struct {
	gens  *generations
	clk   *testingclock.FakeClock
	iss   *intermediate.Issuer
	first *generation
	logs  *logBuffer
}

type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

func newSetup(t *testing.T) *setup {
	t.Helper()
	s := &setup{gens: &generations{}, clk: testingclock.NewFakeClock(epoch), first: newGeneration(t, "a", 1), logs: &logBuffer{}}
	s.gens.set(s.first, "a")
	logger := funcr.New(func(prefix, args string) {
		s.logs.mu.Lock()
		defer s.logs.mu.Unlock()
		s.logs.b.WriteString(args + "\n")
	}, funcr.Options{})
	var err error
	s.iss, err = intermediate.New(s.gens, intermediate.Options{
		SignerName: "keyward.dev/pod-identity", Replica: "keyward-signer-7d9f-x2",
		Validity: validity, RenewBefore: renewBefore, MaxLifetime: maxLifetime, Backdate: 2 * time.Minute,
		Clock: s.clk, Logger: logger, Wait: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// issue signs a leaf as the PCR controller does: Current, Reserve, Sign.
func (s *setup) issue(t *testing.T, lifetime time.Duration) (*x509.Certificate, *authority.Authority, string) {
	t.Helper()
	auth, gen, err := s.iss.Current()
	if err != nil {
		t.Fatal(err)
	}
	now := s.clk.Now()
	if err := s.iss.Reserve(context.Background(), gen, now.Add(lifetime)); err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Sign(context.Background(), &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, leafKey(t),
		authority.Policy{Lifetime: lifetime, Backdate: 2 * time.Minute, MinLifetime: lifetime, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	return leaf, auth, gen
}

func leafKey(t *testing.T) crypto.PublicKey {
	k, err := backends.GenerateKey(backends.ECDSAP256SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

// verify checks leaf against root as the only root, with chainPEM (what
// status.certificate carries after the leaf) as the intermediates.
func verify(t *testing.T, leaf *x509.Certificate, chainPEM []byte, root *x509.Certificate, at time.Time) {
	t.Helper()
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	if !inters.AppendCertsFromPEM(chainPEM) {
		t.Fatal("no certificate in the chain")
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf does not verify through its intermediate to the root: %v", err)
	}
}

// A burst of leaves costs the CA key one signature: every leaf is signed
// by the same in-memory intermediate, which is a leaf-only CA bound to the
// replica, and each chain (leaf + IssuersPEM, the intermediate alone: the
// root is not served) verifies against the root as the only root.
func TestABurstCostsTheCAKeyOneSignature(t *testing.T) {
	s := newSetup(t)
	const n = 64
	var wg sync.WaitGroup
	type issued struct {
		leaf *x509.Certificate
		auth *authority.Authority
		gen  string
	}
	out := make([]issued, n)
	for j := range n {
		wg.Go(func() {
			leaf, auth, gen := s.issue(t, maxLifetime)
			out[j] = issued{leaf, auth, gen}
		})
	}
	wg.Wait()
	if got := s.first.key.signs.Load(); got != 1 {
		t.Fatalf("the CA key signed %d times for %d leaves, want 1 (the intermediate)", got, n)
	}
	inter := out[0].auth.Certificate()
	for _, o := range out {
		if o.auth != out[0].auth || o.gen != "a" {
			t.Fatalf("leaves under different intermediates or generations: %s", o.gen)
		}
		chain := o.auth.IssuersPEM()
		if want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: inter.Raw}); !bytes.Equal(chain, want) {
			t.Fatalf("issuers served with a leaf: %d bytes, want the intermediate alone", len(chain))
		}
		verify(t, o.leaf, chain, s.first.root, s.clk.Now())
		if o.leaf.NotAfter.After(inter.NotAfter) {
			t.Errorf("leaf ends %s, after its intermediate %s", o.leaf.NotAfter, inter.NotAfter)
		}
		if got := o.leaf.NotAfter.Sub(o.leaf.NotBefore); got != maxLifetime {
			t.Errorf("leaf lifetime %s, want %s (not cut by the intermediate)", got, maxLifetime)
		}
	}
	if !inter.IsCA || !inter.MaxPathLenZero || inter.MaxPathLen != 0 || inter.KeyUsage != x509.KeyUsageCertSign {
		t.Errorf("intermediate CA=%v pathLen=%d/%v keyUsage=%v, want a leaf-only CA with certSign", inter.IsCA, inter.MaxPathLen, inter.MaxPathLenZero, inter.KeyUsage)
	}
	if got := inter.NotAfter.Sub(inter.NotBefore); got != validity {
		t.Errorf("intermediate lives %s, want %s", got, validity)
	}
	if want := intermediate.BindingURI("keyward.dev/pod-identity", "keyward-signer-7d9f-x2").String(); len(inter.URIs) != 1 || inter.URIs[0].String() != want {
		t.Errorf("intermediate URIs %v, want [%s]", inter.URIs, want)
	}
	if !strings.Contains(inter.Subject.CommonName, "keyward-signer-7d9f-x2") {
		t.Errorf("intermediate subject %q does not name the replica", inter.Subject)
	}
	if pub, ok := inter.PublicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !pub.Equal(out[0].auth.Signer().Public()) {
		t.Error("the intermediate's certificate is not for its in-memory key")
	}
	if u := out[0].auth.Signer().URI(); !strings.HasPrefix(u, "memory:") {
		t.Errorf("in-memory key URI %q", u)
	}
	if l := s.logs.String(); !strings.Contains(l, "Signed an intermediate CA") || strings.Contains(l, "PRIVATE KEY") {
		t.Errorf("log:\n%s", l)
	}
	if s.iss.Signed() != 1 {
		t.Errorf("Signed() = %d", s.iss.Signed())
	}
}

// Once less than renewBefore is left, the next Current starts a new
// intermediate (a new key) and keeps answering the old one until it is
// there; leaves never outlive the intermediate that signed them.
func TestRenewedBeforeExpiryWithANewKey(t *testing.T) {
	s := newSetup(t)
	_, first, _ := s.issue(t, maxLifetime)
	// Just outside the renewal window: nothing new.
	s.clk.Step(validity - renewBefore - 2*time.Minute - time.Second)
	if _, a, _ := s.issue(t, maxLifetime); a != first || s.first.key.signs.Load() != 1 {
		t.Fatalf("renewed %s before renewBefore", renewBefore)
	}
	s.clk.Step(2 * time.Second)
	leaf, a, _ := s.issue(t, maxLifetime)
	if a != first {
		t.Fatal("the renewal made a leaf wait instead of answering the current intermediate")
	}
	if leaf.NotAfter.After(first.Certificate().NotAfter) {
		t.Fatalf("leaf ends after its intermediate")
	}
	waitFor(t, func() bool { return s.iss.Signed() == 2 })
	_, second, _ := s.issue(t, maxLifetime)
	if second == first {
		t.Fatal("no new intermediate after the renewal")
	}
	if second.Signer().Fingerprint() == first.Signer().Fingerprint() {
		t.Error("the new intermediate has the old key")
	}
	if !second.Certificate().NotAfter.After(first.Certificate().NotAfter) {
		t.Error("the new intermediate does not end later")
	}
	if got := s.first.key.signs.Load(); got != 2 {
		t.Errorf("the CA key signed %d times, want 2", got)
	}
}

// With the CA key down, the current intermediate keeps issuing while a
// whole leaf fits in it; after that, requests get a transient error that
// names the key's failure, and issuing resumes once the key is back.
func TestKeyDownKeepsTheCurrentIntermediateWhileALeafFits(t *testing.T) {
	s := newSetup(t)
	_, first, _ := s.issue(t, maxLifetime)
	s.first.key.down.Store(true)
	// In the renewal window: the renewal fails, the current one answers.
	s.clk.Step(validity - renewBefore)
	for range 3 {
		if _, a, _ := s.issue(t, maxLifetime); a != first {
			t.Fatal("not the current intermediate")
		}
		waitFor(t, func() bool { return strings.Contains(s.logs.String(), "Signing an intermediate CA failed") })
		s.clk.Step(2 * time.Minute) // past the retry backoff
	}
	// Less than maxLifetime left: nothing may issue.
	s.clk.SetTime(first.Certificate().NotAfter.Add(-maxLifetime + time.Second))
	_, _, err := s.iss.Current()
	if !errors.Is(err, issuer.ErrUnavailable) || !errors.Is(err, backends.ErrTransient) || !strings.Contains(err.Error(), "ServiceUnavailableException") {
		t.Fatalf("Current with the key down and the intermediate too short: %v, want ErrUnavailable naming the key's error", err)
	}
	if strings.Count(s.logs.String(), "Signing an intermediate CA failed") != 1 {
		t.Errorf("the same failure logged more than once:\n%s", s.logs.String())
	}
	s.first.key.down.Store(false)
	s.clk.Step(2 * time.Minute)
	leaf, a, _ := s.issue(t, maxLifetime)
	if a == first {
		t.Fatal("the expiring intermediate still issues")
	}
	verify(t, leaf, a.IssuersPEM(), s.first.root, s.clk.Now())
}

// When the Active generation changes, the next leaf is signed by a new
// intermediate under the new generation's key and reserved under that
// generation; the old intermediate is never answered again, and a leaf
// reserved under the old generation is refused (it would be retried).
func TestAGenerationChangeReissuesTheIntermediate(t *testing.T) {
	s := newSetup(t)
	_, first, _ := s.issue(t, maxLifetime)
	b := newGeneration(t, "b", 1)
	s.gens.set(b, "b")
	if err := s.iss.Reserve(context.Background(), "a", s.clk.Now().Add(maxLifetime)); !errors.Is(err, issuer.ErrUnavailable) {
		t.Fatalf("reserve under the old generation: %v", err)
	}
	leaf, a, gen := s.issue(t, maxLifetime)
	if a == first || gen != "b" {
		t.Fatalf("after the change: generation %s, same intermediate %v", gen, a == first)
	}
	if got := b.key.signs.Load(); got != 1 {
		t.Errorf("the new generation's key signed %d times, want 1", got)
	}
	verify(t, leaf, a.IssuersPEM(), b.root, s.clk.Now())
	if err := a.Certificate().CheckSignatureFrom(b.root); err != nil {
		t.Fatalf("the new intermediate is not signed by the new generation: %v", err)
	}
	s.gens.mu.Lock()
	reserved := s.gens.reserved["b"]
	s.gens.mu.Unlock()
	if leaf.NotAfter.After(reserved) {
		t.Errorf("leaf ends %s, after generation b's reservation %s", leaf.NotAfter, reserved)
	}
}

// A CA whose path length allows no CA below it issues nothing in this
// mode, and says why.
func TestAPathLenZeroCAIsRefusedByName(t *testing.T) {
	s := newSetup(t)
	s.gens.set(newGeneration(t, "flat", 0), "flat")
	_, _, err := s.iss.Current()
	if !errors.Is(err, issuer.ErrUnavailable) || !errors.Is(err, authority.ErrNoPathForIntermediate) {
		t.Fatalf("got %v, want ErrUnavailable and ErrNoPathForIntermediate", err)
	}
}

func TestNewRefusesRenewBeforeShorterThanALeaf(t *testing.T) {
	_, err := intermediate.New(&generations{}, intermediate.Options{
		SignerName: "keyward.dev/x", Replica: "r", Validity: validity, RenewBefore: 30 * time.Minute, MaxLifetime: maxLifetime,
	})
	if err == nil {
		t.Fatal("renewBefore < maxLifetime accepted")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}

// Observe hears of every attempt: the certificate signed, or the error.
func TestObserveHearsOfEveryAttempt(t *testing.T) {
	gens := &generations{}
	gen := newGeneration(t, "a", 1)
	gens.set(gen, "a")
	clk := testingclock.NewFakeClock(epoch)
	var mu sync.Mutex
	var got []string
	iss, err := intermediate.New(gens, intermediate.Options{
		SignerName: "keyward.dev/x", Replica: "r", Validity: validity, RenewBefore: renewBefore, MaxLifetime: maxLifetime, Clock: clk,
		Observe: func(c *x509.Certificate, err error) {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				got = append(got, "failed")
				return
			}
			got = append(got, "signed "+c.NotAfter.Sub(epoch).String())
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	gen.key.down.Store(true)
	if _, _, err := iss.Current(); err == nil {
		t.Fatal("signed with the key down")
	}
	gen.key.down.Store(false)
	clk.Step(time.Minute)
	if _, _, err := iss.Current(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	// Signed a minute after epoch, without backdate.
	if want := []string{"failed", "signed 6h1m0s"}; !slices.Equal(got, want) {
		t.Errorf("observed %q, want %q", got, want)
	}
}

// Under a CA that ends before a whole validity, the intermediate ends with
// the CA and is not renewed in a loop (a successor could end no later);
// once a leaf no longer fits, nothing issues (ErrCAExpiresTooSoon), as
// without the intermediate.
func TestAnIntermediateEndingWithItsCAIsNotRenewedInALoop(t *testing.T) {
	k, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "short.pem"), Algorithm: backends.ECDSAP256SHA256,
	})
	if err != nil {
		t.Fatal(err)
	}
	key := &countingKey{Signer: k}
	root, err := ca.SelfSign(context.Background(), k, ca.Options{
		Subject: pkix.Name{CommonName: "short root"}, Lifetime: 3 * time.Hour, PathLen: 1, Now: func() time.Time { return epoch.Add(-time.Minute) },
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authority.New(root, nil, key)
	if err != nil {
		t.Fatal(err)
	}
	gens := &generations{}
	gens.set(&generation{key: key, root: root, auth: a}, "short")
	clk := testingclock.NewFakeClock(epoch)
	iss, err := intermediate.New(gens, intermediate.Options{
		SignerName: "keyward.dev/x", Replica: "r", Validity: validity, RenewBefore: renewBefore, MaxLifetime: maxLifetime, Clock: clk,
	})
	if err != nil {
		t.Fatal(err)
	}
	first, _, err := iss.Current()
	if err != nil {
		t.Fatal(err)
	}
	if !first.Certificate().NotAfter.Equal(root.NotAfter) {
		t.Fatalf("intermediate ends %s, want with its CA %s", first.Certificate().NotAfter, root.NotAfter)
	}
	for range 20 { // into renewBefore (2h59m left at first, 1h19m at last), a leaf still fits
		clk.Step(5 * time.Minute)
		if a, _, err := iss.Current(); err != nil || a != first {
			t.Fatalf("Current: %v (same intermediate %v)", err, a == first)
		}
	}
	time.Sleep(50 * time.Millisecond) // a renewal, had one started, would have signed
	if n := key.signs.Load(); n != 1 {
		t.Fatalf("the CA key signed %d times, want 1: renewing cannot outlast the CA", n)
	}
	clk.SetTime(root.NotAfter.Add(-maxLifetime + time.Minute))
	if _, _, err := iss.Current(); !errors.Is(err, issuer.ErrUnavailable) || !errors.Is(err, authority.ErrCAExpiresTooSoon) {
		t.Fatalf("with less than a leaf left: %v, want ErrUnavailable and ErrCAExpiresTooSoon", err)
	}
}

// A replica that may no longer lead signs no intermediate: Bound (the
// Lease's fence) refuses a signature before it starts and cuts one under
// way. Neither is the CA key's failure: nothing is logged as one, and once
// the bound lets it the next Current signs at once, with no backoff.
func TestBoundRefusesOrCutsTheIntermediatesSignature(t *testing.T) {
	errFenced := errors.New("fenced")
	var mu sync.Mutex
	refuse, cut := true, false
	gens := &generations{}
	gen := newGeneration(t, "a", 1)
	gens.set(gen, "a")
	logs := &logBuffer{}
	logger := funcr.New(func(_, args string) {
		logs.mu.Lock()
		defer logs.mu.Unlock()
		logs.b.WriteString(args + "\n")
	}, funcr.Options{})
	clk := testingclock.NewFakeClock(epoch)
	iss, err := intermediate.New(gens, intermediate.Options{
		SignerName: "keyward.dev/x", Replica: "r", Validity: validity, RenewBefore: renewBefore, MaxLifetime: maxLifetime,
		Clock: clk, Logger: logger, Wait: 5 * time.Second,
		Bound: func(ctx context.Context) (context.Context, context.CancelFunc, error) {
			mu.Lock()
			defer mu.Unlock()
			switch {
			case refuse:
				return ctx, func() {}, errFenced
			case cut:
				ctx, cancel := context.WithCancelCause(ctx)
				go func() { time.Sleep(10 * time.Millisecond); cancel(errFenced) }()
				return ctx, func() { cancel(nil) }, nil
			}
			return ctx, func() {}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := iss.Current(); !errors.Is(err, errFenced) || !errors.Is(err, issuer.ErrUnavailable) {
		t.Fatalf("refused by the bound: err = %v, want one matching the bound's and ErrUnavailable", err)
	}
	mu.Lock()
	refuse, cut = false, true
	mu.Unlock()
	gen.key.hold.Store(true)
	if _, _, err := iss.Current(); !errors.Is(err, errFenced) {
		t.Fatalf("cut by the bound: err = %v, want one matching the bound's", err)
	}
	gen.key.hold.Store(false)
	if got := gen.key.signs.Load(); got != 0 {
		t.Fatalf("the CA key signed %d times while fenced", got)
	}
	if l := logs.String(); strings.Contains(l, "failed") {
		t.Errorf("a fenced signature was logged as a failure:\n%s", l)
	}
	mu.Lock()
	cut = false
	mu.Unlock()
	// No clock step: a fenced attempt leaves no backoff behind.
	if _, _, err := iss.Current(); err != nil {
		t.Fatalf("with the bound open: %v", err)
	}
	if got := gen.key.signs.Load(); got != 1 || iss.Signed() != 1 {
		t.Fatalf("the CA key signed %d times, Signed() = %d; want 1", got, iss.Signed())
	}
}
