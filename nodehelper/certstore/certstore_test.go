package certstore

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper"
)

// t0 is the tests' clock; certificates are valid from t0-1h to t0+24h.
var t0 = time.Date(2026, 11, 23, 16, 30, 5, 0, time.UTC)

type testCA struct {
	key  crypto.Signer
	cert *x509.Certificate
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test intermediate"},
		NotBefore: t0.Add(-24 * time.Hour), NotAfter: t0.Add(30 * 24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{key: key, cert: cert}
}

// chain issues a leaf for pub valid until notAfter and returns the chain
// (leaf, then the CA) as PEM.
func (ca *testCA) chain(t *testing.T, pub crypto.PublicKey, notAfter time.Time) []byte {
	t.Helper()
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "daemon"},
		NotBefore: t0.Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return slices.Concat(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}))
}

func newStore(t *testing.T, dir string) *Store {
	t.Helper()
	s, err := New(dir, "daemon")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// files lists dir's entries by name.
func files(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().Perm()
}

func sameKey(a, b crypto.Signer) bool { return samePublicKey(a.Public(), b.Public()) }

// commitNew makes a pending key and commits a chain for it at now.
func commitNew(t *testing.T, s *Store, ca *testCA, now time.Time) *Pair {
	t.Helper()
	key, _, err := s.Pending(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Commit(key, ca.chain(t, key.Public(), now.Add(24*time.Hour)), now)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNewAcceptsOnlyDNSLabelNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"identity", true},
		{"a", true},
		{"node-daemon-1", true},
		{"", false},
		{"Identity", false},
		{"-a", false},
		{"a-", false},
		{"a_b", false},
		{"a/b", false},
		{"..", false},
		{strings.Repeat("a", 64), false},
	} {
		t.Run(fmt.Sprintf("the name %q is accepted: %v", tc.name, tc.ok), func(t *testing.T) {
			_, err := New(t.TempDir(), tc.name)
			if (err == nil) != tc.ok {
				t.Fatalf("New(%q) error %v", tc.name, err)
			}
		})
	}
}

func TestNewDoesNoIO(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s := newStore(t, dir)
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("New touched the directory: %v", err)
	}
	if p, err := s.Current(); p != nil || err != nil {
		t.Fatalf("Current of an empty store = %v, %v; want nil, nil", p, err)
	}
	if s.CurrentPath() != filepath.Join(dir, "daemon-current.pem") {
		t.Fatalf("CurrentPath %s", s.CurrentPath())
	}
}

func TestPendingKeyIsPersistedAndResumed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	key, resumed, err := newStore(t, dir).Pending(nodehelper.KeyTypeECDSAP256)
	if err != nil || resumed {
		t.Fatalf("first Pending: resumed %v, %v", resumed, err)
	}
	if m := mode(t, dir); m != 0o700 {
		t.Errorf("directory mode %v, want 0700", m)
	}
	if m := mode(t, filepath.Join(dir, "daemon-pending.key")); m != 0o600 {
		t.Errorf("pending key mode %v, want 0600", m)
	}
	// A restart: a new Store over the same directory.
	again, resumed, err := newStore(t, dir).Pending(nodehelper.KeyTypeECDSAP256)
	if err != nil || !resumed || !sameKey(key, again) {
		t.Fatalf("Pending after a restart: resumed %v, same key %v, %v", resumed, sameKey(key, again), err)
	}

	t.Run("a pending key of another type than asked is replaced", func(t *testing.T) {
		other, resumed, err := newStore(t, dir).Pending(nodehelper.KeyTypeED25519)
		if err != nil || resumed || sameKey(key, other) || keyTypeOf(other) != nodehelper.KeyTypeED25519 {
			t.Fatalf("Pending(ED25519) = %T resumed %v, %v", other, resumed, err)
		}
	})
	t.Run("DiscardPending removes it, and a second discard is no error", func(t *testing.T) {
		s := newStore(t, dir)
		if err := s.DiscardPending(); err != nil {
			t.Fatal(err)
		}
		if err := s.DiscardPending(); err != nil {
			t.Fatal(err)
		}
		if got := files(t, dir); len(got) != 0 {
			t.Fatalf("files left: %v", got)
		}
	})
}

