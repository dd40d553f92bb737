// Package certstore keeps a key and certificate pair on disk as kubelet's
// certificate store does, crash-safe: a pending key survives a restart
// (so the same CertificateSigningRequest is resumed), each issued pair is
// its own file <name>-<timestamp>.pem, and <name>-current.pem is a symlink
// swapped by one rename. Every file and the directory are fsynced, so a
// crash at any point leaves a state the next run resumes from.
//
// Files in the directory, for a store named n:
//
//	n-pending.key               the key being certified (PKCS#8 PEM, 0600)
//	n-pending.key.bad           a pending file that held no key, set aside
//	n-2006-01-02-15-04-05.pem   PRIVATE KEY block, then the chain leaf first (0600)
//	n-current.pem               symlink to the newest committed pair
//
// The directory is made 0700; one that another user could write to (group-
// or world-writable, or owned by neither this user nor root) is refused
// with ErrUnsafeDir, since whoever can plant n-pending.key there chooses
// the key the next certificate is issued for.
package certstore

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/nodehelper/atomicdir"
)

// DefaultKeep is how many pairs a Store keeps when Keep is 0.
const DefaultKeep = 5

// timeFormat names the pair files, as kubelet's certificate store does;
// it sorts in time order.
const timeFormat = "2006-01-02-15-04-05"

// Commit's refusals. Either means the request for that key is spent: a
// caller discards the pending key (DiscardPending) and asks again with a
// new one; resubmitting the same key finds the same request and chain.
var (
	// ErrMismatch: a chain to commit is no certificate chain for the key
	// (it does not parse, is empty, or its leaf holds another key).
	ErrMismatch = errors.New("chain does not belong to the key")
	// ErrExpired: the leaf of a chain to commit has expired.
	ErrExpired = errors.New("certificate has expired")
	// ErrUnsafeDir: the store's directory is writable by someone else than
	// this process's user or root (group- or world-writable, or owned by
	// another user), who could plant a pending key the next certificate is
	// issued for, or a current link; the store reads and writes nothing
	// there.
	ErrUnsafeDir = errors.New("certificate store directory is writable by others")
)

var validName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// Store is one named pair in a directory. A Store is not safe for
// concurrent use, nor are two processes meant to share a name.
type Store struct {
	dir, name string
	// Keep is how many pair files Commit keeps, newest first (0 means
	// DefaultKeep); the current pair is never removed.
	Keep int

	// crash, if set, is called at each step of Commit and Pending; an
	// error stops there, as a crash would (tests).
	crash func(step string) error
}

// Pair is a key with its certificate chain.
type Pair struct {
	Key      crypto.Signer
	KeyPEM   []byte // one PRIVATE KEY block (PKCS#8)
	ChainPEM []byte // CERTIFICATE blocks, leaf first
	Chain    []*x509.Certificate
	// Path is the pair's own file (<name>-<timestamp>.pem), which the
	// current symlink pointed to when it was read.
	Path string
}

// New returns the store called name in dir. name must be a DNS label
// ([a-z0-9]([-a-z0-9]*[a-z0-9])?, at most 63 characters). It does no I/O:
// the directory is made (0700) when a file is first written.
func New(dir, name string) (*Store, error) {
	if dir == "" {
		return nil, errors.New("certificate store: no directory")
	}
	if len(name) > 63 || !validName.MatchString(name) {
		return nil, fmt.Errorf("certificate store name %q: must be lower-case letters, digits and '-', start and end with a letter or digit, at most 63 characters", name)
	}
	return &Store{dir: dir, name: name}, nil
}

// CurrentPath is the current symlink, dir/<name>-current.pem: a KEP-4317
// credential bundle (PRIVATE KEY, then the chain).
func (s *Store) CurrentPath() string { return filepath.Join(s.dir, s.name+"-current.pem") }

func (s *Store) pendingPath() string { return filepath.Join(s.dir, s.name+"-pending.key") }

func (s *Store) pairPath(t time.Time) string {
	return filepath.Join(s.dir, s.name+"-"+t.UTC().Format(timeFormat)+".pem")
}

func (s *Store) step(name string) error {
	if s.crash == nil {
		return nil
	}
	return s.crash(name)
}

