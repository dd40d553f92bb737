package csr

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"github.com/keyward/keyward/internal/workers"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/issuer"
	"github.com/keyward/keyward/testsupport/testca"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

const unitName = "keyward.dev/unit"

func unitSigner(t *testing.T) (*Signer, *testca.CountingSigner) {
	t.Helper()
	auth, counting := testca.New(t)
	p, err := NewPolicy(config.Signer{Name: unitName, Profile: config.ProfileKubeAPIServerClient, AllowedKeyTypes: config.AllKeyTypes(),
		MaxLifetime: metav1.Duration{Duration: time.Hour}, Backdate: &metav1.Duration{Duration: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	// kubeAPIServerClient's rules under a custom name: the unit tests are
	// about the controller, not the name.
	return &Signer{Policy: p, Issuer: issuer.Static{Authority: auth, Generation: "g1"}}, counting
}

func unitCSR(t *testing.T, name, signerName string, approved bool) *certv1.CertificateSigningRequest {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "alice"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	c := &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID(name + "-uid")},
		Spec: certv1.CertificateSigningRequestSpec{SignerName: signerName, Usages: []certv1.KeyUsage{certv1.UsageClientAuth},
			Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
	}
	if approved {
		c.Status.Conditions = []certv1.CertificateSigningRequestCondition{{Type: certv1.CertificateApproved, Status: corev1.ConditionTrue}}
	}
	return c
}

// unitController builds a controller over a fake clientset holding csrs,
// with its informer's store filled by hand.
func unitController(t *testing.T, s *Signer, rec record.EventRecorder, csrs ...*certv1.CertificateSigningRequest) (*Controller, *fake.Clientset) {
	t.Helper()
	var objs []runtime.Object
	for _, c := range csrs {
		objs = append(objs, c)
	}
	client := fake.NewClientset(objs...)
	c, err := New(Options{Client: client, Signers: []*Signer{s}, Recorder: rec})
	if err != nil {
		t.Fatal(err)
	}
	inf := cache.NewSharedIndexInformer(nil, &certv1.CertificateSigningRequest{}, 0, cache.Indexers{})
	c.informers = workers.Prepared(map[string]cache.SharedIndexInformer{s.Policy.Name: inf})
	for _, o := range csrs {
		_ = inf.GetIndexer().Add(o)
	}
	return c, client
}

func statusUpdates(client *fake.Clientset) []*certv1.CertificateSigningRequest {
	var out []*certv1.CertificateSigningRequest
	for _, a := range client.Actions() {
		if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
			out = append(out, u.GetObject().(*certv1.CertificateSigningRequest))
		}
	}
	return out
}

// Which CSRs the controller acts on: approved ones of its own name that
// have no certificate and no Denied or Failed condition; nothing else is
// written or signed.
func TestOnlyApprovedPendingCSRsOfItsNameAreSigned(t *testing.T) {
	with := func(c *certv1.CertificateSigningRequest, f func(*certv1.CertificateSigningRequest)) *certv1.CertificateSigningRequest {
		f(c)
		return c
	}
	cases := []struct {
		name     string
		csr      *certv1.CertificateSigningRequest
		wantSign bool
	}{
		{"an approved CSR is signed", unitCSR(t, "a", unitName, true), true},
		{"an unapproved CSR is left alone", unitCSR(t, "b", unitName, false), false},
		{"an approved CSR for another signer name is left alone", unitCSR(t, "c", "example.com/other", true), false},
		{"an approved and denied CSR is left alone", with(unitCSR(t, "d", unitName, true), func(c *certv1.CertificateSigningRequest) {
			c.Status.Conditions = append(c.Status.Conditions, certv1.CertificateSigningRequestCondition{Type: certv1.CertificateDenied, Status: corev1.ConditionTrue})
		}), false},
		{"an approved CSR already Failed is left alone", with(unitCSR(t, "e", unitName, true), func(c *certv1.CertificateSigningRequest) {
			c.Status.Conditions = append(c.Status.Conditions, certv1.CertificateSigningRequestCondition{Type: certv1.CertificateFailed, Status: corev1.ConditionTrue})
		}), false},
		{"an approved CSR with a certificate is left alone", with(unitCSR(t, "f", unitName, true), func(c *certv1.CertificateSigningRequest) {
			c.Status.Certificate = []byte("x")
		}), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, counting := unitSigner(t)
			c, client := unitController(t, s, nil, tc.csr)
			if _, err := c.sync(context.Background(), queueKey{signer: unitName, name: tc.csr.Name}); err != nil {
				t.Fatal(err)
			}
			updates := statusUpdates(client)
			if tc.wantSign {
				if counting.Signatures() != 1 || len(updates) != 1 || len(updates[0].Status.Certificate) == 0 {
					t.Fatalf("signatures %d, status updates %d; want one of each, with a certificate", counting.Signatures(), len(updates))
				}
				return
			}
			if counting.Signatures() != 0 || len(updates) != 0 {
				t.Fatalf("signatures %d, status updates %d; want none", counting.Signatures(), len(updates))
			}
		})
	}
}

