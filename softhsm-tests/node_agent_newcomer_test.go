package softhsmtests

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/nodehelper/agent"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// A node agent asking a signer name that no approver and no signer serve
// (a typo, or a signer not deployed yet) says so once at default verbosity
// when renewal.waitTimeout has passed; further tries look up the same CSR
// (one CSR in all), and client-go's "csr for this node already exists,
// reusing" (about a daemon's CSR, at every try) is not said at default
// verbosity.
func TestASignerNameNobodyServesMakesOneCSRAndNoReuseLinesAtDefaultVerbosity(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	node := uniqueName(t, "node")
	nodeCfg, err := cp.NodeConfig(node)
	if err != nil {
		t.Fatal(err)
	}
	signerName := "keyward.dev/" + uniqueName(t, "nobody-serves")
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := controlplane.WriteKubeconfig(nodeCfg, "system:node:"+node, kubeconfig); err != nil {
		t.Fatal(err)
	}
	exp := int32(3600)
	cfg := &agent.Configuration{
		APIVersion: agent.APIVersion, Kind: agent.Kind, NodeName: node, StateDir: filepath.Join(dir, "state"),
		Kubeconfig: kubeconfig, MetricsAddress: agent.Disabled, HealthAddress: agent.Disabled,
		Renewal: agent.Renewal{
			RetryInitial: metav1.Duration{Duration: 100 * time.Millisecond},
			RetryMax:     metav1.Duration{Duration: 200 * time.Millisecond},
			WaitTimeout:  metav1.Duration{Duration: 2 * time.Second},
		},
		Credentials: []agent.Credential{{Name: "daemon", SignerName: signerName, ExpirationSeconds: &exp,
			URIs: []string{"spiffe://cluster.local/node/${NODE_NAME}/daemon"}, Output: agent.Output{Dir: filepath.Join(dir, "out")}}},
	}
	a, err := agent.New(agent.Options{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	var logs lockedBuffer
	runCtx, stop := context.WithCancel(klog.NewContext(ctx,
		textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&logs)))))
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
		return a.Status()[0].Errors >= 3, nil
	}); err != nil {
		t.Fatalf("three waits did not time out: %v; status %+v", err, a.Status())
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	out := logs.String()
	var failures []string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "Renewing the credential failed") {
			failures = append(failures, line)
		}
	}
	if len(failures) != 1 || !strings.Contains(failures[0], "not issued within 2s") {
		t.Errorf("want one wait timeout at default verbosity; logs:\n%s", out)
	}
	if strings.Contains(out, "csr for this node") {
		t.Errorf("client-go's reuse lines at default verbosity; logs:\n%s", out)
	}
	csrs, err := cp.AdminClient().CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, c := range csrs.Items {
		if c.Spec.SignerName == signerName {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d CSRs for %s, want the one looked up again", n, signerName)
	}
}
