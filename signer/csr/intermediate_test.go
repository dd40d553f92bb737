package csr

import (
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"path/filepath"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/file"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/signer/intermediate"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/testsupport/testca"
)

// intermediateIssuer is an in-memory intermediate of replica under a root
// of pathLen 1 whose key counts its signatures.
func intermediateIssuer(t *testing.T, root *authority.Authority, replica string) issuer.Issuer {
	t.Helper()
	iss, err := intermediate.New(issuer.Static{Authority: root, Generation: "g1"}, intermediate.Options{
		SignerName: unitName, Replica: replica, Validity: 3 * time.Hour, RenewBefore: time.Hour, MaxLifetime: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return iss
}

func pathLenOneRoot(t *testing.T) (*authority.Authority, *testca.CountingSigner) {
	t.Helper()
	key, err := file.New().CreateKey(context.Background(), backends.CreateKeyRequest{
		URI: "file:" + filepath.Join(t.TempDir(), "ca.pem"), Algorithm: backends.ECDSAP256SHA256})
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.SelfSign(context.Background(), key, ca.Options{Subject: pkix.Name{CommonName: "ca"}, Lifetime: 24 * time.Hour, PathLen: 1})
	if err != nil {
		t.Fatal(err)
	}
	counting := &testca.CountingSigner{Signer: key}
	a, err := authority.New(cert, nil, counting)
	if err != nil {
		t.Fatal(err)
	}
	return a, counting
}

// With signers[].intermediate, CSRs are signed by the in-memory
// intermediate: the CA key signs once for all of them, and
// status.certificate is the leaf then the intermediate (the root is not
// served), verifying against the root alone. A certificate another
// replica wrote first, through its own intermediate under the same CA, is
// recognised as ours, not as another signer's.
func TestCSRsAreSignedThroughTheInMemoryIntermediate(t *testing.T) {
	root, counting := pathLenOneRoot(t)
	s, _ := unitSigner(t)
	s.Issuer = intermediateIssuer(t, root, "replica-a")
	reqs := []string{"i1", "i2", "i3"}
	c, client := unitController(t, s, nil, unitCSR(t, reqs[0], unitName, true), unitCSR(t, reqs[1], unitName, true), unitCSR(t, reqs[2], unitName, true))
	for _, name := range reqs {
		if _, err := c.sync(context.Background(), queueKey{signer: unitName, name: name}); err != nil {
			t.Fatal(err)
		}
	}
	if n := counting.Signatures(); n != 1 {
		t.Fatalf("the CA key signed %d times for %d CSRs, want 1", n, len(reqs))
	}
	updates := statusUpdates(client)
	if len(updates) != len(reqs) {
		t.Fatalf("%d status updates, want %d", len(updates), len(reqs))
	}
	roots := x509.NewCertPool()
	roots.AddCert(root.Certificate())
	for _, u := range updates {
		certs := certificates(u.Status.Certificate)
		if len(certs) != 2 || !certs[1].IsCA || !certs[1].MaxPathLenZero {
			t.Fatalf("%s: status.certificate has %d certificates, want leaf then the intermediate", u.Name, len(certs))
		}
		inters := x509.NewCertPool()
		inters.AddCert(certs[1])
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Fatalf("%s: %v", u.Name, err)
		}
	}

	// Another replica's certificate, through its own intermediate.
	other := intermediateIssuer(t, root, "replica-b")
	auth, _, err := other.Current()
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := auth.Sign(context.Background(), &x509.Certificate{}, certificates(updates[0].Status.Certificate)[0].PublicKey, authority.Policy{Lifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	theirs := append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Raw}), auth.IssuersPEM()...)
	if !sameIssuers(updates[0].Status.Certificate, theirs) {
		t.Error("a leaf of another replica's intermediate under the same CA is taken for another signer's")
	}
	if sameIssuers(updates[0].Status.Certificate, foreignCertificate(t)) {
		t.Error("a foreign CA's leaf is taken for ours")
	}
}