// A status write that conflicts is retried with the certificate already
// signed for that UID, on a fresh copy: the CA key signs once.
func TestAConflictingWriteNeverSignsTwice(t *testing.T) {
	s, counting := unitSigner(t)
	req := unitCSR(t, "conflict", unitName, true)
	c, client := unitController(t, s, nil, req)
	conflicts := 2
	client.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && conflicts > 0 {
			conflicts--
			return true, nil, apierrors.NewConflict(schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests"}, req.Name, nil)
		}
		return false, nil, nil
	})
	if _, err := c.sync(context.Background(), queueKey{signer: unitName, name: req.Name}); err != nil {
		t.Fatal(err)
	}
	updates := statusUpdates(client)
	if counting.Signatures() != 1 || len(updates) != 3 {
		t.Fatalf("signatures %d, status writes %d; want 1 signature written three times", counting.Signatures(), len(updates))
	}
	for _, u := range updates[1:] {
		if string(u.Status.Certificate) != string(updates[0].Status.Certificate) {
			t.Fatal("a retry wrote another certificate")
		}
	}
	// A later pass (the informer still shows the old copy) signs nothing.
	if _, err := c.sync(context.Background(), queueKey{signer: unitName, name: req.Name}); err != nil {
		t.Fatal(err)
	}
	if counting.Signatures() != 1 {
		t.Fatalf("signatures %d after another pass, want 1", counting.Signatures())
	}
}

// A transient write error keeps the certificate: the retry writes it, and
// the CA key does not sign again.
func TestATransientWriteErrorRetriesTheSameCertificate(t *testing.T) {
	s, counting := unitSigner(t)
	req := unitCSR(t, "transient", unitName, true)
	c, client := unitController(t, s, nil, req)
	fail := true
	client.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() == "status" && fail {
			fail = false
			return true, nil, apierrors.NewServiceUnavailable("etcd is slow")
		}
		return false, nil, nil
	})
	key := queueKey{signer: unitName, name: req.Name}
	if _, err := c.sync(context.Background(), key); !apierrors.IsServiceUnavailable(err) {
		t.Fatalf("first sync = %v, want the transient error (retry)", err)
	}
	if _, err := c.sync(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	if counting.Signatures() != 1 {
		t.Fatalf("signatures %d, want 1", counting.Signatures())
	}
}

// A rule breaker gets one Failed condition naming the rule, a Warning
// Event, and no signature.
func TestARuleBreakerIsFailedWithAnEvent(t *testing.T) {
	s, counting := unitSigner(t)
	req := unitCSR(t, "server", unitName, true)
	req.Spec.Usages = []certv1.KeyUsage{certv1.UsageServerAuth}
	rec := record.NewFakeRecorder(10)
	c, client := unitController(t, s, rec, req)
	if _, err := c.sync(context.Background(), queueKey{signer: unitName, name: req.Name}); err != nil {
		t.Fatal(err)
	}
	updates := statusUpdates(client)
	if counting.Signatures() != 0 || len(updates) != 1 {
		t.Fatalf("signatures %d, status writes %d; want 0 and 1", counting.Signatures(), len(updates))
	}
	conds := updates[0].Status.Conditions
	last := conds[len(conds)-1]
	if last.Type != certv1.CertificateFailed || last.Status != corev1.ConditionTrue || last.Reason != ReasonUsagesNotPermitted || len(updates[0].Status.Certificate) > 0 {
		t.Fatalf("status %+v, want Failed %s without a certificate", updates[0].Status, ReasonUsagesNotPermitted)
	}
	select {
	case e := <-rec.Events:
		t.Logf("event: %s", e)
	default:
		t.Fatal("no Event recorded")
	}
}

