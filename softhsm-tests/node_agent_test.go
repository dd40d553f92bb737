package softhsmtests

import (
	"bytes"
	"context"
	"crypto"
	"crypto/x509"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/credbundle"
	"github.com/keyward/keyward/nodehelper/trust"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The daemon every test's agent manages, and the files it writes.
const (
	daemonCredential = "log-shipper"
	bundleFile       = "credential-bundle.pem"
	keyFile          = "key.pem"
	chainFile        = "chain.pem"
)

// daemonCredentialYAML is a credentials[] entry for daemonCredential under
// k's node-daemon signer name, written to out: a 10-minute certificate
// (the apiserver's minimum) named with ${NODE_NAME}, so one configuration
// serves every node of a DaemonSet.
func daemonCredentialYAML(k *nodeKeyward, out string) string {
	return fmt.Sprintf(`- name: %s
  signerName: %s
  commonName: "log-shipper.${NODE_NAME}"
  dnsNames: ["log-shipper.${NODE_NAME}"]
  expirationSeconds: 600
  output: {dir: %q, keyFile: %s, chainFile: %s}
`, daemonCredential, k.DaemonSigner, out, keyFile, chainFile)
}

// The agent, as the node identity (the node's kubeconfig), gets a
// node-daemon certificate through a CSR that keyward's approver approves
// and keyward signs with its CA key in SoftHSM, and writes it as
// specified: the KEP-4317 bundle (PRIVATE KEY, then the chain leaf first)
// plus key and chain files, mode 0600, through atomicdir's ..data
// symlink; its pair store holds <name>-current.pem -> <name>-<ts>.pem.
func TestNodeAgentGetsNodeDaemonCertificate(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	k := startNodeKeyward(t, ctx, node)
	k.startApprover(t)
	out, state := t.TempDir(), newStateDir(t)
	cfg := writeAgentConfig(t, node, state, kubeconfigLine(writeNodeKubeconfig(t, cp.URL, node)), "credentials:\n"+daemonCredentialYAML(k, out))
	a := startAgent(t, cfg)

	b := waitBundle(t, ctx, out, nil)
	want := k.daemonName("log-shipper")
	leaf := b.leaf()
	if leaf.Subject.CommonName != want || !slices.Equal(leaf.DNSNames, []string{want}) {
		t.Errorf("leaf CN %q DNS %v, want %q for both (${NODE_NAME} replaced)", leaf.Subject.CommonName, leaf.DNSNames, want)
	}
	verifyChain(t, b.chain, k.DaemonRoot, x509.ExtKeyUsageClientAuth)
	if d := leaf.NotAfter.Sub(leaf.NotBefore); d != 10*time.Minute {
		t.Errorf("lifetime %s, want the 10m asked", d)
	}

	// The files: symlinks into one ..data directory, modes, key and chain
	// files equal to the bundle's parts. (On the first write atomicdir
	// links the names one after the other once ..data exists, as
	// kubelet's atomic writer does: wait for all three.)
	waitLinked(t, ctx, out, bundleFile, keyFile, chainFile)
	checkAtomicLayout(t, out, bundleFile, keyFile, chainFile)
	for name, mode := range map[string]os.FileMode{bundleFile: 0o600, keyFile: 0o600} {
		if m := fileMode(t, filepath.Join(out, name)); m != mode {
			t.Errorf("%s mode %v, want %v", name, m, mode)
		}
	}
	files, err := atomicdir.Read(out, bundleFile, keyFile, chainFile)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(files[keyFile], b.keyPEM) || !bytes.Equal(files[chainFile], b.chainPEM) {
		t.Errorf("key.pem and chain.pem are not the bundle's key and chain:\nbundle:\n%s\nkey:\n%s\nchain:\n%s", files[bundleFile], files[keyFile], files[chainFile])
	}

	// The pair store: <name>-current.pem -> <name>-<timestamp>.pem in the
	// same directory, 0600, the same key and chain.
	stored := checkPairStore(t, state, daemonCredential)
	if !sameCredential(stored, b) {
		t.Errorf("the pair store's current pair is not what the output holds")
	}

	// One CSR, by the node, approved by keyward's approver, signed, for
	// the key in the files.
	csrs := csrsOf(t, ctx, k.DaemonSigner, "system:node:"+node)
	if len(csrs) != 1 {
		t.Fatalf("%d CSRs by the node for %s, want 1: %v", len(csrs), k.DaemonSigner, csrNames(csrs))
	}
	approvedByKeyward(t, csrs)
	if !csrFor(t, csrs[0], b) {
		t.Errorf("CSR %s is not for the key in the files", csrs[0].Name)
	}

	// Status, metrics and health say so.
	// (Both are updated around the write, so the test polls briefly.)
	eventually(t, ctx, func() (bool, string) {
		st := a.status(t, daemonCredential)
		return st.NotAfter.Equal(leaf.NotAfter) && st.Errors == 0 && st.Renewals == 1,
			fmt.Sprintf("status %+v, want NotAfter %s, one renewal, no errors", st, leaf.NotAfter)
	})
	eventually(t, ctx, func() (bool, string) {
		v := metricValue(t, a.metrics, "keyward_node_credential_expiration_seconds", `credential="`+daemonCredential+`"`)
		return int64(v) == leaf.NotAfter.Unix(), fmt.Sprintf("keyward_node_credential_expiration_seconds = %v, want %d", v, leaf.NotAfter.Unix())
	})
	if code, body := httpGet(t, "http://"+a.health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %s", code, body)
	}
}

// KEP-266 with a real bootstrap token: with no identity yet, the agent
// asks kubernetes.io/kube-apiserver-client-kubelet for system:node:<name>
// as system:bootstrap:<id>; keyward's approver approves it (nodeclient)
// and keyward signs it. From then on the agent is the node: its daemon
// CSR and its identity renewal are made as system:node:<name>.
func TestNodeAgentBootstrapsThenRenewsWithItsOwnIdentity(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	k := startNodeKeyward(t, ctx, node)
	bindBootstrappers(t, ctx)
	tok := newBootstrapToken(t, ctx)
	// The token is real: the apiserver's bootstrap authenticator says who
	// it is.
	waitAuthenticatesAs(t, ctx, tokenConfig(cp.URL, tok), tok.User())
	k.startApprover(t)

	out, state := t.TempDir(), newStateDir(t)
	cfg := writeAgentConfig(t, node, state,
		fmt.Sprintf("bootstrap: {kubeconfig: %q, expirationSeconds: 600}", writeBootstrapKubeconfig(t, cp.URL, tok)),
		"credentials:\n"+daemonCredentialYAML(k, out))
	a := startAgent(t, cfg)

	kubeletClient := certv1.KubeAPIServerClientKubeletSignerName
	first := waitStoredPair(t, ctx, state, "identity", nil)
	identityLeaf := first.leaf()
	if identityLeaf.Subject.CommonName != "system:node:"+node || !slices.Equal(identityLeaf.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("identity subject %s, want CN=system:node:%s, O=system:nodes", identityLeaf.Subject, node)
	}
	verifyChain(t, first.chain, k.KubeletRoot, x509.ExtKeyUsageClientAuth)
	boot := csrsOf(t, ctx, kubeletClient, tok.User())
	if len(boot) != 1 {
		t.Fatalf("%d kubelet client CSRs by %s, want 1: %v", len(boot), tok.User(), csrNames(boot))
	}
	approvedByKeyward(t, boot)
	if !csrFor(t, boot[0], first) {
		t.Errorf("the bootstrap CSR %s is not for the identity key", boot[0].Name)
	}

	// The daemon credential is asked for as the node, with the identity
	// keyward issued.
	waitBundle(t, ctx, out, nil)
	if daemon := csrsOf(t, ctx, k.DaemonSigner, "system:node:"+node); len(daemon) != 1 {
		t.Errorf("%d daemon CSRs by system:node:%s, want 1 (all: %v)", len(daemon), node, csrNames(csrsOf(t, ctx, k.DaemonSigner, "")))
	}

	// Renewal of the identity, as the identity.
	if err := a.agent.RenewNow("identity"); err != nil {
		t.Fatalf("RenewNow(identity): %v", err)
	}
	second := waitStoredPair(t, ctx, state, "identity", identityLeaf)
	verifyChain(t, second.chain, k.KubeletRoot, x509.ExtKeyUsageClientAuth)
	renewals := csrsOf(t, ctx, kubeletClient, "system:node:"+node)
	if len(renewals) != 1 {
		t.Fatalf("%d kubelet client CSRs by system:node:%s, want 1 (the renewal): %v", len(renewals), node, csrNames(renewals))
	}
	if renewals[0].Spec.Username != "system:node:"+node {
		t.Errorf("renewal CSR %s made by %q, want system:node:%s", renewals[0].Name, renewals[0].Spec.Username, node)
	}
	approvedByKeyward(t, renewals)
	if !csrFor(t, renewals[0], second) {
		t.Errorf("the renewal CSR %s is not for the new identity key", renewals[0].Name)
	}
	if n := len(csrsOf(t, ctx, kubeletClient, tok.User())); n != 1 {
		t.Errorf("%d CSRs by the bootstrap token after the renewal, want still 1", n)
	}
}

// Killed between request and issuance (the approver is not running, so
// the CSR stays pending), the agent restarts, resumes waiting for the same
// CSR (its pending key names it), and writes the result once keyward's
// approver runs: exactly one CSR for the key.
func TestNodeAgentResumesItsPendingRequestAfterARestart(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	k := startNodeKeyward(t, ctx, node)
	out, state := t.TempDir(), newStateDir(t)
	cfg := writeAgentConfig(t, node, state, kubeconfigLine(writeNodeKubeconfig(t, cp.URL, node)), "credentials:\n"+daemonCredentialYAML(k, out))

	first := startAgent(t, cfg)
	pending := waitPendingCSR(t, ctx, k.DaemonSigner, node)
	first.stop(t)
	if _, err := os.Lstat(filepath.Join(out, bundleFile)); !os.IsNotExist(err) {
		t.Fatalf("a bundle before any certificate was issued (%v)", err)
	}

	second := startAgent(t, cfg)
	// It waits on the same request (no second CSR) before approval.
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 20*time.Second, true, func(context.Context) (bool, error) {
		return second.status(t, daemonCredential).Pending == pending.Name, nil
	})
	if err != nil {
		t.Fatalf("the restarted agent does not wait on %s: status %+v", pending.Name, second.status(t, daemonCredential))
	}
	k.startApprover(t)
	b := waitBundle(t, ctx, out, nil)
	csrs := csrsOf(t, ctx, k.DaemonSigner, "system:node:"+node)
	if len(csrs) != 1 || csrs[0].Name != pending.Name {
		t.Fatalf("CSRs %v after the restart, want only %s", csrNames(csrs), pending.Name)
	}
	approvedByKeyward(t, csrs)
	if !csrFor(t, csrs[0], b) {
		t.Fatalf("the written key is not the key of %s", pending.Name)
	}
	verifyChain(t, b.chain, k.DaemonRoot, x509.ExtKeyUsageClientAuth)
}

