package app

import (
	"bytes"
	"context"
	"github.com/keyward/keyward/demo"
	"github.com/keyward/keyward/testsupport/testregistry"
	"os"
	"strings"
	"testing"
	"time"
)

// `keyward demo --once` brings up the control plane and the token, prints how
// to reach them, issues a pod certificate and a node daemon's CSR, runs a whole canary-then-live
// rotation demo-1 → demo-2 through keyward's own commands (retire refused by
// LeavesValid, then forced with an Event) while the node helper's trust files
// on a canary and a live node follow it, and leaves nothing behind. Nothing
// it emitted (output, logs, metrics, Events, CSR/PCR/Authority status) holds
// a PIN, the SO-PIN, a private key or a token it obtained.
func TestDemoOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out bytes.Buffer
	t.Setenv(runAsKeyward, "1") // for the plugin, run as a child
	// Before the demo stops: everything it emitted, for the secret scan.
	var running demo.Running
	var sources map[string]string
	beforeStop := func(ctx context.Context, r demo.Running) error {
		running = r
		var err error
		sources, err = collectDemoEmissions(ctx, r, out.String())
		return err
	}
	if err := demo.Run(ctx, &out, withCommandLayer(demo.Options{Dir: dir, Once: true, RegistryBinary: testregistry.BuildBinary(t), Plugin: []string{os.Args[0]}, BeforeStop: beforeStop})); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	// No PIN, SO-PIN, private key, service-account or registry token in
	// any log, metric, Event or status.
	checkDemoSecrets(t, running, sources, out.String())
	for _, want := range []string{"control plane ready", "export KUBECONFIG=" + dir + "/admin.kubeconfig", "token label \"keyward-demo\"",
		"CA key created in SoftHSM", ": Issued in ", "PodIdentity (1.3.6.1.4.1.57683.1, non-critical)", "issuer:    CN=keyward demo CA demo-1",
		"trust publisher: generation demo-1 observed Active",
		// The node daemon's CSR for the custom signer name, with its own CA.
		"trust publisher: generation daemons-1 of keyward.dev/node-daemons observed Active",
		"by node-daemon:demo-node:log-shipper (node daemon, group keyward.dev:node-daemons) for keyward.dev/node-daemons: Approved by keyward approver (AutoApproved: ",
		"subject:   CN=log-shipper.demo-node\n    issuer:    CN=keyward demo node-daemons CA\n",
		"SANs:      log-shipper.demo-node\n",
		// The rotation: every phase reached, as status shows it.
		"authority/demo: generation demo-2 added (desired phase Staged)", "status:  demo-1 Active, demo-2 Staged",
		"status shows demo-2 Promoted", "status shows demo-2 Active",
		"status shows demo-1 Retiring", "status shows demo-1 Retired",
		// What kubelet's view of the bundles holds in the middle and at the end.
		"status:  demo-1 Promoted, demo-2 Active\ncanary:  CN=keyward demo CA demo-1, CN=keyward demo CA demo-2\nlive:    CN=keyward demo CA demo-1, CN=keyward demo CA demo-2\n",
		"status:  demo-1 Retired, demo-2 Active\ncanary:  CN=keyward demo CA demo-2\nlive:    CN=keyward demo CA demo-2\n",
		// Both leaves verify against live before finish; only the new one after.
		"issuer CN=keyward demo CA demo-2",
		"status:  demo-1 Retiring, demo-2 Active\ncanary:  CN=keyward demo CA demo-2\nlive:    CN=keyward demo CA demo-1, CN=keyward demo CA demo-2\n" +
			"leaf #1 (issued before activation), signed by keyward demo CA demo-1: verifies against live\n" +
			"leaf #2 (issued after activation), signed by keyward demo CA demo-2: verifies against live\n",
		"leaf #1 (issued before activation), signed by keyward demo CA demo-1: does NOT verify against live",
		// Retire refused by LeavesValid, then forced and recorded.
		"refused: demo-1 Promoted → Retiring: LeavesValid", "In production you would wait",
		"Warning GateOverridden authority/demo", "demo: compressed rotation",
		// The node helper's trust files: both old root only, then the canary
		// node's gains the new root while the live node's does not, both
		// end with the new root only.
		"trust file on demo-canary-node (keyward.dev/trust-bundle=canary): CN=keyward demo CA demo-1 [written]\n" +
			"trust file on demo-node (keyward.dev/trust-bundle=live): CN=keyward demo CA demo-1 [written]\n",
		"trust file on demo-canary-node (keyward.dev/trust-bundle=canary): CN=keyward demo CA demo-1, CN=keyward demo CA demo-2 [rewritten]\n" +
			"trust file on demo-node (keyward.dev/trust-bundle=live): CN=keyward demo CA demo-1 [unchanged]\n" +
			"  the canary node demo-canary-node trusts CN=keyward demo CA demo-2; the live node demo-node does not yet\n",
		"trust file on demo-canary-node (keyward.dev/trust-bundle=canary): CN=keyward demo CA demo-2 [unchanged]\n" +
			"trust file on demo-node (keyward.dev/trust-bundle=live): CN=keyward demo CA demo-2 [rewritten]\n",
		// The registry part: anonymous refused, the plugin's credential
		// pulls, a repository outside the policy refused, every grant audited.
		"generation tokens-1 of keyward.dev/registry-token observed Active",
		"anonymous:             registry answered 401",
		"keyward credential-provider answered: auth[",
		"realm (token service): token granting [repository:shop/hello:pull]",
		"with the token:        registry answered 200, manifest sha256:",
		"payments/ledger (not shop's): token granting [], registry answered 401 (insufficient_scope)",
		"Registry token granted",
		"total wall time"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
	if _, err := os.Stat(dir + "/admin.kubeconfig"); err != nil {
		t.Error(err)
	}
	if strings.Contains(out.String(), "eyJ") {
		t.Error("demo output contains a JWT (a service-account or registry token)")
	}
	if strings.Contains(out.String(), mustRead(t, dir+"/softhsm/keyward-demo.pin")) {
		t.Error("demo output contains the token PIN")
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