// Current reads the current pair: (nil, nil) if there is none yet, an
// error naming the file if it cannot be read or its key and leaf disagree.
// A bad current file is reported, never removed.
func (s *Store) Current() (*Pair, error) {
	if err := s.checkDir(); err != nil {
		return nil, err
	}
	path := s.CurrentPath()
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the current pair link %s: %w", path, err)
	}
	target := path // a plain file put there by hand is read all the same
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err = os.Readlink(path); err != nil {
			return nil, fmt.Errorf("reading the current pair link %s: %w", path, err)
		}
	}
	if !filepath.IsAbs(target) {
		target = filepath.Join(s.dir, target)
	}
	data, err := os.ReadFile(target)
	if err != nil {
		return nil, fmt.Errorf("reading the current pair %s: %w", path, err)
	}
	p, err := parsePair(data)
	if err != nil {
		return nil, fmt.Errorf("reading the current pair %s (%s): %w", path, target, err)
	}
	p.Path = target
	return p, nil
}

// parsePair reads a PRIVATE KEY block followed by a chain whose leaf holds
// that key.
func parsePair(data []byte) (*Pair, error) {
	b, rest := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("the first PEM block is not a PRIVATE KEY")
	}
	key, err := parseKey(b.Bytes)
	if err != nil {
		return nil, err
	}
	chain, err := pemcert.Parse(rest)
	if err != nil {
		return nil, fmt.Errorf("parsing the chain: %w", err)
	}
	if err := matches(key, chain); err != nil {
		return nil, err
	}
	return &Pair{Key: key, KeyPEM: pem.EncodeToMemory(b), ChainPEM: encodeChain(chain), Chain: chain}, nil
}

func parseKey(der []byte) (crypto.Signer, error) {
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the PKCS#8 private key: %w", err)
	}
	signer, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("a %T private key cannot sign", k)
	}
	return signer, nil
}

// matches says why chain is not a chain for key (ErrMismatch), or nil.
func matches(key crypto.Signer, chain []*x509.Certificate) error {
	if len(chain) == 0 {
		return fmt.Errorf("no certificate: %w", ErrMismatch)
	}
	if !samePublicKey(key.Public(), chain[0].PublicKey) {
		return fmt.Errorf("the leaf %q holds another public key than the private key's: %w", chain[0].Subject, ErrMismatch)
	}
	return nil
}

func samePublicKey(a, b crypto.PublicKey) bool {
	k, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && k.Equal(b)
}

func encodeChain(chain []*x509.Certificate) []byte {
	var buf bytes.Buffer
	for _, c := range chain {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

// Pending returns the key being certified: the one in <name>-pending.key,
// resumed, or a new key of keyType, written and fsynced before it is
// returned. A pending key that is not of keyType, or that is the current
// pair's key (a crash after Commit swapped the pair but before it removed
// the pending file), is replaced by a new one. So is a pending file that
// does not hold a key (a torn or damaged write): it is renamed
// <name>-pending.key.bad, replacing an earlier one, and nothing resumes it.
func (s *Store) Pending(keyType string) (key crypto.Signer, resumed bool, err error) {
	if err := s.checkDir(); err != nil {
		return nil, false, err
	}
	path := s.pendingPath()
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		key, err := readKeyPEM(data)
		if err != nil {
			// No request can be resumed with a key that does not parse,
			// and an error here would come back on every try, forever:
			// keep the bytes aside (one slot) and make a new key.
			if err := os.Rename(path, path+".bad"); err != nil {
				return nil, false, fmt.Errorf("setting aside the pending key %s, which holds no key: %w", path, err)
			}
			break
		}
		if keyTypeOf(key) == keyType && !s.isCurrentKey(key) {
			return key, true, nil
		}
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("reading the pending key %s: %w", path, err)
	}
	key, err = nodehelper.GenerateKey(keyType)
	if err != nil {
		return nil, false, err
	}
	keyPEM, err := nodehelper.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, false, err
	}
	if err := s.ensureDir(); err != nil {
		return nil, false, err
	}
	if err := s.step("pending-key"); err != nil {
		return nil, false, err
	}
	if err := nodehelper.WriteFileAtomic(path, keyPEM, 0o600, true); err != nil {
		return nil, false, fmt.Errorf("writing the pending key: %w", err)
	}
	return key, false, nil
}

