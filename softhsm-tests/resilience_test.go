package softhsmtests

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/controlplane"
	"github.com/keyward/keyward/signer/config"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// createBurst has the node create n PCRs for w's pod, concurrently. Errors
// are reported from the test's goroutine, never with t.Fatal from another.
func createBurst(t *testing.T, w *controlplane.WorkloadObjects, signerName string, n int) []*certv1.PodCertificateRequest {
	t.Helper()
	ctx := testContext(t)
	node := nodeClient(t, w.Node.Name)
	out := make([]*certv1.PodCertificateRequest, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], _, errs[i] = tryCreatePCR(ctx, node, w, signerName, pcrOptions{})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("creating a burst of %d PCRs: %v", n, err)
	}
	return out
}

// The CA key's HSM disappears for 30 seconds during a burst: every request
// is issued once it returns, none is Failed.
func TestBackendOutageDuringABurstLosesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("30-second outage")
	}
	ctx := testContext(t)
	suffix := uniqueName(t, "o")
	name := "keyward.dev/outage-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	rs := runSigner(t, baseConfig(t, signerConfig(name, config.ProfilePodIdentity, keyURI, caFile)), "replica-0")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	readyz := "http://" + rs.HealthAddr + "/readyz"

	// Take the token away: SoftHSM fails every call until it is back.
	tokens := hsmEnv.TokenDir()
	if err := os.Rename(tokens, tokens+".away"); err != nil {
		t.Fatal(err)
	}
	restored := false
	restore := func() {
		if !restored {
			restored = true
			if err := os.Rename(tokens+".away", tokens); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Cleanup(restore)
	outageStart := time.Now()
	burst := createBurst(t, w, name, 20)
	time.Sleep(3 * time.Second)
	for _, p := range burst {
		got, err := cp.AdminClient().CertificatesV1().PodCertificateRequests(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 {
			t.Fatalf("%s got a status while the HSM was away: %+v", p.Name, got.Status.Conditions)
		}
	}
	// The backend did not answer: the replica says so on /readyz.
	if err := httpOK(readyz); err == nil {
		t.Error("/readyz answered ok while the CA key's token was away")
	} else {
		t.Logf("/readyz during the outage: %v", err)
	}
	time.Sleep(30*time.Second - time.Since(outageStart))
	restore()
	for _, p := range burst {
		got := waitTerminal(t, ctx, p, 60*time.Second)
		if c := condition(got); c.Type != "Issued" {
			t.Fatalf("%s after the outage: %s/%s %q", p.Name, c.Type, c.Reason, c.Message)
		}
		parseChain(t, got.Status.CertificateChain, root)
	}
	if err := waitReady(rs.HealthAddr); err != nil {
		t.Errorf("/readyz after the outage: %v", err)
	}
}

// Two replicas run; the leader is killed (SIGKILL, no lease release) in
// the middle of a burst. The standby takes over and every request is issued
// exactly once: one status, and no PCR in both replicas' audit logs.
func TestLeaderKilledMidBurstIssuesEachRequestOnce(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "ha")
	name := "keyward.dev/ha-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	cfg := baseConfig(t, signerConfig(name, config.ProfilePodIdentity, keyURI, caFile))
	on := true
	cfg.LeaderElection = config.LeaderElection{Enabled: &on, Namespace: signerNamespace, LeaseName: "ha-" + suffix,
		LeaseDuration: metav1.Duration{Duration: 4 * time.Second}, RenewDeadline: metav1.Duration{Duration: 3 * time.Second},
		RetryPeriod: metav1.Duration{Duration: 500 * time.Millisecond}}

	a := startSignerProcess(t, cfg, "replica-a")
	leaderDeadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(a.Output(), "Leading") {
		if time.Now().After(leaderDeadline) {
			t.Fatalf("replica-a never led:\n%s", a.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	b := startSignerProcess(t, cfg, "replica-b")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)

	first := createBurst(t, w, name, 20)
	a.Kill()
	killed := time.Now()
	second := createBurst(t, w, name, 20)

	var lastIssued time.Time
	var totalA, totalB int
	for _, p := range append(first, second...) {
		got := waitTerminal(t, ctx, p, 60*time.Second)
		if c := condition(got); c.Type != "Issued" {
			t.Fatalf("%s: %s/%s %q", p.Name, c.Type, c.Reason, c.Message)
		}
		parseChain(t, got.Status.CertificateChain, root)
		if lt := got.Status.Conditions[0].LastTransitionTime.Time; lt.After(lastIssued) {
			lastIssued = lt
		}
		issuedA, issuedB := countIssued(a.Output(), p), countIssued(b.Output(), p)
		if issuedA+issuedB > 1 {
			t.Fatalf("%s issued more than once (replica-a: %d, replica-b: %d)", p.Name, issuedA, issuedB)
		}
		totalA += issuedA
		totalB += issuedB
	}
	t.Logf("all 40 issued (audit lines: replica-a %d, replica-b %d); the last %s after the kill (lease duration 4s)",
		totalA, totalB, lastIssued.Sub(killed).Round(time.Second))
	if totalB < len(second) {
		t.Fatalf("replica-b logged %d issuances, want at least the %d made after the kill", totalB, len(second))
	}
	if !strings.Contains(b.Output(), "Leading") {
		t.Fatalf("replica-b never led:\n%s", b.Output())
	}
}

// countIssued counts audit lines "Issued" for p in a replica's log.
func countIssued(log string, p *certv1.PodCertificateRequest) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"Issued"`) && strings.Contains(line, fmt.Sprintf(`pcr="%s/%s"`, p.Namespace, p.Name)) {
			n++
		}
	}
	return n
}
