package approver

// What the approver logs at default verbosity when a write is refused or a
// requester is not authorized, and what it forgets; each test names the
// fix it holds in place.

import (
	"bytes"
	"context"
	"strings"
	"testing"

	certificatesv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// defaultVerbosityLog runs one processNext on csr with a logger at the
// default verbosity (0) and returns what was logged.
func defaultVerbosityLog(t *testing.T, c *Controller, csr *certificatesv1.CertificateSigningRequest) string {
	t.Helper()
	r := c.rules[csr.Spec.SignerName]
	r.informer = cache.NewSharedIndexInformer(nil, &certificatesv1.CertificateSigningRequest{}, 0, cache.Indexers{})
	if err := r.informer.GetStore().Add(csr); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	ctx := klog.NewContext(context.Background(), textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&buf))))
	c.queue.Add(queueKey{signer: csr.Spec.SignerName, name: csr.Name})
	c.processNext(ctx)
	return buf.String()
}

// A newcomer who forgot the approver's `approve` grant on a signer name (or
// `update` on certificatesigningrequests/approval) gets a 403 on every
// write. Today that error is retried with backoff and logged only at V(2):
// at default verbosity the approver looks idle and healthy (/readyz ok)
// while nothing is ever approved.
//
// Fix (signer/approver/controller.go, processNext or write): when the
// UpdateApproval error is apierrors.IsForbidden, log at default verbosity
// (once per signer name, like pcr.PermissionGate.Refused) naming the signer
// name and the missing grant ("grant approve on signers <name> and update
// on certificatesigningrequests/approval; see deploy/kustomize/base/rbac.yaml"),
// and wait (waitError, e.g. 30 s) instead of exponential backoff.
func TestForbiddenApprovalIsLoggedAtDefaultVerbosity(t *testing.T) {
	c, client, _ := newTestController(t, nil)
	client.PrependReactor("update", "certificatesigningrequests", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if a.GetSubresource() != "approval" {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "certificates.k8s.io", Resource: "signers"}, kubeletServingName,
			errForbiddenForTest)
	})
	logged := defaultVerbosityLog(t, c, servingCSR(nil).build(t, "serving-forbidden"))
	if !strings.Contains(logged, kubeletServingName) || !strings.Contains(strings.ToLower(logged), "approve") {
		t.Errorf("a 403 on the approval write logged nothing naming the signer and the approve grant at default verbosity; got:\n%s", logged)
	}
}

// A kubelet bootstrap client CSR whose requester no SubjectAccessReview
// allows (the newcomer forgot the ClusterRoleBinding of
// system:certificates.k8s.io:certificatesigningrequests:nodeclient to
// system:bootstrappers) is retried forever with backoff and logged only at
// V(2): the node never joins and keyward says nothing.
//
// Fix (signer/approver/controller.go, syncKubeletClient/processNext): on
// errNotAuthorized log once per CSR at default verbosity, naming the user
// and the subresources tried and the ClusterRoles that grant them
// (…:nodeclient for bootstrap, …:selfnodeclient for renewal).
func TestUnauthorizedKubeletClientCSRIsLoggedAtDefaultVerbosity(t *testing.T) {
	c, _, _ := newTestController(t, nil)
	logged := defaultVerbosityLog(t, c, clientCSR("system:bootstrap:zzz", nil).build(t, "client-unauthorized"))
	if !strings.Contains(logged, "client-unauthorized") || !strings.Contains(logged, "nodeclient") {
		t.Errorf("a kubelet client CSR no SubjectAccessReview allows logged nothing at default verbosity; got:\n%s", logged)
	}
}

var errForbiddenForTest = forbiddenErr("user \"system:serviceaccount:keyward:keyward-approver\" cannot approve signers")

type forbiddenErr string

func (e forbiddenErr) Error() string { return string(e) }

// The approver runs for months: what it remembers per CSR (to log an
// unauthorized kubelet client CSR once) must go when the CSR does, or
// every CSR name it ever left undecided stays in memory.
func TestUnauthorizedCSRIsForgottenOnceDeleted(t *testing.T) {
	c, _, _ := newTestController(t, nil)
	csr := clientCSR("system:bootstrap:zzz", nil).build(t, "client-unauthorized")
	_ = defaultVerbosityLog(t, c, csr)
	if len(c.told) != 1 {
		t.Fatalf("told = %v after an unauthorized CSR, want its one entry", c.told)
	}
	r := c.rules[csr.Spec.SignerName]
	if err := r.informer.GetStore().Delete(csr); err != nil {
		t.Fatal(err)
	}
	// The deleted CSR's backoff retry comes round: sync finds nothing.
	c.queue.Add(queueKey{signer: csr.Spec.SignerName, name: csr.Name})
	c.processNext(context.Background())
	if len(c.told) != 0 {
		t.Errorf("told = %v after the CSR was deleted, want it forgotten", c.told)
	}
}