func (s *Store) isCurrentKey(key crypto.Signer) bool {
	cur, err := s.Current()
	// An unreadable current pair is Current's to report; it holds no key
	// to compare with.
	return err == nil && cur != nil && samePublicKey(key.Public(), cur.Key.Public())
}

func readKeyPEM(data []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(data)
	if b == nil || b.Type != "PRIVATE KEY" {
		return nil, errors.New("no PRIVATE KEY PEM block")
	}
	return parseKey(b.Bytes)
}

// keyTypeOf names key as nodehelper.GenerateKey's key types do, or "".
func keyTypeOf(key crypto.Signer) string {
	switch k := key.(type) {
	case *rsa.PrivateKey:
		switch k.N.BitLen() {
		case 3072:
			return nodehelper.KeyTypeRSA3072
		case 4096:
			return nodehelper.KeyTypeRSA4096
		}
	case *ecdsa.PrivateKey:
		switch k.Curve {
		case elliptic.P256():
			return nodehelper.KeyTypeECDSAP256
		case elliptic.P384():
			return nodehelper.KeyTypeECDSAP384
		case elliptic.P521():
			return nodehelper.KeyTypeECDSAP521
		}
	case ed25519.PrivateKey:
		return nodehelper.KeyTypeED25519
	}
	return ""
}

// DiscardPending removes the pending key (after a refusal: the next try
// makes a new key and so a new request). No pending key is no error.
func (s *Store) DiscardPending() error {
	if err := os.Remove(s.pendingPath()); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("removing the pending key: %w", err)
	}
	return atomicdir.SyncDir(s.dir)
}

// Commit stores key with chainPEM (PEM, leaf first) as the current pair:
// it writes <name>-<now>.pem, swaps the current symlink to it, removes the
// pending key if it is key, and prunes pairs beyond the newest Keep. It
// refuses a chain that does not parse or whose leaf holds another key
// (ErrMismatch) and one whose leaf has expired at now (ErrExpired). Two
// commits within one second share a file name; the later replaces the
// earlier in one rename.
func (s *Store) Commit(key crypto.Signer, chainPEM []byte, now time.Time) (*Pair, error) {
	chain, err := pemcert.Parse(chainPEM)
	if err != nil {
		return nil, fmt.Errorf("parsing the chain to commit: %w: %w", ErrMismatch, err)
	}
	if err := matches(key, chain); err != nil {
		return nil, fmt.Errorf("committing a pair: %w", err)
	}
	if leaf := chain[0]; !now.Before(leaf.NotAfter) {
		return nil, fmt.Errorf("committing a pair: the leaf %q expired at %s: %w", leaf.Subject, leaf.NotAfter.UTC().Format(time.RFC3339), ErrExpired)
	}
	keyPEM, err := nodehelper.MarshalPrivateKeyPEM(key)
	if err != nil {
		return nil, err
	}
	p := &Pair{Key: key, KeyPEM: keyPEM, ChainPEM: encodeChain(chain), Chain: chain, Path: s.pairPath(now)}
	if err := s.ensureDir(); err != nil {
		return nil, err
	}
	if err := s.step("pair"); err != nil {
		return nil, err
	}
	if err := nodehelper.WriteFileAtomic(p.Path, slices.Concat(p.KeyPEM, p.ChainPEM), 0o600, true); err != nil {
		return nil, fmt.Errorf("writing the pair: %w", err)
	}
	if err := s.step("link"); err != nil {
		return nil, err
	}
	if err := s.swapCurrent(filepath.Base(p.Path)); err != nil {
		return nil, err
	}
	if err := s.step("pending"); err != nil {
		return nil, err
	}
	if err := s.removePendingIf(key); err != nil {
		return nil, err
	}
	if err := s.step("prune"); err != nil {
		return nil, err
	}
	if err := s.prune(); err != nil {
		return nil, err
	}
	return p, nil
}