// A spec.request that is no PKCS#10 request is Failed InvalidRequest.
func TestAnUnparsableRequestIsFailed(t *testing.T) {
	s, counting := unitSigner(t)
	req := unitCSR(t, "garbage", unitName, true)
	req.Spec.Request = []byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n")
	c, client := unitController(t, s, nil, req)
	if _, err := c.sync(context.Background(), queueKey{signer: unitName, name: req.Name}); err != nil {
		t.Fatal(err)
	}
	updates := statusUpdates(client)
	if counting.Signatures() != 0 || len(updates) != 1 {
		t.Fatalf("signatures %d, status writes %d; want 0 and 1", counting.Signatures(), len(updates))
	}
	if conds := updates[0].Status.Conditions; conds[len(conds)-1].Reason != ReasonInvalidRequest {
		t.Fatalf("conditions %+v, want Failed %s", conds, ReasonInvalidRequest)
	}
}

type refusals struct{ n int }

func (*refusals) Blocked(string) error                      { return nil }
func (r *refusals) Refused(context.Context, string, string) { r.n++ }

// A 403 is a missing grant only when RBAC says so: an admission webhook or
// policy that refuses the certificate fails this CSR (StatusRejected) and
// blocks nothing; RBAC's "cannot update resource" blocks the signer name.
func TestAForbiddenWriteIsAMissingGrantOnlyWhenRBACSaysSo(t *testing.T) {
	gr := schema.GroupResource{Group: "certificates.k8s.io", Resource: "certificatesigningrequests/status"}
	for _, tc := range []struct {
		name        string
		err         error
		wantRefused int
		wantFailed  bool
	}{
		{"an admission webhook", apierrors.NewForbidden(gr, "webhook", errors.New(`admission webhook "policy.example.com" denied the request: certificates need approval by the security team`)), 0, true},
		{"no sign grant", apierrors.NewForbidden(gr, "sign", errors.New(`user not permitted to sign requests with signerName "keyward.dev/unit"`)), 1, false},
		{"RBAC", apierrors.NewForbidden(gr, "rbac", errors.New(`User "system:serviceaccount:keyward:keyward-signer" cannot update resource "certificatesigningrequests/status" in API group "certificates.k8s.io" at the cluster scope`)), 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, counting := unitSigner(t)
			req := unitCSR(t, "forbidden", unitName, true)
			c, client := unitController(t, s, nil, req)
			perms := &refusals{}
			c.opts.Permissions = perms
			client.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
				u := a.(k8stesting.UpdateAction).GetObject().(*certv1.CertificateSigningRequest)
				if a.GetSubresource() == "status" && len(u.Status.Certificate) > 0 {
					return true, nil, tc.err
				}
				return false, nil, nil
			})
			wait, err := c.sync(context.Background(), queueKey{signer: unitName, name: req.Name})
			if err != nil {
				t.Fatal(err)
			}
			if perms.n != tc.wantRefused {
				t.Errorf("Refused called %d times, want %d", perms.n, tc.wantRefused)
			}
			var failed bool
			for _, u := range statusUpdates(client) {
				for _, cond := range u.Status.Conditions {
					if cond.Type == certv1.CertificateFailed && cond.Reason == ReasonStatusRejected {
						failed = true
					}
				}
			}
			if failed != tc.wantFailed {
				t.Errorf("Failed %s written: %v, want %v (wait %s)", ReasonStatusRejected, failed, tc.wantFailed, wait)
			}
			if counting.Signatures() != 1 {
				t.Errorf("signatures %d, want 1", counting.Signatures())
			}
		})
	}
}
