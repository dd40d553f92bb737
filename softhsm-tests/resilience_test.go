package softhsmtests

import (
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/faults"
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
	rs := runSigner(t, baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile)), "replica-0")
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
	for _, got := range reconcileIssued(t, len(burst), 60*time.Second, namespacesOf(w), logFileOf(rs.LogPath)) {
		parseChain(t, got.Status.CertificateChain, root)
	}
	if err := waitReady(rs.HealthAddr); err != nil {
		t.Errorf("/readyz after the outage: %v", err)
	}
}

// Two replicas run with the default (short) Lease; the leader is stopped
// in the middle of a burst, either gracefully (SIGTERM: it finishes the
// requests in flight and releases the Lease) or killed outright (SIGKILL).
// The standby, its caches warm, takes over and every request is issued
// once. The CA key is held by the AWS KMS fake, which records every digest
// it signed: each issued leaf's to-be-signed bytes must have been signed
// exactly once, and after a graceful stop no other signature exists. After
// SIGKILL, a request the dead leader had signed but not yet written is
// signed again by the next one: at most one per worker.
//
// The third way is the partition's: the leader is paused (SIGSTOP) while
// idle, the standby takes over and issues a second burst, and the old
// leader is resumed. Its caches and queue then hold the second burst as
// pending, and its elector has not yet noticed the loss; the fence
// (kubeclient.Fence), shut since its last renewal, keeps it from signing
// any of them: no wasted signature at all, and no "Signed" line from it
// after the resume.
func TestLeaderStoppedMidBurstIssuesEachRequestOnce(t *testing.T) {
	// The replicas are child processes: startKMS puts the fake's
	// credentials in the environment for them.
	kms, opts := startKMS(t)

	for _, way := range []string{"SIGTERM", "SIGKILL", "SIGSTOP"} {
		t.Run(way, func(t *testing.T) {
			ctx := testContext(t)
			suffix := uniqueName(t, "ha")
			name := "keyward.dev/ha-" + suffix
			keyURI, caFile, root := newCA(t, opts, kmsURI(kms), "ca-"+suffix)
			cfg := baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile))
			on := true
			cfg.LeaderElection = config.LeaderElection{Enabled: &on, Namespace: signerNamespace, LeaseName: "ha-" + suffix}
			cfg.Default()

			a := startSignerProcess(t, cfg, "replica-a")
			leaderDeadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(a.Output(), "Leading") {
				if time.Now().After(leaderDeadline) {
					t.Fatalf("replica-a never led:\n%s", a.Output())
				}
				time.Sleep(50 * time.Millisecond)
			}
			b := startSignerProcess(t, cfg, "replica-b")
			waitOutput(t, b, "Standing by")
			w := podOnNode(t, ctx, uniqueName(t, "node"), name)
			signedBefore := len(kms.SignRequests())

			first := createBurst(t, w, name, 20)
			var resumedAt int
			switch way {
			case "SIGTERM":
				a.Stop()
			case "SIGKILL":
				a.Kill()
			case "SIGSTOP":
				// Idle first: nothing in flight at the pause.
				reconcileIssued(t, len(first), 60*time.Second, namespacesOf(w), a.Output)
				a.Pause()
			}
			stopped := time.Now()
			second := createBurst(t, w, name, 20)
			if way == "SIGSTOP" {
				reconcileIssued(t, len(first)+len(second), 60*time.Second, namespacesOf(w), a.Output, b.Output)
				resumedAt = len(a.Output())
				a.Resume()
				// Long enough for its watch to deliver the second burst and
				// for its elector to give up (renewDeadline).
				time.Sleep(3 * time.Second)
			}

			// Both replicas' audit logs, the dead one's included; a killed
			// leader may have written statuses it never logged.
			unlogged := 0
			if way == "SIGKILL" {
				unlogged = cfg.Workers
			}
			pcrs := reconcileAfterKill(t, unlogged, len(first)+len(second), 60*time.Second, namespacesOf(w), a.Output, b.Output)
			leaves := leavesOf(t, pcrs, root)
			var lastIssued time.Time
			for _, got := range pcrs {
				if lt := got.Status.Conditions[0].LastTransitionTime.Time; lt.After(lastIssued) {
					lastIssued = lt
				}
			}
			wasted := checkOneSignatureEach(t, kms.SignRequests()[signedBefore:], leaves)
			t.Logf("%d issued, the last %s after the stop (lease %s); %d KMS signatures for no issued certificate",
				len(leaves), lastIssued.Sub(stopped).Round(time.Second), cfg.LeaderElection.LeaseDuration.Duration, wasted)
			switch way {
			case "SIGTERM", "SIGSTOP":
				if wasted != 0 {
					t.Errorf("%d KMS signatures for requests issued by another signature after %s, want 0", wasted, way)
				}
			case "SIGKILL":
				if wasted > cfg.Workers {
					t.Errorf("%d KMS signatures wasted by the kill, want at most one per worker (%d)", wasted, cfg.Workers)
				}
			}
			if way == "SIGSTOP" {
				if after := parseSignedLog(a.Output()[resumedAt:]); len(after) > 0 {
					t.Errorf("the paused leader signed %d requests after it was resumed, past its fence: %v", len(after), after)
				}
			}
			if !strings.Contains(b.Output(), "Leading") {
				t.Fatalf("replica-b never led:\n%s", b.Output())
			}
		})
	}
}