func TestCommitWritesKeyFirstPairAndSwapsCurrent(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	ca := newTestCA(t)
	key, _, err := s.Pending(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		t.Fatal(err)
	}
	// The apiserver may hand back text around the blocks; the pair file
	// holds the blocks only.
	chain := slices.Concat([]byte("issued by the test\n"), ca.chain(t, key.Public(), t0.Add(24*time.Hour)))
	p, err := s.Commit(key, chain, t0)
	if err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "daemon-2026-11-23-16-30-05.pem")
	if p.Path != want {
		t.Fatalf("pair path %s, want %s", p.Path, want)
	}
	if m := mode(t, want); m != 0o600 {
		t.Errorf("pair mode %v, want 0600", m)
	}
	data, err := os.ReadFile(want)
	if err != nil {
		t.Fatal(err)
	}
	var types []string
	var leafKey crypto.PublicKey
	for rest := data; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			if len(bytes.TrimSpace(rest)) > 0 {
				t.Errorf("text besides PEM blocks in the pair file: %q", rest)
			}
			break
		}
		types = append(types, b.Type)
		if len(types) == 2 {
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			leafKey = c.PublicKey
		}
	}
	if !slices.Equal(types, []string{"PRIVATE KEY", "CERTIFICATE", "CERTIFICATE"}) || !samePublicKey(key.Public(), leafKey) {
		t.Fatalf("pair blocks %v (second holds the key: %v), want the key, then the leaf, then the CA", types, samePublicKey(key.Public(), leafKey))
	}
	target, err := os.Readlink(s.CurrentPath())
	if err != nil || target != filepath.Base(want) {
		t.Fatalf("current link -> %q (%v), want the relative %q", target, err, filepath.Base(want))
	}
	cur, err := newStore(t, dir).Current()
	if err != nil || !sameKey(cur.Key, key) || cur.Path != want || len(cur.Chain) != 2 || !bytes.Equal(slices.Concat(cur.KeyPEM, cur.ChainPEM), data) {
		t.Fatalf("Current after a restart = %+v, %v", cur, err)
	}
	if got := files(t, dir); !slices.Equal(got, []string{"daemon-2026-11-23-16-30-05.pem", "daemon-current.pem"}) {
		t.Fatalf("files %v: the pending key should be gone", got)
	}
}

func TestCommitRefusesChainsThatDoNotFitTheKey(t *testing.T) {
	ca := newTestCA(t)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	for _, tc := range []struct {
		name  string
		chain []byte
		want  error
	}{
		{"text that is not PEM is a mismatch", []byte("not a certificate"), ErrMismatch},
		{"an empty chain is a mismatch", nil, ErrMismatch},
		{"a private key in the chain is a mismatch", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1}}), ErrMismatch},
		{"a leaf for another key is a mismatch", ca.chain(t, other.Public(), t0.Add(time.Hour)), ErrMismatch},
		{"the CA first and the leaf second is a mismatch", slices.Concat(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw}), ca.chain(t, key.Public(), t0.Add(time.Hour))), ErrMismatch},
		{"a leaf that expired is refused", ca.chain(t, key.Public(), t0.Add(-time.Second)), ErrExpired},
		{"a leaf that expires at the instant of commit is refused", ca.chain(t, key.Public(), t0), ErrExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newStore(t, dir)
			if _, err := s.Commit(key, tc.chain, t0); !errors.Is(err, tc.want) {
				t.Fatalf("Commit error %v, want %v", err, tc.want)
			}
			if got := files(t, dir); len(got) != 0 {
				t.Fatalf("a refused commit left files: %v", got)
			}
		})
	}
}

