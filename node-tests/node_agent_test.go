package nodetests

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/testsupport/controlplane"
	"k8s.io/apimachinery/pkg/util/wait"
)

// agentConfig runs the node agent as the node (kubelet's own kubeconfig,
// whose client certificate keyward issued and kubelet rotates), with one
// node-daemon credential and the node-daemons live bundle.
const agentConfig = `apiVersion: keyward.dev/v1alpha1
kind: NodeAgentConfiguration
kubeconfig: %q
stateDir: %q
metricsAddress: "-"
healthAddress: "-"
renewal: {retryInitial: 1s, retryMax: 5s}
credentials:
- name: node-daemon
  signerName: keyward.dev/node-daemons
  keyType: ECDSAP256
  uris: ["spiffe://cluster.local/node/${NODE_NAME}/node-daemon"]
  expirationSeconds: 600
  output: {dir: %q}
trust:
- name: node-daemons
  signerName: keyward.dev/node-daemons
  version: live
  dir: %q
`

// agentSample is what the files held at one moment.
type agentSample struct {
	at       time.Time
	issuer   string
	serial   string
	notAfter time.Time
	roots    []string
	err      error // the leaf did not verify against the trust file
}

// The node agent, run on the node as the node, keeps a node-daemon
// credential and its trust file current through a whole rotation of the
// node-daemons CA: the trust file gains g2 before any g2 credential
// appears, the credential moves to g2 at its next renewal after
// activation, and g1 leaves the trust file only after the last g1
// credential expired. Sampled every 200 ms, the credential always verifies
// against the trust file beside it.
func TestNodeAgentThroughARotation(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	dir := filepath.Join(env.dir, "node-agent")
	credDir, trustDir := filepath.Join(dir, "node-daemon"), filepath.Join(dir, "trust")
	cfg := filepath.Join(dir, "agent.yaml")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(env.node.Dir, "kubelet.kubeconfig")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(agentConfig, kubeconfig, filepath.Join(dir, "state"), credDir, trustDir)), 0o600); err != nil {
		t.Fatal(err)
	}
	p, err := controlplane.StartProcess("keyward node agent", env.keyward, []string{"node", "agent", "--config", cfg},
		filepath.Join(dir, "agent.log"), "NODE_NAME="+nodeName)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })

	credFile, trustPath := filepath.Join(credDir, "credential-bundle.pem"), filepath.Join(trustDir, "ca-bundle.pem")
	var (
		mu      sync.Mutex
		samples []agentSample
	)
	sample := func() agentSample {
		s := agentSample{at: time.Now()}
		chain, err1 := readCerts(credFile)
		roots, err2 := readCerts(trustPath)
		if err1 != nil || err2 != nil || len(chain) == 0 {
			s.err = fmt.Errorf("credential %v, trust %v", err1, err2)
			return s
		}
		s.issuer, s.serial, s.notAfter = chain[0].Issuer.CommonName, chain[0].SerialNumber.Text(16), chain[0].NotAfter
		pool := x509.NewCertPool()
		for _, r := range roots {
			pool.AddCert(r)
			s.roots = append(s.roots, fingerprint(r.Raw))
		}
		slices.Sort(s.roots)
		inter := x509.NewCertPool()
		for _, c := range chain[1:] {
			inter.AddCert(c)
		}
		_, s.err = chain[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return s
	}
	waitFor := func(what string, timeout time.Duration, ok func(agentSample) bool) {
		t.Helper()
		var last agentSample
		if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
			if err := p.ExitError(); p.Exited() {
				return false, err
			}
			last = sample()
			return last.err == nil && ok(last), nil
		}); err != nil {
			t.Fatalf("node agent: %s: %v; files last held issuer %q, roots %v (%v); agent log:\n%s", what, err, last.issuer, last.roots, last.err,
				controlplane.Tail(filepath.Join(dir, "agent.log"), 15))
		}
	}
	waitFor("first credential and trust file", time.Minute, func(s agentSample) bool { return s.issuer != "" })

	// From here on the files are sampled throughout.
	sctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sctx.Err() == nil {
			s := sample()
			mu.Lock()
			samples = append(samples, s)
			mu.Unlock()
			time.Sleep(200 * time.Millisecond)
		}
	}()

	g1 := fingerprint(env.roots[daemonSigner].Raw)
	// A new key in the token and its root, Staged: in the canary bundle.
	g2Root, err := env.caInit(ctx, daemonSigner, "g2")
	if err != nil {
		t.Fatal(err)
	}
	g2 := fingerprint(g2Root.Raw)
	trustStep(t, ctx, "promote", daemonSigner, "g2")
	waitFor("trust file gains g2", time.Minute, func(s agentSample) bool { return slices.Equal(s.roots, sorted(g1, g2)) })
	trustStep(t, ctx, "activate", daemonSigner, "g2")
	waitFor("credential renewed from g2", 2*time.Minute, func(s agentSample) bool { return s.issuer == daemonSigner+" CA g2" })
	// g1 leaves the bundles once every g1 credential has expired. The
	// LeavesValid gate counts from the signer's reservation (the last
	// issuance + maxLifetime + a 10-minute margin), too long for a test:
	// the test waits for the real expiry of every g1 credential the agent
	// held (the agent is the name's only requester here) and forces it.
	var lastG1 time.Time
	mu.Lock()
	for _, s := range samples {
		if s.issuer == daemonSigner+" CA g1" && s.notAfter.After(lastG1) {
			lastG1 = s.notAfter
		}
	}
	mu.Unlock()
	var ee *exec.ExitError
	if _, err := env.run(ctx, "trust", "retire", daemonSigner, "g1"); !errors.As(err, &ee) || ee.ExitCode() != 3 || !strings.Contains(err.Error(), string(v1alpha1.GateLeavesValid)) {
		t.Fatalf("retire g1 while its leaves may be valid: %v; want exit code 3 naming %s", err, v1alpha1.GateLeavesValid)
	}
	time.Sleep(time.Until(lastG1) + time.Second)
	why := "node-tests: the last g1 credential expired at " + lastG1.UTC().Format(time.RFC3339)
	trustStep(t, ctx, "retire", daemonSigner, "g1", "--force", "--reason", why)
	trustStep(t, ctx, "finish", daemonSigner, "g1", "--force", "--reason", why)
	waitFor("trust file loses g1", time.Minute, func(s agentSample) bool { return slices.Equal(s.roots, []string{g2}) })
	stop()
	wg.Wait()

	a, err := env.authorities.Get(ctx, authorityOf(daemonSigner))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range a.Status.Generations {
		if g.Name == "g1" && g.Phase != v1alpha1.PhaseRetired {
			t.Errorf("g1 is %s after finish, want Retired", g.Phase)
		}
	}
	serials := map[string]bool{}
	var firstG2, g2Trusted time.Time
	for _, s := range samples {
		if s.err != nil {
			t.Errorf("at %s the node-daemon credential (issuer %q) did not verify against the trust file beside it (roots %v): %v",
				s.at.Format(time.RFC3339Nano), s.issuer, s.roots, s.err)
			continue
		}
		serials[s.serial] = true
		if g2Trusted.IsZero() && slices.Contains(s.roots, g2) {
			g2Trusted = s.at
		}
		if firstG2.IsZero() && s.issuer == daemonSigner+" CA g2" {
			firstG2 = s.at
		}
	}
	if firstG2.Before(g2Trusted) {
		t.Errorf("a g2 credential appeared at %s, before the trust file held g2 (%s)", firstG2, g2Trusted)
	}
	t.Logf("%d samples over %s: %d credentials, each verified against the trust file beside it; g2 trusted %s before the first g2 credential",
		len(samples), samples[len(samples)-1].at.Sub(samples[0].at).Round(time.Second), len(serials), firstG2.Sub(g2Trusted).Round(time.Second))
}

// readCerts reads the CERTIFICATE blocks of a PEM file, passing over a
// private key (a credential bundle, a kubelet *-current.pem).
func readCerts(path string) ([]*x509.Certificate, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []*x509.Certificate
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			return out, nil
		}
		if blk.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
}
