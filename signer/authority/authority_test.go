package authority_test

import (
	"context"
	"crypto"
	"crypto/x509"
	"errors"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
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
	root, err := authority.SelfSignRoot(context.Background(), key, authority.RootOptions{
		CommonName: "test root", Lifetime: caLifetime, Now: func() time.Time { return epoch },
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
	a := newAuthority(t, 2*time.Hour) // root valid epoch-1h .. epoch+1h
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
	root, err := authority.SelfSignRoot(context.Background(), key, authority.RootOptions{CommonName: "r", Lifetime: 24 * time.Hour, Now: func() time.Time { return epoch }})
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
