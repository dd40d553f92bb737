package authority_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/signer/authority"
)

var epoch = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func newCAKey(t *testing.T) backends.Signer {
	t.Helper()
	s, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: backends.ECDSAP256SHA256,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newAuthority(t *testing.T, caLifetime time.Duration) *authority.Authority {
	t.Helper()
	key := newCAKey(t)
	root, err := ca.SelfSign(context.Background(), key, ca.Options{
		Subject: pkix.Name{CommonName: "test root"}, Lifetime: caLifetime, Now: func() time.Time { return epoch },
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authority.New(root, nil, key)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func leafKey(t *testing.T) crypto.PublicKey {
	k, err := backends.GenerateKey(backends.ECDSAP256SHA256)
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

func TestLeafValidityIsExactlyTheLifetimeFromTheBackdatedStart(t *testing.T) {
	a := newAuthority(t, 365*24*time.Hour)
	now := epoch.Add(3*time.Hour + 500*time.Millisecond)
	leaf, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{
		Lifetime: time.Hour, Backdate: 2 * time.Minute, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	wantNB := now.Add(-2 * time.Minute).Truncate(time.Second)
	if !leaf.NotBefore.Equal(wantNB) || leaf.NotAfter.Sub(leaf.NotBefore) != time.Hour {
		t.Fatalf("validity %s .. %s, want %s + 1h", leaf.NotBefore, leaf.NotAfter, wantNB)
	}
	if leaf.IsCA {
		t.Error("leaf is a CA")
	}
	roots := x509.NewCertPool()
	roots.AddCert(a.Certificate())
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf does not verify to the CA: %v", err)
	}
}

func TestLeafNeverOutlivesItsCA(t *testing.T) {
	a := newAuthority(t, time.Hour) // root valid epoch-5m .. epoch+1h
	now := func() time.Time { return epoch.Add(30 * time.Minute) }

	_, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{Lifetime: time.Hour, Now: now})
	if !errors.Is(err, authority.ErrCAExpiresTooSoon) {
		t.Fatalf("1h leaf from a CA with 30m left: got %v, want ErrCAExpiresTooSoon", err)
	}
	leaf, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{Lifetime: time.Hour, MinLifetime: 10 * time.Minute, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if !leaf.NotAfter.Equal(a.Certificate().NotAfter) {
		t.Fatalf("leaf ends %s, want the CA's end %s", leaf.NotAfter, a.Certificate().NotAfter)
	}
}

func TestSerialsAreRandom128BitPositive(t *testing.T) {
	a := newAuthority(t, 24*time.Hour)
	seen := map[string]bool{}
	for range 50 {
		leaf, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{Lifetime: time.Hour, Now: func() time.Time { return epoch }})
		if err != nil {
			t.Fatal(err)
		}
		if leaf.SerialNumber.Sign() <= 0 || leaf.SerialNumber.BitLen() > 128 {
			t.Fatalf("serial %s is not a positive 128-bit number", leaf.SerialNumber)
		}
		if seen[leaf.SerialNumber.String()] {
			t.Fatalf("serial %s issued twice", leaf.SerialNumber)
		}
		seen[leaf.SerialNumber.String()] = true
	}
}

func TestNewRefusesACertificateForAnotherKey(t *testing.T) {
	a := newAuthority(t, 24*time.Hour)
	if _, err := authority.New(a.Certificate(), nil, newCAKey(t)); err == nil {
		t.Fatal("authority accepted a CA certificate for a different key")
	}
}

// failingSigner is a backends.Signer whose every signature fails with err.
type failingSigner struct {
	backends.Signer
	err error
}

func (f failingSigner) SignContext(context.Context, []byte, crypto.SignerOpts) ([]byte, error) {
	return nil, f.err
}
func (f failingSigner) Sign(io.Reader, []byte, crypto.SignerOpts) ([]byte, error) { return nil, f.err }

func TestBackendErrorKindSurvivesSigning(t *testing.T) {
	key := newCAKey(t)
	root, err := ca.SelfSign(context.Background(), key, ca.Options{Subject: pkix.Name{CommonName: "r"}, Lifetime: 24 * time.Hour, Now: func() time.Time { return epoch }})
	if err != nil {
		t.Fatal(err)
	}
	outage := &backends.Error{Kind: backends.ErrTransient, Op: "sign", Err: errors.New("HSM unreachable")}
	a, err := authority.New(root, nil, failingSigner{Signer: key, err: outage})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{Lifetime: time.Hour, Now: func() time.Time { return epoch }})
	if !backends.IsTransient(err) {
		t.Fatalf("got %v, want the backend's transient error to come through", err)
	}
}

// caCert makes a CA certificate for key valid from notBefore to notAfter,
// signed by parentKey under parent (self-signed when parent is nil).
func caCert(t *testing.T, cn string, key backends.Signer, parent *x509.Certificate, parentKey backends.Signer, notBefore, notAfter time.Time) *x509.Certificate {
	t.Helper()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: notBefore, NotAfter: notAfter,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true,
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// intermediateAuthority issues under an intermediate valid [intFrom,
// intTo) whose root is valid [rootFrom, rootTo).
func intermediateAuthority(t *testing.T, rootFrom, rootTo, intFrom, intTo time.Time) *authority.Authority {
	t.Helper()
	rootKey, intKey := newCAKey(t), newCAKey(t)
	root := caCert(t, "root", rootKey, nil, nil, rootFrom, rootTo)
	inter := caCert(t, "intermediate", intKey, root, rootKey, intFrom, intTo)
	a, err := authority.New(inter, []*x509.Certificate{root}, intKey)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// A CA minted a moment ago (intermediates are, during a CA change) must not
// fail a request: the leaf starts when the CA does, and a chain that starts
// after the signer's clock is a wait, not a failure.
func TestLeafStartsNoEarlierThanAnyCertificateOfTheChain(t *testing.T) {
	year := 365 * 24 * time.Hour
	cases := []struct {
		name          string
		rootFrom      time.Time
		intFrom       time.Time
		now           time.Time
		wantNotBefore time.Time
		wantNotYet    bool
	}{
		{name: "an old chain leaves the backdated start alone",
			rootFrom: epoch.Add(-year), intFrom: epoch.Add(-time.Hour), now: epoch.Add(500 * time.Millisecond),
			wantNotBefore: epoch.Add(-2 * time.Minute)},
		{name: "an intermediate minted half a second ago moves the start to its own",
			rootFrom: epoch.Add(-year), intFrom: epoch, now: epoch.Add(500 * time.Millisecond),
			wantNotBefore: epoch},
		{name: "a root that starts after its intermediate moves the start to the root's",
			rootFrom: epoch.Add(-30 * time.Second), intFrom: epoch.Add(-time.Hour), now: epoch,
			wantNotBefore: epoch.Add(-30 * time.Second)},
		{name: "an intermediate that starts in a minute is not valid yet",
			rootFrom: epoch.Add(-year), intFrom: epoch.Add(time.Minute), now: epoch,
			wantNotBefore: epoch.Add(time.Minute), wantNotYet: true},
		{name: "a root that starts in a second is not valid yet",
			rootFrom: epoch.Add(time.Second), intFrom: epoch.Add(-time.Hour), now: epoch,
			wantNotBefore: epoch.Add(time.Second), wantNotYet: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := intermediateAuthority(t, tc.rootFrom, epoch.Add(year), tc.intFrom, epoch.Add(year))
			leaf, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{
				Lifetime: time.Hour, Backdate: 2 * time.Minute, Now: func() time.Time { return tc.now },
			})
			if tc.wantNotYet {
				var nyv *authority.NotYetValidError
				if !errors.Is(err, authority.ErrCANotYetValid) || !errors.As(err, &nyv) {
					t.Fatalf("got %v, want ErrCANotYetValid", err)
				}
				if !nyv.ValidFrom.Equal(tc.wantNotBefore) {
					t.Fatalf("valid from %s, want %s", nyv.ValidFrom, tc.wantNotBefore)
				}
				if errors.Is(err, authority.ErrCAExpiresTooSoon) || backends.IsTransient(err) || errors.Is(err, backends.ErrPermanent) {
					t.Fatalf("%v also matches another class", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !leaf.NotBefore.Equal(tc.wantNotBefore) || leaf.NotAfter.Sub(leaf.NotBefore) != time.Hour {
				t.Fatalf("validity %s .. %s, want %s + 1h", leaf.NotBefore, leaf.NotAfter, tc.wantNotBefore)
			}
			if leaf.NotBefore.After(tc.now) {
				t.Fatalf("leaf starts %s, after the signer's clock %s", leaf.NotBefore, tc.now)
			}
		})
	}
}

// The leaf ends no later than any certificate of the chain: a root that
// expires before its intermediate caps the leaf too.
func TestLeafNeverOutlivesAnyCertificateOfTheChain(t *testing.T) {
	year := 365 * 24 * time.Hour
	cases := []struct {
		name        string
		rootTo      time.Time
		intTo       time.Time
		minLifetime time.Duration
		wantEnd     time.Time
		wantTooSoon bool
	}{
		{name: "a chain that outlives the leaf does not cut it",
			rootTo: epoch.Add(year), intTo: epoch.Add(year), wantEnd: epoch.Add(time.Hour)},
		{name: "a root ending before its intermediate cuts the leaf at the root's end",
			rootTo: epoch.Add(40 * time.Minute), intTo: epoch.Add(year), minLifetime: 10 * time.Minute, wantEnd: epoch.Add(40 * time.Minute)},
		{name: "an intermediate ending first cuts the leaf at its end",
			rootTo: epoch.Add(year), intTo: epoch.Add(50 * time.Minute), minLifetime: 10 * time.Minute, wantEnd: epoch.Add(50 * time.Minute)},
		{name: "a root cutting the leaf below its minimum lifetime refuses",
			rootTo: epoch.Add(40 * time.Minute), intTo: epoch.Add(year), wantTooSoon: true},
		{name: "an expired root refuses",
			rootTo: epoch.Add(-time.Minute), intTo: epoch.Add(year), minLifetime: 10 * time.Minute, wantTooSoon: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := intermediateAuthority(t, epoch.Add(-year), tc.rootTo, epoch.Add(-year), tc.intTo)
			leaf, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{
				Lifetime: time.Hour, MinLifetime: tc.minLifetime, Now: func() time.Time { return epoch },
			})
			if tc.wantTooSoon {
				if !errors.Is(err, authority.ErrCAExpiresTooSoon) {
					t.Fatalf("got %v, want ErrCAExpiresTooSoon", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !leaf.NotBefore.Equal(epoch) || !leaf.NotAfter.Equal(tc.wantEnd) {
				t.Fatalf("validity %s .. %s, want %s .. %s", leaf.NotBefore, leaf.NotAfter, epoch, tc.wantEnd)
			}
		})
	}
}

// corruptOnce is a CA key whose first signature is garbage, as from an HSM
// with a flaky device; later signatures are the key's own.
type corruptOnce struct {
	backends.Signer
	calls atomic.Int32
}

func (c *corruptOnce) SignContext(ctx context.Context, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	sig, err := c.Signer.SignContext(ctx, digest, opts)
	if err == nil && c.calls.Add(1) == 1 {
		sig = bytes.Clone(sig)
		sig[len(sig)/2] ^= 0xff
	}
	return sig, err
}

func (c *corruptOnce) Sign(_ io.Reader, digest []byte, opts crypto.SignerOpts) ([]byte, error) {
	return c.SignContext(context.Background(), digest, opts)
}

// One signature that does not verify is a device fault the caller retries
// (backends.ErrTransient), named as such (ErrBadSignature) with the key's
// URI; the retry issues.
func TestACorruptSignatureIsATransientDeviceFault(t *testing.T) {
	for _, alg := range []backends.Algorithm{backends.ECDSAP256SHA256, backends.RSA3072PSSSHA256, backends.Ed25519} {
		t.Run(string(alg), func(t *testing.T) {
			key, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
				URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: alg,
			})
			if err != nil {
				t.Fatal(err)
			}
			root, err := ca.SelfSign(context.Background(), key, ca.Options{Subject: pkix.Name{CommonName: "r"}, Lifetime: 24 * time.Hour, Now: func() time.Time { return epoch }})
			if err != nil {
				t.Fatal(err)
			}
			flaky := &corruptOnce{Signer: key}
			a, err := authority.New(root, nil, flaky)
			if err != nil {
				t.Fatal(err)
			}
			p := authority.Policy{Lifetime: time.Hour, Now: func() time.Time { return epoch }}
			_, err = a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), p)
			if !errors.Is(err, authority.ErrBadSignature) || !backends.IsTransient(err) {
				t.Fatalf("got %v, want ErrBadSignature and backends.ErrTransient", err)
			}
			if errors.Is(err, backends.ErrPermanent) {
				t.Fatalf("%v is also permanent", err)
			}
			var be *backends.Error
			if !errors.As(err, &be) || be.URI != key.URI() {
				t.Fatalf("got %v, want a backends.Error naming %s", err, key.URI())
			}
			if _, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), p); err != nil {
				t.Fatalf("retry after one bad signature: %v", err)
			}
		})
	}
}

// Leaves carry a subject key id and an authority key id equal to the CA's
// subject key id, so that chain builders find the issuer by key.
func TestLeavesCarryKeyIdentifiers(t *testing.T) {
	a := newAuthority(t, 24*time.Hour)
	leaf, err := a.Sign(context.Background(), &x509.Certificate{}, leafKey(t), authority.Policy{Lifetime: time.Hour, Now: func() time.Time { return epoch }})
	if err != nil {
		t.Fatal(err)
	}
	if len(a.Certificate().SubjectKeyId) != 20 {
		t.Fatalf("root subject key id %x, want 20 bytes", a.Certificate().SubjectKeyId)
	}
	if len(leaf.SubjectKeyId) != 20 || !bytes.Equal(leaf.AuthorityKeyId, a.Certificate().SubjectKeyId) {
		t.Fatalf("leaf SKI %x AKI %x, want 20 bytes and the root's SKI %x", leaf.SubjectKeyId, leaf.AuthorityKeyId, a.Certificate().SubjectKeyId)
	}
	// RFC 7093 method 1: SHA-256 of the subjectPublicKey bits, leftmost 160.
	var spki struct {
		Algorithm pkix.AlgorithmIdentifier
		PublicKey asn1.BitString
	}
	if _, err := asn1.Unmarshal(leaf.RawSubjectPublicKeyInfo, &spki); err != nil {
		t.Fatal(err)
	}
	if sum := sha256.Sum256(spki.PublicKey.Bytes); !bytes.Equal(leaf.SubjectKeyId, sum[:20]) {
		t.Fatalf("leaf SKI %x is not RFC 7093 method 1 (%x)", leaf.SubjectKeyId, sum[:20])
	}
}

// A leaf is served with the CA certificates below the root: none for a
// root CA, the intermediate alone for an intermediate under a root.
func TestIssuersPEMStopsAtTheRoot(t *testing.T) {
	year := 365 * 24 * time.Hour
	root := newAuthority(t, year)
	if got := root.IssuersPEM(); len(got) != 0 {
		t.Fatalf("a root CA serves %q, want nothing", got)
	}
	inter := intermediateAuthority(t, epoch.Add(-year), epoch.Add(year), epoch.Add(-time.Hour), epoch.Add(year))
	want := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: inter.Certificate().Raw})
	if got := inter.IssuersPEM(); !bytes.Equal(got, want) {
		t.Fatalf("an intermediate CA serves\n%s\nwant\n%s", got, want)
	}
}