func TestCommitPrunesOldPairsButNeverTheCurrentOne(t *testing.T) {
	ca := newTestCA(t)
	t.Run("only the newest Keep pairs stay", func(t *testing.T) {
		dir := t.TempDir()
		s := newStore(t, dir)
		s.Keep = 2
		for i := range 4 {
			commitNew(t, s, ca, t0.Add(time.Duration(i)*time.Hour))
		}
		want := []string{"daemon-2026-11-23-18-30-05.pem", "daemon-2026-11-23-19-30-05.pem", "daemon-current.pem"}
		if got := files(t, dir); !slices.Equal(got, want) {
			t.Fatalf("files %v, want %v", got, want)
		}
	})
	t.Run("Keep 0 keeps five", func(t *testing.T) {
		dir := t.TempDir()
		s := newStore(t, dir)
		for i := range 7 {
			commitNew(t, s, ca, t0.Add(time.Duration(i)*time.Hour))
		}
		if got := files(t, dir); len(got) != DefaultKeep+1 || got[0] != "daemon-2026-11-23-18-30-05.pem" {
			t.Fatalf("files %v, want the newest %d pairs and the link", got, DefaultKeep)
		}
	})
	t.Run("a current pair older than the newest Keep (the clock went back) stays", func(t *testing.T) {
		dir := t.TempDir()
		s := newStore(t, dir)
		s.Keep = 1
		commitNew(t, s, ca, t0.Add(time.Hour))
		p := commitNew(t, s, ca, t0)
		want := []string{"daemon-2026-11-23-16-30-05.pem", "daemon-2026-11-23-17-30-05.pem", "daemon-current.pem"}
		if got := files(t, dir); !slices.Equal(got, want) {
			t.Fatalf("files %v, want %v", got, want)
		}
		if cur, err := s.Current(); err != nil || cur.Path != p.Path {
			t.Fatalf("Current %v, %v; want %s", cur, err, p.Path)
		}
	})
	t.Run("two commits within a second leave the later pair", func(t *testing.T) {
		dir := t.TempDir()
		s := newStore(t, dir)
		commitNew(t, s, ca, t0)
		p := commitNew(t, s, ca, t0.Add(500*time.Millisecond))
		if cur, err := s.Current(); err != nil || !sameKey(cur.Key, p.Key) {
			t.Fatalf("Current %v, %v; want the second pair", cur, err)
		}
		if got := files(t, dir); len(got) != 2 {
			t.Fatalf("files %v", got)
		}
	})
	t.Run("temporary files a crashed write left are removed", func(t *testing.T) {
		dir := t.TempDir()
		for _, n := range []string{".daemon-2026-11-23-16-30-05.pem.tmp-123", ".daemon-pending.key.tmp-9", ".daemon-current.pem.tmp-ab"} {
			if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		commitNew(t, newStore(t, dir), ca, t0)
		if got := files(t, dir); !slices.Equal(got, []string{"daemon-2026-11-23-16-30-05.pem", "daemon-current.pem"}) {
			t.Fatalf("files %v", got)
		}
	})
	t.Run("other stores' files and temporary files in the directory are left alone", func(t *testing.T) {
		dir := t.TempDir()
		foreign := []string{"daemon-b-2026-01-01-00-00-00.pem", ".daemon-b-current.pem.tmp-1", "daemon-notes.txt", "other-2020-01-01-00-00-00.pem"}
		for _, n := range foreign {
			if err := os.WriteFile(filepath.Join(dir, n), nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		s := newStore(t, dir)
		s.Keep = 1
		commitNew(t, s, ca, t0)
		commitNew(t, s, ca, t0.Add(time.Hour))
		for _, n := range foreign {
			if _, err := os.Stat(filepath.Join(dir, n)); err != nil {
				t.Errorf("%s: %v", n, err)
			}
		}
	})
}

// A crash (here: Commit stopped at a step, leaving what it left) at each
// point of a rotation leaves a store that a restart reads consistently and
// resumes: the same pending key while the new pair is not current, a new
// one once it is; the next commit cleans up.
func TestCrashAtEachStepOfCommitIsResumed(t *testing.T) {
	ca := newTestCA(t)
	for _, tc := range []struct {
		step string
		// swapped: the new pair is current after the crash.
		swapped bool
	}{
		{step: "pair"},
		{step: "link"},
		{step: "rename"}, // a temporary symlink is left beside current
		{step: "pending", swapped: true},
		{step: "prune", swapped: true},
	} {
		t.Run(fmt.Sprintf("a crash before %s resumes with the new pair current: %v", tc.step, tc.swapped), func(t *testing.T) {
			dir := t.TempDir()
			old := commitNew(t, newStore(t, dir), ca, t0)

			s := newStore(t, dir)
			crashed := errors.New("crash")
			s.crash = func(step string) error {
				if step == tc.step {
					return crashed
				}
				return nil
			}
			key, _, err := s.Pending(nodehelper.KeyTypeECDSAP256)
			if err != nil {
				t.Fatal(err)
			}
			chain := ca.chain(t, key.Public(), t0.Add(25*time.Hour))
			if _, err := s.Commit(key, chain, t0.Add(time.Hour)); !errors.Is(err, crashed) {
				t.Fatalf("Commit = %v, want the crash", err)
			}

			restarted := newStore(t, dir)
			cur, err := restarted.Current()
			if err != nil {
				t.Fatalf("Current after the crash: %v", err)
			}
			want := old.Key
			if tc.swapped {
				want = key
			}
			if !sameKey(cur.Key, want) {
				t.Fatalf("Current after the crash holds the %s key", map[bool]string{true: "old", false: "new"}[sameKey(cur.Key, old.Key)])
			}
			next, resumed, err := restarted.Pending(nodehelper.KeyTypeECDSAP256)
			if err != nil {
				t.Fatal(err)
			}
			if resumed != !tc.swapped || sameKey(next, key) == tc.swapped {
				t.Fatalf("Pending after the crash: resumed %v, same key as before %v; want %v", resumed, sameKey(next, key), !tc.swapped)
			}
			if !tc.swapped {
				// The request for key is resumed and its chain committed.
				if _, err := restarted.Commit(next, chain, t0.Add(time.Hour+time.Minute)); err != nil {
					t.Fatal(err)
				}
			} else {
				commitNew(t, restarted, ca, t0.Add(2*time.Hour))
			}
			for _, n := range files(t, dir) {
				if strings.HasPrefix(n, ".") || n == "daemon-pending.key" {
					t.Errorf("%s left after the next commit", n)
				}
			}
		})
	}
}

func TestPendingKeyEqualToCurrentIsReplaced(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	p := commitNew(t, s, newTestCA(t), t0)
	// As if the process died after swapping current, before removing the
	// pending key.
	if err := nodehelper.WriteFileAtomic(filepath.Join(dir, "daemon-pending.key"), p.KeyPEM, 0o600, true); err != nil {
		t.Fatal(err)
	}
	key, resumed, err := newStore(t, dir).Pending(nodehelper.KeyTypeECDSAP256)
	if err != nil || resumed || sameKey(key, p.Key) {
		t.Fatalf("Pending: resumed %v, the current key %v, %v; want a fresh key", resumed, sameKey(key, p.Key), err)
	}
	again, resumed, err := newStore(t, dir).Pending(nodehelper.KeyTypeECDSAP256)
	if err != nil || !resumed || !sameKey(again, key) {
		t.Fatalf("the fresh key was not persisted: resumed %v, %v", resumed, err)
	}
}

func TestCorruptCurrentIsAnErrorNotADeletion(t *testing.T) {
	ca := newTestCA(t)
	other, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	otherPEM, _ := nodehelper.MarshalPrivateKeyPEM(other)
	for _, tc := range []struct {
		name    string
		corrupt func(t *testing.T, p *Pair)
	}{
		{"a pair file of garbage", func(t *testing.T, p *Pair) {
			if err := os.WriteFile(p.Path, []byte("garbage"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a pair file whose key is not the leaf's", func(t *testing.T, p *Pair) {
			if err := os.WriteFile(p.Path, slices.Concat(otherPEM, p.ChainPEM), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a pair file with the chain first", func(t *testing.T, p *Pair) {
			if err := os.WriteFile(p.Path, slices.Concat(p.ChainPEM, p.KeyPEM), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"a link to a missing file", func(t *testing.T, p *Pair) {
			if err := os.Remove(p.Path); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newStore(t, dir)
			p := commitNew(t, s, ca, t0)
			tc.corrupt(t, p)
			before := files(t, dir)
			_, err := newStore(t, dir).Current()
			// The message is the point: it names the file to look at.
			if err == nil || !strings.Contains(err.Error(), s.CurrentPath()) {
				t.Fatalf("Current = %v, want an error naming %s", err, s.CurrentPath())
			}
			if got := files(t, dir); !slices.Equal(got, before) {
				t.Fatalf("files %v after Current, were %v", got, before)
			}
			// The way out is a new pair, committed over it.
			n := commitNew(t, newStore(t, dir), ca, t0.Add(time.Hour))
			if cur, err := s.Current(); err != nil || !sameKey(cur.Key, n.Key) {
				t.Fatalf("Current after a new commit: %v", err)
			}
		})
	}
}

func TestCurrentReadsAPlainFile(t *testing.T) {
	dir := t.TempDir()
	s := newStore(t, dir)
	p := commitNew(t, s, newTestCA(t), t0)
	if err := os.Remove(s.CurrentPath()); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.CurrentPath(), slices.Concat(p.KeyPEM, p.ChainPEM), 0o600); err != nil {
		t.Fatal(err)
	}
	if cur, err := s.Current(); err != nil || !sameKey(cur.Key, p.Key) || cur.Path != s.CurrentPath() {
		t.Fatalf("Current of a plain file = %+v, %v", cur, err)
	}
}

func TestStoreRefusesADirectoryOthersCanWrite(t *testing.T) {
	ca := newTestCA(t)
	cases := []struct {
		name string
		mode os.FileMode
		err  error
	}{
		{"a group-writable directory is refused", 0o770, ErrUnsafeDir},
		{"a world-writable directory is refused", 0o777, ErrUnsafeDir},
		{"a world-writable sticky directory (like /tmp) is refused", 0o777 | os.ModeSticky, ErrUnsafeDir},
		{"a directory others may only read is used", 0o755, nil},
		{"a 0700 directory is used", 0o700, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := newStore(t, dir)
			// Another user of that directory planted a key it knows as the
			// pending key: the next certificate would be issued for it.
			planted, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
			if err != nil {
				t.Fatal(err)
			}
			plantedPEM, err := nodehelper.MarshalPrivateKeyPEM(planted)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "daemon-pending.key"), plantedPEM, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.mode); err != nil {
				t.Fatal(err)
			}
			key, _, err := s.Pending(nodehelper.KeyTypeECDSAP256)
			if !errors.Is(err, tc.err) {
				t.Fatalf("Pending: err = %v, want %v", err, tc.err)
			}
			if _, err := s.Current(); !errors.Is(err, tc.err) {
				t.Fatalf("Current: err = %v, want %v", err, tc.err)
			}
			if tc.err == nil {
				return
			}
			if key != nil {
				t.Fatalf("Pending returned a key from an unsafe directory")
			}
			own, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Commit(own, ca.chain(t, own.Public(), t0.Add(time.Hour)), t0); !errors.Is(err, tc.err) {
				t.Fatalf("Commit: err = %v, want %v", err, tc.err)
			}
			if got := files(t, dir); !slices.Equal(got, []string{"daemon-pending.key"}) {
				t.Errorf("files = %q, want only the planted key (nothing written)", got)
			}
		})
	}
}

func TestPendingFileWithoutAKeyIsSetAsideAndReplaced(t *testing.T) {
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"an empty pending file (a write torn by a crash)", nil},
		{"a pending file of garbage", []byte("garbage")},
		{"a pending file with a damaged key", pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{0x30, 0x03, 1, 2, 3}})},
	} {
		t.Run(tc.name+" is set aside and a new key made, not an error on every try", func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "daemon-pending.key")
			if err := os.WriteFile(path, tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			s := newStore(t, dir)
			key, resumed, err := s.Pending(nodehelper.KeyTypeECDSAP256)
			if err != nil || resumed || key == nil {
				t.Fatalf("Pending = %v resumed %v, %v; want a new key", key, resumed, err)
			}
			again, resumed, err := s.Pending(nodehelper.KeyTypeECDSAP256)
			if err != nil || !resumed || !sameKey(key, again) {
				t.Fatalf("Pending after the replacement: resumed %v, same key %v, %v", resumed, sameKey(key, again), err)
			}
			bad, err := os.ReadFile(path + ".bad")
			if err != nil || !bytes.Equal(bad, tc.data) {
				t.Fatalf("the damaged file was not kept aside: %q, %v", bad, err)
			}
		})
	}
}