// tbsDigest is the SHA-256 of an issued PCR's leaf's to-be-signed bytes:
// what keyward asks the KMS to sign for it.
func tbsDigest(t *testing.T, p *certv1.PodCertificateRequest, root *x509.Certificate) string {
	t.Helper()
	leaf := parseChain(t, p.Status.CertificateChain, root)
	d := sha256.Sum256(leaf.RawTBSCertificate)
	return string(d[:])
}

// checkOneSignatureEach checks, from the AWS KMS fake's record of the
// digests it signed, that each issued leaf (digest → PCR name) was signed
// exactly once, and returns how many signatures match no issued leaf and
// are not readiness probes (wasted CA-key signatures).
func checkOneSignatureEach(t *testing.T, signed []awskmsfake.SignRequest, leaves map[string]string) int {
	t.Helper()
	probe := sha256.Sum256([]byte("keyward readiness probe"))
	perLeaf := map[string]int{}
	wasted := 0
	for _, r := range signed {
		switch {
		case leaves[string(r.Message)] != "":
			perLeaf[string(r.Message)]++
		case string(r.Message) == string(probe[:]):
		default:
			wasted++
		}
	}
	for d, pcr := range leaves {
		if perLeaf[d] != 1 {
			t.Errorf("%s: its certificate was signed %d times by the KMS, want 1", pcr, perLeaf[d])
		}
	}
	return wasted
}

// The KMS answers ServiceUnavailable to every call for a few seconds in
// the middle of a burst: every request is issued once it is back, none is
// Failed, and the KMS signed each certificate once and nothing else.
func TestKMSOutageDuringABurstSignsEachRequestOnce(t *testing.T) {
	kms, opts := startKMS(t)
	r := startKMSRun(t, kms, opts, "kms-outage")
	signedBefore := len(kms.SignRequests())

	kms.Inject(awskmsfake.Sign, awskmsfake.Fault{Code: "KMSInternalException"}, faults.Always)
	burst := createBurst(t, r.w, r.name, 20)
	time.Sleep(5 * time.Second)
	kms.ClearFaults()
	leaves := leavesOf(t, reconcileIssued(t, len(burst), 60*time.Second, namespacesOf(r.w), logFileOf(r.signer.LogPath)), r.root)
	if wasted := checkOneSignatureEach(t, kms.SignRequests()[signedBefore:], leaves); wasted != 0 {
		t.Errorf("%d KMS signatures for no issued certificate, want 0", wasted)
	}
}