// SignIntermediate makes a CA that signs leaves only (pathLen 0,
// certSign), inside the chain's validity, whatever the template asks; a
// chain whose path length allows no CA below is refused by name.
func TestSignIntermediateIsALeafOnlyCAInsideTheChain(t *testing.T) {
	key := newCAKey(t)
	root, err := ca.SelfSign(context.Background(), key, ca.Options{
		Subject: pkix.Name{CommonName: "root pathlen 1"}, Lifetime: 10 * time.Hour, PathLen: 1, Now: func() time.Time { return epoch },
	})
	if err != nil {
		t.Fatal(err)
	}
	a, err := authority.New(root, nil, key)
	if err != nil {
		t.Fatal(err)
	}
	intKey := newCAKey(t)
	now := epoch.Add(8 * time.Hour)
	tmpl := &x509.Certificate{Subject: pkix.Name{CommonName: "in memory"}, IsCA: false, MaxPathLen: 3, KeyUsage: x509.KeyUsageDigitalSignature}
	inter, err := a.SignIntermediate(context.Background(), tmpl, intKey.Public(), authority.Policy{
		Lifetime: 6 * time.Hour, Backdate: time.Minute, MinLifetime: time.Hour, Now: func() time.Time { return now },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !inter.IsCA || !inter.BasicConstraintsValid || inter.MaxPathLen != 0 || !inter.MaxPathLenZero {
		t.Errorf("intermediate basicConstraints CA=%v pathLen=%d zero=%v, want CA with pathLen 0", inter.IsCA, inter.MaxPathLen, inter.MaxPathLenZero)
	}
	if inter.KeyUsage != x509.KeyUsageCertSign {
		t.Errorf("keyUsage %v, want certSign only", inter.KeyUsage)
	}
	if !inter.NotAfter.Equal(root.NotAfter.Truncate(time.Second)) {
		t.Errorf("notAfter %s, want clamped to the root's %s", inter.NotAfter, root.NotAfter)
	}
	if err := inter.CheckSignatureFrom(root); err != nil {
		t.Fatal(err)
	}
	// It is an Authority of its own, whose leaves verify through it.
	ia, err := authority.New(inter, a.Chain(), intKey)
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := ia.Sign(context.Background(), &x509.Certificate{ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, leafKey(t),
		authority.Policy{Lifetime: time.Hour, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	inters.AddCert(inter)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("leaf under the intermediate: %v", err)
	}

	// The default root (pathLen 0) allows none.
	_, err = newAuthority(t, 10*time.Hour).SignIntermediate(context.Background(), tmpl, intKey.Public(), authority.Policy{
		Lifetime: time.Hour, Now: func() time.Time { return epoch.Add(time.Hour) },
	})
	if !errors.Is(err, authority.ErrNoPathForIntermediate) {
		t.Fatalf("under a pathLen 0 root: %v, want ErrNoPathForIntermediate", err)
	}
}