// swapCurrent points the current symlink at target (a name in the
// directory) with one rename of a temporary symlink, then fsyncs the
// directory.
func (s *Store) swapCurrent(target string) error {
	cur := s.CurrentPath()
	suffix := make([]byte, 6)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	tmp := filepath.Join(s.dir, "."+filepath.Base(cur)+".tmp-"+hex.EncodeToString(suffix))
	if err := os.Symlink(target, tmp); err != nil {
		return fmt.Errorf("making the current pair link: %w", err)
	}
	if err := s.step("rename"); err != nil {
		return err // the temporary link stays, as after a crash
	}
	if err := os.Rename(tmp, cur); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("swapping the current pair link %s: %w", cur, err)
	}
	return atomicdir.SyncDir(s.dir)
}

func (s *Store) removePendingIf(key crypto.Signer) error {
	data, err := os.ReadFile(s.pendingPath())
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading the pending key: %w", err)
	}
	if pending, err := readKeyPEM(data); err != nil || !samePublicKey(key.Public(), pending.Public()) {
		return nil // not this pair's key: leave it to Pending
	}
	return s.DiscardPending()
}

// prune removes pair files beyond the newest Keep, never the current one,
// and temporary files a crash left behind.
func (s *Store) prune() error {
	keep := s.Keep
	if keep <= 0 {
		keep = DefaultKeep
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("listing %s: %w", s.dir, err)
	}
	current, _ := os.Readlink(s.CurrentPath())
	var pairs, stale []string
	for _, e := range entries {
		n := e.Name()
		switch {
		case s.isPairFile(n):
			pairs = append(pairs, n)
		case s.isTempFile(n):
			stale = append(stale, n)
		}
	}
	slices.Sort(pairs) // time order
	if len(pairs) > keep {
		for _, n := range pairs[:len(pairs)-keep] {
			if n != current {
				stale = append(stale, n)
			}
		}
	}
	if len(stale) == 0 {
		return nil
	}
	for _, n := range stale {
		if err := os.Remove(filepath.Join(s.dir, n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("pruning: %w", err)
		}
	}
	return atomicdir.SyncDir(s.dir)
}

// isPairFile says n is <name>-<timestamp>.pem.
func (s *Store) isPairFile(n string) bool {
	ts, ok := strings.CutPrefix(n, s.name+"-")
	if !ok {
		return false
	}
	ts, ok = strings.CutSuffix(ts, ".pem")
	if !ok {
		return false
	}
	_, err := time.Parse(timeFormat, ts)
	return err == nil
}

// isTempFile says n is a temporary file that WriteFileAtomic or
// swapCurrent left for one of the store's files: .<file>.tmp-<random>.
func (s *Store) isTempFile(n string) bool {
	rest, ok := strings.CutPrefix(n, ".")
	if !ok {
		return false
	}
	file, _, ok := strings.Cut(rest, ".tmp-")
	return ok && s.isOwnFile(file)
}

func (s *Store) isOwnFile(n string) bool {
	return n == s.name+"-current.pem" || n == s.name+"-pending.key" || s.isPairFile(n)
}

// ensureDir makes the directory (0700) if it is missing, and fsyncs its
// parent so the new directory survives a crash; an existing one must pass
// checkDir.
func (s *Store) ensureDir() error {
	if _, err := os.Stat(s.dir); err == nil {
		return s.checkDir()
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("making the certificate store directory: %w", err)
	}
	return atomicdir.SyncDir(filepath.Dir(s.dir))
}

// checkDir refuses (ErrUnsafeDir) a directory another user could write
// to: group- or world-writable (even with the sticky bit: a name not yet
// made can still be taken), or owned by neither this process's user nor
// root. A missing directory is no error.
func (s *Store) checkDir() error {
	fi, err := os.Stat(s.dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("checking the certificate store directory: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("certificate store directory %s is not a directory", s.dir)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("certificate store directory %s has mode %#o: %w (make it 0700)", s.dir, fi.Mode().Perm(), ErrUnsafeDir)
	}
	if uid, ok := ownerOf(fi); ok && uid != 0 && uid != os.Geteuid() {
		return fmt.Errorf("certificate store directory %s is owned by uid %d, not by this process's uid %d or root: %w", s.dir, uid, os.Geteuid(), ErrUnsafeDir)
	}
	return nil
}
