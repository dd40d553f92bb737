package csr

// A certificate another signer wrote into a CSR this signer serves is
// reported loudly; the test names the fix it holds in place.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// foreignCertificate is a PEM leaf signed by a CA that is not keyward's,
// as kube-controller-manager's csrsigning controller writes it from its
// --cluster-signing-cert-file.
func foreignCertificate(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(7), Subject: pkix.Name{CommonName: "kubernetes"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// A newcomer configures keyward for a kubernetes.io name but leaves
// kube-controller-manager's csrsigning controller running. Both sign every
// approved CSR; kube-apiserver keeps the first certificate written, so the
// cluster gets a random mix of certificates from the control-plane CA file
// and from the HSM, and keyward's HSM signature and lastIssuedNotAfter
// reservation are spent for nothing. Today write() sees the conflict, reads
// the fresh copy, finds it signed and returns silently: nothing at default
// verbosity says that another signer is issuing for this name.
//
// Fix (signer/csr/controller.go, write, the IsConflict branch where
// !pending(fresh) and len(fresh.Status.Certificate) > 0; and likewise the
// informer's UpdateFunc when a CSR it holds a record for gains a
// certificate it did not write): log once per signer name at default
// verbosity, e.g. logger.Error(nil, "Another signer wrote this CSR's
// certificate first; is kube-controller-manager's csrsigning controller
// still signing this name? (docs/signers.md, Handing the kubernetes.io
// names to keyward)", "csr", …, "signer", …, "issuer", <the written leaf's
// issuer DN>), and count it (outcome "SignedElsewhere"). Only when the
// written leaf was not issued by one of this name's CA generations (its
// issuer/AuthorityKeyId differs from auth.Chain()[0]'s subject/SubjectKeyId):
// a certificate of ours written first by the previous leader during a
// handover is not this mistake and stays at V(2).
func TestACertificateWrittenByAnotherSignerIsLoudAtDefaultVerbosity(t *testing.T) {
	s, counting := unitSigner(t)
	req := unitCSR(t, "both-sign", unitName, true)
	c, client := unitController(t, s, nil, req)
	foreign := foreignCertificate(t)
	client.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, req.Name, nil)
		}
		return false, nil, nil
	})
	// kube-controller-manager wrote first: the fresh copy holds its certificate.
	client.PrependReactor("get", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		fresh := req.DeepCopy()
		fresh.ResourceVersion = "2"
		fresh.Status.Certificate = foreign
		return true, fresh, nil
	})
	var buf bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&buf))))
	if _, err := c.sync(ctx, queueKey{signer: unitName, name: req.Name}); err != nil {
		t.Fatal(err)
	}
	if counting.Signatures() != 1 {
		t.Fatalf("signatures %d, want 1 (the one that lost the race)", counting.Signatures())
	}
	if logged := buf.String(); !strings.Contains(logged, "both-sign") || !strings.Contains(logged, "kube-controller-manager") {
		t.Errorf("losing the status write to another signer logged nothing pointing at kube-controller-manager at default verbosity; got:\n%s", logged)
	}
}