// kube-apiserver is unreachable (a proxy in front of it stopped, open
// connections cut) during a renewal: the files stay byte for byte, the
// renew-errors metric rises, health stays good (the certificate is still
// valid), and once the apiserver is back the renewal completes with one
// more CSR, for the key persisted before the outage. Cut while the agent
// waits for issuance, it takes the certificate of the same CSR afterwards.
func TestNodeAgentKeepsFilesWhileTheAPIServerIsDown(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	k := startNodeKeyward(t, ctx, node)
	k.startApprover(t)
	proxy := apiProxy(t)
	out, state := t.TempDir(), newStateDir(t)
	cfg := writeAgentConfig(t, node, state, kubeconfigLine(writeNodeKubeconfig(t, proxy.URL(), node)), "credentials:\n"+daemonCredentialYAML(k, out))
	a := startAgent(t, cfg)
	old := waitBundle(t, ctx, out, nil)
	waitLinked(t, ctx, out, bundleFile, keyFile, chainFile)
	before := snapshotFiles(t, out, state)
	errorsBefore := metricValue(t, a.metrics, "keyward_node_credential_renew_errors_total", `credential="`+daemonCredential+`"`)

	proxy.Stop()
	if err := a.agent.RenewNow(daemonCredential); err != nil {
		t.Fatalf("RenewNow: %v", err)
	}
	var errorsDown float64
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		errorsDown = metricValue(t, a.metrics, "keyward_node_credential_renew_errors_total", `credential="`+daemonCredential+`"`)
		return errorsDown > errorsBefore, nil
	})
	if err != nil {
		t.Fatalf("keyward_node_credential_renew_errors_total stayed %v while the apiserver was unreachable", errorsBefore)
	}
	t.Logf("renew errors %v -> %v while unreachable; status %+v", errorsBefore, errorsDown, a.status(t, daemonCredential))
	// Every file stays; the renewal's pending key is persisted (new, the
	// only addition), so the retry uses the same key.
	after := snapshotFiles(t, out, state)
	pendingPath := filepath.Join(state, daemonCredential+"-pending.key")
	pendingKey, ok := after[pendingPath]
	delete(after, pendingPath)
	if !maps.Equal(before, after) {
		t.Errorf("files changed while the apiserver was unreachable:\nbefore %v\nafter  %v", keysOf(before), keysOf(after))
	}
	if code, body := httpGet(t, "http://"+a.health+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while the certificate is valid and the apiserver down: %d %s", code, body)
	}

	proxy.Start()
	renewed := waitBundle(t, ctx, out, old.leaf())
	verifyChain(t, renewed.chain, k.DaemonRoot, x509.ExtKeyUsageClientAuth)
	if !ok {
		t.Errorf("no %s while the renewal failed", pendingPath)
	} else if !bytes.Equal([]byte(pendingKey), renewed.keyPEM) {
		t.Errorf("the renewed key is not the pending key persisted while the apiserver was down")
	}
	if csrs := csrsOf(t, ctx, k.DaemonSigner, "system:node:"+node); len(csrs) != 2 {
		t.Errorf("%d CSRs after one renewal, want 2: %v", len(csrs), csrNames(csrs))
	}
	eventually(t, ctx, func() (bool, string) {
		st := a.status(t, daemonCredential)
		return st.NotAfter.Equal(renewed.leaf().NotAfter), fmt.Sprintf("status after recovery %+v, want NotAfter %s", st, renewed.leaf().NotAfter)
	})

	// Now the apiserver goes away while the agent waits for issuance (its
	// CSR created and approved, keyward's signer held back): its watch is
	// cut, the files stay, and once the apiserver is back and keyward
	// signs, it takes the certificate of that same CSR.
	k.stopSigner()
	before = snapshotFiles(t, out, state)
	if err := a.agent.RenewNow(daemonCredential); err != nil {
		t.Fatalf("RenewNow: %v", err)
	}
	var pending string
	eventually(t, ctx, func() (bool, string) {
		pending = a.status(t, daemonCredential).Pending
		return pending != "", fmt.Sprintf("the agent waits on no CSR: %+v", a.status(t, daemonCredential))
	})
	if c := waitDecided(t, ctx, pending); c.Type != certv1.CertificateApproved {
		t.Fatalf("CSR %s: %s %s", pending, c.Type, c.Message)
	}
	proxy.Stop()
	time.Sleep(time.Second) // not a timing assertion: the agent meets a dead apiserver for a while
	after = snapshotFiles(t, out, state)
	delete(after, pendingPath)
	if !maps.Equal(before, after) {
		t.Errorf("files changed while the apiserver was unreachable during the wait:\nbefore %v\nafter  %v", keysOf(before), keysOf(after))
	}
	proxy.Start()
	k.startSigner(t)
	third := waitBundle(t, ctx, out, renewed.leaf())
	// (creationTimestamp has whole seconds: find it by name.)
	csrs := csrsOf(t, ctx, k.DaemonSigner, "system:node:"+node)
	i := slices.IndexFunc(csrs, func(c certv1.CertificateSigningRequest) bool { return c.Name == pending })
	if len(csrs) != 3 || i < 0 {
		t.Fatalf("CSRs %v, want 3 with %s among them (no new request after the outage)", csrNames(csrs), pending)
	}
	if !csrFor(t, csrs[i], third) {
		t.Errorf("the written key is not the key of %s", pending)
	}
	verifyChain(t, third.chain, k.DaemonRoot, x509.ExtKeyUsageClientAuth)
}

