package app

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
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/credbundle"
)

// verifyFixture is a root, an intermediate it signed and a leaf the
// intermediate signed, valid around now.
type verifyFixture struct {
	now                     time.Time
	root, inter, leaf       *x509.Certificate
	rootKey, leafKey        crypto.Signer
	otherRoot               *x509.Certificate
	leafPEM, interPEM       []byte
	rootPEM, otherRootPEM   []byte
	leafKeyPEM, otherKeyPEM []byte
}

func newVerifyFixture(t *testing.T) *verifyFixture {
	t.Helper()
	f := &verifyFixture{now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(0)
	issue := func(subject string, ca bool, pub crypto.PublicKey, parent *x509.Certificate, parentKey crypto.Signer) (*x509.Certificate, []byte) {
		serial++
		tmpl := &x509.Certificate{
			SerialNumber:          big.NewInt(serial),
			Subject:               pkix.Name{CommonName: subject},
			NotBefore:             f.now.Add(-time.Hour),
			NotAfter:              f.now.Add(24 * time.Hour),
			BasicConstraintsValid: true,
			IsCA:                  ca,
		}
		if ca {
			tmpl.KeyUsage = x509.KeyUsageCertSign
		} else {
			tmpl.KeyUsage = x509.KeyUsageDigitalSignature
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
		}
		if parent == nil {
			parent = tmpl
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return c, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	keyPEM := func(k crypto.Signer) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}
	rk, ik, lk, ok := key(), key(), key(), key()
	f.root, f.rootPEM = issue("root", true, rk.Public(), nil, rk)
	f.inter, f.interPEM = issue("intermediate", true, ik.Public(), f.root, rk)
	f.leaf, f.leafPEM = issue("system:serviceaccount:keyward:keyward-test", false, lk.Public(), f.inter, ik)
	f.otherRoot, f.otherRootPEM = issue("another root", true, ok.Public(), nil, ok)
	f.leafKeyPEM, f.otherKeyPEM = keyPEM(lk), keyPEM(ok)
	return f
}

func TestNodeVerify(t *testing.T) {
	f := newVerifyFixture(t)
	good := bytes.Join([][]byte{f.leafKeyPEM, f.leafPEM, f.interPEM}, nil)
	cases := []struct {
		name    string
		bundle  []byte
		trust   []byte // nil: no --trust-bundle
		now     time.Time
		wantErr error // nil: success
		wantAs  any   // a pointer for errors.As
		wantOut string
	}{
		{name: "a bundle whose leaf chains through its intermediate to the trust bundle passes", bundle: good, trust: f.rootPEM, now: f.now, wantOut: `chains to "CN=root"`},
		{name: "without a trust bundle only the key and the validity are checked", bundle: good, now: f.now, wantOut: "key matches leaf"},
		{name: "a key that is not the leaf's fails", bundle: bytes.Join([][]byte{f.otherKeyPEM, f.leafPEM, f.interPEM}, nil), now: f.now, wantErr: credbundle.ErrKeyMismatch},
		{name: "a bundle without a key fails", bundle: bytes.Join([][]byte{f.leafPEM, f.interPEM}, nil), now: f.now, wantErr: credbundle.ErrNoKey},
		{name: "an expired leaf fails", bundle: good, trust: f.rootPEM, now: f.now.Add(48 * time.Hour), wantErr: ErrNotValidNow},
		{name: "a leaf not yet valid fails", bundle: good, now: f.now.Add(-2 * time.Hour), wantErr: ErrNotValidNow},
		{name: "a leaf chaining to another root fails", bundle: good, trust: f.otherRootPEM, now: f.now, wantAs: new(x509.UnknownAuthorityError)},
		{name: "a bundle missing its intermediate fails", bundle: bytes.Join([][]byte{f.leafKeyPEM, f.leafPEM}, nil), trust: f.rootPEM, now: f.now, wantAs: new(x509.UnknownAuthorityError)},
		{name: "an empty trust bundle fails", bundle: good, trust: []byte("\n"), now: f.now, wantErr: credbundle.ErrNoCertificate},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			o := &nodeVerifyOptions{bundle: filepath.Join(dir, "credential-bundle.pem"), now: func() time.Time { return tc.now }}
			if err := os.WriteFile(o.bundle, tc.bundle, 0o600); err != nil {
				t.Fatal(err)
			}
			if tc.trust != nil {
				o.trust = filepath.Join(dir, "ca.pem")
				if err := os.WriteFile(o.trust, tc.trust, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			cmd := newNodeVerifyCommand()
			var out bytes.Buffer
			cmd.SetOut(&out)
			err := o.run(cmd)
			switch {
			case tc.wantErr != nil:
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("err = %v, want %v", err, tc.wantErr)
				}
			case tc.wantAs != nil:
				if err == nil || !errors.As(err, tc.wantAs) {
					t.Fatalf("err = %v, want a %T", err, tc.wantAs)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(out.String(), tc.wantOut) {
					t.Errorf("output %q lacks %q", out.String(), tc.wantOut)
				}
			}
		})
	}
}

// The command is wired under `keyward node` and refuses to run without a
// bundle.
func TestNodeVerifyNeedsABundle(t *testing.T) {
	root := NewCommand()
	root.SetArgs([]string{"node", "verify"})
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "--credential-bundle") {
		t.Fatalf("keyward node verify without flags: %v, want a --credential-bundle error", err)
	}
}
