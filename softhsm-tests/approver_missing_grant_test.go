package softhsmtests

// What the approver says, at default verbosity and against a real
// apiserver, when its identity lacks a grant; each test names the fix it
// holds in place.

import (
	"bytes"
	"context"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	certv1 "k8s.io/api/certificates/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// The newcomer path: README → docs/approver.md → copy its custom-name
// example (example.com/node-daemons) into the configuration, apply the
// shipped deploy/kustomize/base/rbac.yaml without rendering it again for
// the new name (it grants `approve` on the base's names only; TestMain's
// test-only grants add keyward.dev/* and the kubelet names) and run
// `keyward approver`.
// Every approval is refused with 403; the approver retries with backoff up
// to 1000 s, logs only at -v=2, and /readyz says ok: at default verbosity
// the newcomer sees nothing at all.
//
// Fix: see signer/approver/logging_test.go
// (TestForbiddenApprovalIsLoggedAtDefaultVerbosity): on a Forbidden
// UpdateApproval, log at default verbosity naming the signer name and the
// grant (`approve` on signers <name>, `keyward deploy rbac`); better still, check the grant at start with a
// SelfSubjectAccessReview per signer name (as signer/pcr.PermissionGate
// does for `sign`) and report it in the log and /readyz.
func TestApproverWithoutApproveGrantSaysSoAtDefaultVerbosity(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	installApproverRBAC(t, ctx)

	dir := t.TempDir()
	kubeconfig := serviceAccountKubeconfig(t, approverServiceAccount)
	path := filepath.Join(dir, "config.yaml")
	// docs/approver.md's example, with the test's requester allowed.
	data := fmt.Sprintf(`apiVersion: keyward.dev/v1alpha1
kind: SignerConfiguration
kubeClient: {kubeconfig: %q}
metricsAddress: 127.0.0.1:0
healthAddress: 127.0.0.1:0
leaderElection: {enabled: false}
signers:
- name: example.com/node-daemons
  profile: csr
  csr:
    trustDistribution: ClusterTrustBundle example.com:node-daemons:live
    commonNames: ["*.daemons.example.com"]
    dnsNames: ["*.daemons.example.com"]
    keyUsages: [digital signature, client auth]
  approval:
    groups: [system:masters, system:authenticated]
`, kubeconfig)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	runCtx, stop := context.WithCancel(klog.NewContext(context.Background(),
		textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&logs)))))
	done := make(chan error, 1)
	go func() {
		done <- approver.Run(runCtx, approver.RunOptions{Config: cfg, Identity: uniqueName(t, "approver")})
	}()
	defer func() { stop(); <-done }()

	c := createTestCSR(t, ctx, cp.AdminClient(), "example.com/node-daemons",
		pemCSR(t, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "d.daemons.example.com"}, DNSNames: []string{"d.daemons.example.com"}}),
		[]certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth})

	// Long enough for the first refusals (backoff 200 ms, 400 ms, …) on a
	// loaded machine; a passing run returns as soon as the line appears.
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 45*time.Second, true, func(context.Context) (bool, error) {
		l := logs.String()
		return strings.Contains(l, "example.com/node-daemons") && strings.Contains(strings.ToLower(l), "approve") &&
			strings.Contains(l, c.Name), nil
	})
	if err != nil {
		t.Errorf("CSR %s: the approver, refused `approve` on example.com/node-daemons, said nothing about it at default verbosity; its log:\n%s", c.Name, logs.String())
	}
}