// Readers hammer the output while the agent rotates 50 times: the bundle
// through credbundle (New + Reload), key and chain through credbundle and
// through atomicdir.Read, the bundle file raw. None ever sees a key that
// is not its leaf's, and they see the rotations. (A rotation takes about
// 0.4 s here: the agent's client is rate-limited to 5 requests a second,
// and each rotation creates a CSR and lists/watches it.)
func TestNodeAgentReadersNeverSeeAMismatchAcross50Rotations(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	node := uniqueName(t, "node")
	k := startNodeKeyward(t, ctx, node)
	k.startApprover(t)
	out, state := t.TempDir(), newStateDir(t)
	cfg := writeAgentConfig(t, node, state, kubeconfigLine(writeNodeKubeconfig(t, cp.URL, node)), "credentials:\n"+daemonCredentialYAML(k, out))
	a := startAgent(t, cfg)
	cur := waitBundle(t, ctx, out, nil)

	h := startHammer(t, out)
	const rotations = 50
	began := time.Now()
	for i := range rotations {
		if err := a.agent.RenewNow(daemonCredential); err != nil {
			t.Fatalf("rotation %d: RenewNow: %v", i+1, err)
		}
		cur = waitBundle(t, ctx, out, cur.leaf())
	}
	took := time.Since(began)
	h.stop()
	h.check(t, rotations)
	eventually(t, ctx, func() (bool, string) {
		st := a.status(t, daemonCredential)
		return st.Renewals == rotations+1 && st.Errors == 0, fmt.Sprintf("status %+v, want %d renewals and no errors", st, rotations+1)
	})
	t.Logf("%d rotations in %s (%s each)", rotations, took.Round(time.Millisecond), (took / rotations).Round(time.Millisecond))
}

// The agent's trust projection follows the signer's canary/live
// ClusterTrustBundles as the node's label chooses (latency reported), and
// keeps the last good file when the selection becomes empty.
func TestNodeAgentTrustFollowsTheNodeLabel(t *testing.T) {
	ctx := testContext(t)
	node := uniqueName(t, "node")
	k := startNodeKeyward(t, ctx, node)
	k.startApprover(t)
	signer := "keyward.dev/" + uniqueName(t, "trust")
	const nodeLabel = "keyward.dev/trust-bundle"
	admin := cp.AdminClient()
	publisher := trustPublisherClient(t)
	ctbName := func(v string) string { return strings.ReplaceAll(signer, "/", ":") + ":" + v }
	cas := []string{newTestCA(t).pem, newTestCA(t).pem}
	for v, bundle := range map[string]string{"live": cas[0], "canary": cas[0] + cas[1]} {
		ctb := &certv1.ClusterTrustBundle{
			ObjectMeta: metav1.ObjectMeta{Name: ctbName(v), Labels: map[string]string{"keyward.dev/cluster-trust-bundle-version": v}},
			Spec:       certv1.ClusterTrustBundleSpec{SignerName: signer, TrustBundle: bundle},
		}
		if _, err := publisher.CertificatesV1().ClusterTrustBundles().Create(ctx, ctb, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s: %v", ctb.Name, err)
		}
		t.Cleanup(func() {
			_ = admin.CertificatesV1().ClusterTrustBundles().Delete(context.Background(), ctb.Name, metav1.DeleteOptions{})
		})
	}

	out, state, trustDir := t.TempDir(), newStateDir(t), t.TempDir()
	cfg := writeAgentConfig(t, node, state, kubeconfigLine(writeNodeKubeconfig(t, cp.URL, node)),
		"credentials:\n"+daemonCredentialYAML(k, out),
		fmt.Sprintf("trust:\n- {name: daemons, signerName: %s, nodeLabel: %s, dir: %q}", signer, nodeLabel, trustDir))
	a := startAgent(t, cfg)
	file := filepath.Join(trustDir, trust.DefaultFileName)

	waitTrustFile(t, ctx, file, cas[0])
	setLabel := func(value string) time.Time {
		t.Helper()
		n, err := admin.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if n.Labels == nil {
			n.Labels = map[string]string{}
		}
		n.Labels[nodeLabel] = value
		start := time.Now()
		if _, err := admin.CoreV1().Nodes().Update(ctx, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		return start
	}
	for _, step := range []struct {
		label, want string
	}{{"canary", cas[0] + cas[1]}, {"live", cas[0]}} {
		start := setLabel(step.label)
		took := waitTrustFile(t, ctx, file, step.want).Sub(start)
		t.Logf("node labelled %s: the agent's trust file followed in %s", step.label, took.Round(time.Millisecond))
		if took > 30*time.Second {
			t.Errorf("node labelled %s: the trust file followed only after %s", step.label, took)
		}
	}
	// (The metrics follow the write: poll briefly.)
	eventually(t, ctx, func() (bool, string) {
		v := metricValue(t, a.metrics, "keyward_node_trust_bundle_certificates", `trust="daemons"`)
		return v == 1, fmt.Sprintf("keyward_node_trust_bundle_certificates = %v, want 1 (live)", v)
	})
	eventually(t, ctx, func() (bool, string) {
		v := metricValue(t, a.metrics, "keyward_node_trust_bundle_writes_total", `trust="daemons"`)
		return v >= 3, fmt.Sprintf("keyward_node_trust_bundle_writes_total = %v, want at least 3", v)
	})

	// The live bundle goes: the selection is empty, the last good file
	// stays (checked after a change the agent must have seen: the canary
	// bundle's, then a switch to canary that it follows).
	if err := admin.CertificatesV1().ClusterTrustBundles().Delete(ctx, ctbName("live"), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	writes := metricValue(t, a.metrics, "keyward_node_trust_bundle_writes_total", `trust="daemons"`)
	time.Sleep(500 * time.Millisecond) // not a timing assertion: time for a wrong write to happen
	if got, err := os.ReadFile(file); err != nil || !bytes.Equal(got, trust.Merge([]byte(cas[0]))) {
		t.Errorf("after the live bundle was deleted the file holds %q (%v), want the last good file", got, err)
	}
	if v := metricValue(t, a.metrics, "keyward_node_trust_bundle_writes_total", `trust="daemons"`); v != writes {
		t.Errorf("trust writes %v -> %v with an empty selection", writes, v)
	}
	start := setLabel("canary")
	t.Logf("empty live, node labelled canary: followed in %s", waitTrustFile(t, ctx, file, cas[0]+cas[1]).Sub(start).Round(time.Millisecond))
}

// ---- helpers for the agent tests ----

// waitPendingCSR waits for the node's first CSR for signer and returns it.
func waitPendingCSR(t *testing.T, ctx context.Context, signer, node string) certv1.CertificateSigningRequest {
	t.Helper()
	var csrs []certv1.CertificateSigningRequest
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		csrs = csrsOf(t, ctx, signer, "system:node:"+node)
		return len(csrs) > 0, nil
	})
	if err != nil {
		t.Fatalf("the agent made no CSR for %s", signer)
	}
	if len(csrs) != 1 || len(csrs[0].Status.Conditions) != 0 {
		t.Fatalf("CSRs %v, want one, pending (conditions %+v)", csrNames(csrs), csrs[0].Status.Conditions)
	}
	return csrs[0]
}

func csrNames(csrs []certv1.CertificateSigningRequest) []string {
	var out []string
	for _, c := range csrs {
		out = append(out, c.Name+" by "+c.Spec.Username)
	}
	return out
}

// csrFor reports whether c requests b's key.
func csrFor(t *testing.T, c certv1.CertificateSigningRequest, b *parsedBundle) bool {
	t.Helper()
	req := parseCSRRequest(t, c)
	return publicKeysEqual(req.PublicKey, b.key.Public())
}

// verifyChain checks that chain (leaf first) verifies to root for usage,
// and that the leaf is no CA.
func verifyChain(t *testing.T, chain []*x509.Certificate, root *x509.Certificate, usage x509.ExtKeyUsage) {
	t.Helper()
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Fatalf("leaf %s does not chain to %s: %v", chain[0].Subject, root.Subject, err)
	}
	if chain[0].IsCA {
		t.Fatalf("leaf %s is a CA", chain[0].Subject)
	}
}

// waitTrustFile waits until file holds exactly the merge of want and
// returns when it saw it.
func waitTrustFile(t *testing.T, ctx context.Context, file, want string) time.Time {
	t.Helper()
	wantData := trust.Merge([]byte(want))
	var got []byte
	var seen time.Time
	err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		got, _ = os.ReadFile(file)
		seen = time.Now()
		return bytes.Equal(got, wantData), nil
	})
	if err != nil {
		t.Fatalf("%s never held the expected %d certificates; holds %d (%d bytes)", file, bytes.Count(wantData, []byte("-----BEGIN")), bytes.Count(got, []byte("-----BEGIN")), len(got))
	}
	return seen
}

// snapshotFiles reads every regular file and symlink target under dirs.
func snapshotFiles(t *testing.T, dirs ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			switch {
			case d.Type()&os.ModeSymlink != 0:
				target, err := os.Readlink(path)
				if err != nil {
					return err
				}
				out[path] = "-> " + target
			case d.Type().IsRegular():
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				out[path] = string(b)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func keysOf(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// hammer reads a credential output directory in tight loops from several
// readers until stopped, recording every mismatch between a key and its
// leaf, every failed read, and the leaves seen.
type hammer struct {
	stopped chan struct{}
	wg      sync.WaitGroup
	checked atomic.Bool

	mu         sync.Mutex
	reads      map[string]int
	mismatches []string
	failures   []string
	leaves     map[string]map[string]bool // reader -> leaf serials
}

func startHammer(t *testing.T, dir string) *hammer {
	t.Helper()
	h := &hammer{stopped: make(chan struct{}), reads: map[string]int{}, leaves: map[string]map[string]bool{}}
	bundleCred, err := credbundle.New(credbundle.Options{BundleFile: filepath.Join(dir, bundleFile)})
	if err != nil {
		t.Fatal(err)
	}
	pairCred, err := credbundle.New(credbundle.Options{KeyFile: filepath.Join(dir, keyFile), ChainFile: filepath.Join(dir, chainFile)})
	if err != nil {
		t.Fatal(err)
	}
	viaCredbundle := func(c *credbundle.Credential) func() (*parsedBundle, error) {
		return func() (*parsedBundle, error) {
			if err := c.Reload(); err != nil {
				return nil, err
			}
			cur := c.Current()
			key, ok := cur.PrivateKey.(crypto.Signer)
			if !ok {
				return nil, fmt.Errorf("credbundle holds a %T key", cur.PrivateKey)
			}
			leaf, err := x509.ParseCertificate(cur.Certificate[0])
			if err != nil {
				return nil, err
			}
			return &parsedBundle{key: key, chain: []*x509.Certificate{leaf}}, nil
		}
	}
	readers := map[string]func() (*parsedBundle, error){
		"credbundle bundle":    viaCredbundle(bundleCred),
		"credbundle key+chain": viaCredbundle(pairCred),
		"atomicdir.Read key+chain": func() (*parsedBundle, error) {
			files, err := atomicdir.Read(dir, keyFile, chainFile)
			if err != nil {
				return nil, err
			}
			return parseBundleData(append(bytes.Clone(files[keyFile]), files[chainFile]...))
		},
		"raw bundle file": func() (*parsedBundle, error) {
			data, err := os.ReadFile(filepath.Join(dir, bundleFile))
			if err != nil {
				return nil, err
			}
			return parseBundleData(data)
		},
	}
	for name, read := range readers {
		h.leaves[name] = map[string]bool{}
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for {
				select {
				case <-h.stopped:
					return
				default:
				}
				b, err := read()
				// A breath between reads leaves the 2-core machine to the
				// agent, signer and apiserver (still hundreds of reads per
				// rotation).
				time.Sleep(200 * time.Microsecond)
				h.mu.Lock()
				h.reads[name]++
				switch {
				case err != nil:
					h.failures = append(h.failures, name+": "+err.Error())
				case !b.matches():
					h.mismatches = append(h.mismatches, fmt.Sprintf("%s: key does not match leaf serial %s", name, b.leaf().SerialNumber.Text(16)))
				default:
					h.leaves[name][b.leaf().SerialNumber.Text(16)] = true
				}
				h.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() {
		h.stop()
		if !h.checked.Load() && t.Failed() {
			h.check(t, 0) // the test stopped early: say what the readers saw
		}
	})
	return h
}

func (h *hammer) stop() {
	select {
	case <-h.stopped:
	default:
		close(h.stopped)
	}
	h.wg.Wait()
}

// check fails the test on any mismatch or failed read, and unless every
// reader saw more than half of the rotations' leaves.
func (h *hammer) check(t *testing.T, rotations int) {
	t.Helper()
	h.checked.Store(true)
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.mismatches) > 0 {
		t.Errorf("%d reads saw a key that does not match its leaf, first: %s", len(h.mismatches), h.mismatches[0])
	}
	if len(h.failures) > 0 {
		t.Errorf("%d reads failed, first: %s", len(h.failures), h.failures[0])
	}
	for name, n := range h.reads {
		t.Logf("%-26s %7d reads, %d distinct leaves", name, n, len(h.leaves[name]))
		if rotations > 0 && len(h.leaves[name]) <= rotations/2 {
			t.Errorf("reader %q saw %d leaves across %d rotations: it did not read during them", name, len(h.leaves[name]), rotations)
		}
	}
}
