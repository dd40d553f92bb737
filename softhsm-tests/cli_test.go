package softhsmtests

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/ca"
	"github.com/keyward/keyward/cmd/keyward/app"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/authority"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/kmstest"
	"github.com/keyward/keyward/trustpublisher"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// keyward runs the keyward command tree in-process, as the admin.
func keyward(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := app.NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(append(args, "--kubeconfig", adminKubeconfig(t)))
	cmd.SetContext(testContext(t))
	err := cmd.Execute()
	return out.String(), err
}

func adminKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "admin.kubeconfig")
	if err := controlplane.WriteKubeconfig(cp.AdminConfig(), "admin", path); err != nil {
		t.Fatal(err)
	}
	return path
}

func authorityClient(t *testing.T) *authclient.Client {
	t.Helper()
	c, err := authclient.New(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// tokenKeyURI is a key URI in the package's SoftHSM token.
func tokenKeyURI(label string) string {
	return "pkcs11:token=" + token.Label + ";object=" + label + "?module-path=" + token.ModulePath + "&pin-source=file:" + token.PINFile
}

// authorityFor reads the one Authority whose signerName is signer.
func authorityFor(t *testing.T, c *authclient.Client, signer string) *kwv1alpha1.Authority {
	t.Helper()
	list, err := c.List(testContext(t), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var found *kwv1alpha1.Authority
	for i := range list.Items {
		if list.Items[i].Spec.SignerName == signer {
			if found != nil {
				t.Fatalf("two Authorities for %s", signer)
			}
			found = &list.Items[i]
		}
	}
	return found
}

func generation(t *testing.T, a *kwv1alpha1.Authority, name string) kwv1alpha1.Generation {
	t.Helper()
	for _, g := range a.Spec.Generations {
		if g.Name == name {
			return g
		}
	}
	t.Fatalf("Authority %s has no generation %s", a.Name, name)
	return kwv1alpha1.Generation{}
}

// openKey opens uri and returns its public key in DER.
func openKeySPKI(t *testing.T, opts all.Options, uri string) []byte {
	t.Helper()
	reg, err := all.NewRegistry(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	k, err := reg.Open(testContext(t), backends.OpenRequest{URI: uri})
	if err != nil {
		t.Fatalf("opening %s: %v", uri, err)
	}
	defer k.Close()
	der, _ := x509.MarshalPKIXPublicKey(k.Public())
	return der
}

// `keyward ca init` with a key created in SoftHSM lands a self-signed root
// as the first generation, Active; the next one is Staged; a lifetime too
// short for a rotation is refused with the numbers and writes nothing.
func TestCAInitSelfSignedInSoftHSM(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c := authorityClient(t)
	u := uniqueName(t, "ca")
	signer := "keyward.dev/" + u

	out, err := keyward(t, "ca", "init", "--signer", signer, "--generation", "g1", "--key-uri", tokenKeyURI(u+"-g1"),
		"--create-key", "--algorithm", "ECDSAP256", "--subject", "CN=test root g1,O=keyward", "--lifetime", "720h", "--path-len", "1",
		"--permitted-dns", ".cluster.local")
	if err != nil {
		t.Fatalf("ca init: %v\n%s", err, out)
	}
	a := authorityFor(t, c, signer)
	if a == nil {
		t.Fatalf("no Authority for %s; output:\n%s", signer, out)
	}
	g := generation(t, a, "g1")
	if g.Phase != kwv1alpha1.PhaseActive {
		t.Errorf("first generation's phase %s, want Active (bootstrap)", g.Phase)
	}
	certs, err := trustpublisher.ParseGeneration(g)
	if err != nil {
		t.Fatalf("the stored generation does not parse: %v", err)
	}
	root := certs[0]
	if len(certs) != 1 || root.CheckSignatureFrom(root) != nil || root.Subject.CommonName != "test root g1" || root.MaxPathLen != 1 ||
		root.KeyUsage != x509.KeyUsageCertSign|x509.KeyUsageCRLSign || len(root.SubjectKeyId) == 0 || len(root.PermittedDNSDomains) != 1 {
		t.Errorf("root: subject %s pathlen %d ku %v skid %x permitted %v", root.Subject, root.MaxPathLen, root.KeyUsage, root.SubjectKeyId, root.PermittedDNSDomains)
	}
	if strings.Contains(g.KeyURI, "pin-value") || !strings.HasPrefix(g.KeyURI, "pkcs11:") {
		t.Errorf("stored key URI %s", g.KeyURI)
	}
	if !bytes.Equal(openKeySPKI(t, all.Options{}, g.KeyURI), root.RawSubjectPublicKeyInfo) {
		t.Error("the stored key URI does not open the root's key")
	}

	if out, err := keyward(t, "ca", "init", "--signer", signer, "--generation", "g2", "--key-uri", tokenKeyURI(u+"-g2"), "--create-key"); err != nil {
		t.Fatalf("second ca init: %v\n%s", err, out)
	}
	a = authorityFor(t, c, signer)
	if g := generation(t, a, "g2"); g.Phase != kwv1alpha1.PhaseStaged {
		t.Errorf("second generation's phase %s, want Staged", g.Phase)
	}

	out, err = keyward(t, "ca", "init", "--signer", signer, "--generation", "g3", "--key-uri", tokenKeyURI(u+"-g3"), "--create-key", "--lifetime", "25h")
	if !errors.Is(err, ca.ErrLifetimeTooShort) {
		t.Fatalf("a 25h CA: got %v, want ErrLifetimeTooShort\n%s", err, out)
	}
	// The refusal names the numbers (this test is about the message).
	if want := "CA lifetime 25h0m0s is shorter than leaf maximum 24h0m0s + rotation windows 2h20m0s (canary soak 1h0m0s ×2, propagation window 5m0s ×4) = 26h20m0s"; !strings.Contains(out, want) {
		t.Errorf("output\n%s\nwant it to contain\n%s", out, want)
	}
	if after := authorityFor(t, c, signer); after.ResourceVersion != a.ResourceVersion {
		t.Error("a refused ca init changed the Authority")
	}
}

// External-root mode: ca init --csr-out writes a CSR and touches nothing in
// the cluster; a test root signs it; ca import stores the intermediate with
// the root in chainPEM; a leaf issued under it verifies to the external root
// with Go and with openssl, the intermediate in its chain.
func TestCAExternalRootCSRImport(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c := authorityClient(t)
	u := uniqueName(t, "ext")
	signer := "keyward.dev/" + u
	dir := t.TempDir()
	csrFile := filepath.Join(dir, "g1.csr")
	keyURI := tokenKeyURI(u)

	out, err := keyward(t, "ca", "init", "--signer", signer, "--generation", "g1", "--key-uri", keyURI, "--create-key", "--algorithm", "ECDSAP384",
		"--subject", "CN=keyward intermediate", "--csr-out", csrFile)
	if err != nil {
		t.Fatalf("ca init --csr-out: %v\n%s", err, out)
	}
	if a := authorityFor(t, c, signer); a != nil {
		t.Fatalf("ca init --csr-out wrote Authority %s", a.Name)
	}
	data, err := os.ReadFile(csrFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		t.Fatalf("%s holds no CERTIFICATE REQUEST", csrFile)
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil || csr.CheckSignature() != nil {
		t.Fatalf("CSR: %v", err)
	}

	// The external root, held in memory.
	root := newTestCA(t)
	rootTmpl := *root.cert
	rootTmpl.MaxPathLen, rootTmpl.NotAfter = 1, time.Now().Add(365*24*time.Hour)
	rootDER, err := x509.CreateCertificate(rand.Reader, &rootTmpl, &rootTmpl, root.key.Public(), root.key)
	if err != nil {
		t.Fatal(err)
	}
	root.cert, _ = x509.ParseCertificate(rootDER)
	interDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(42), Subject: csr.Subject,
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(90 * 24 * time.Hour),
		ExtraExtensions: csr.Extensions, // the requested CA:TRUE pathlen 0 and keyUsage
	}, root.cert, csr.PublicKey, root.key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, chainFile := filepath.Join(dir, "g1.crt"), filepath.Join(dir, "root.crt")
	writePEM(t, certFile, interDER)
	writePEM(t, chainFile, root.cert.Raw)

	// The root is required.
	if _, err := keyward(t, "ca", "import", "--signer", signer, "--generation", "g1", "--key-uri", keyURI, "--certificate", certFile); !errors.Is(err, ca.ErrChain) {
		t.Fatalf("import without the root: got %v, want ErrChain", err)
	}
	out, err = keyward(t, "ca", "import", "--signer", signer, "--generation", "g1", "--key-uri", keyURI, "--certificate", certFile, "--chain", chainFile)
	if err != nil {
		t.Fatalf("ca import: %v\n%s", err, out)
	}
	a := authorityFor(t, c, signer)
	if a == nil {
		t.Fatal("ca import wrote no Authority")
	}
	g := generation(t, a, "g1")
	certs, err := trustpublisher.ParseGeneration(g)
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != 2 || !bytes.Equal(certs[0].Raw, interDER) || !bytes.Equal(certs[1].Raw, root.cert.Raw) {
		t.Fatalf("stored chain has %d certificates, want the intermediate then the root", len(certs))
	}

	// A leaf issued with the stored generation, as the signer would.
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	key, err := reg.Open(ctx, backends.OpenRequest{URI: g.KeyURI})
	if err != nil {
		t.Fatal(err)
	}
	defer key.Close()
	auth, err := authority.New(certs[0], certs[1:], key)
	if err != nil {
		t.Fatal(err)
	}
	leafKey, _ := rsaOrEC(t)
	leaf, err := auth.Sign(ctx, &x509.Certificate{Subject: pkix.Name{CommonName: "leaf"}, DNSNames: []string{"app.ns.svc.cluster.local"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature}, leafKey, authority.Policy{Lifetime: 24 * time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root.cert)
	inter.AddCert(certs[0])
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("Go: the leaf does not verify to the external root: %v", err)
	}
	if leaf.NotAfter.After(certs[0].NotAfter) {
		t.Errorf("leaf ends %s after the intermediate %s", leaf.NotAfter, certs[0].NotAfter)
	}
	leafFile := filepath.Join(dir, "leaf.crt")
	writePEM(t, leafFile, leaf.Raw)
	if out, err := exec.Command("openssl", "verify", "-CAfile", chainFile, "-untrusted", certFile, leafFile).CombinedOutput(); err != nil {
		t.Errorf("openssl verify: %v\n%s", err, out)
	}
	if out, err := exec.Command("openssl", "verify", "-CAfile", chainFile, certFile).CombinedOutput(); err != nil {
		t.Errorf("openssl verify of the intermediate: %v\n%s", err, out)
	}
}

func writePEM(t *testing.T, path string, der ...[]byte) {
	t.Helper()
	var b []byte
	for _, d := range der {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// rsaOrEC is a subject key for a test leaf.
func rsaOrEC(t *testing.T) (any, any) {
	t.Helper()
	k := newTestCA(t).key
	return k.Public(), k
}

// ca init creates the key in Cloud KMS or AWS KMS (the wire-level fakes,
// through the real SDKs) as it does in SoftHSM.
func TestCAInitWithKMSKeys(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c := authorityClient(t)
	fakes := startKMSFakes(t)
	gcp, cryptoKey, awsKMS := fakes.gcp, fakes.cryptoKey, fakes.aws
	// awskms reads credentials the SDK's default way: the environment.
	kmstest.AWSEnv(t, awskmsfake.AccessKeyID, awskmsfake.SecretAccessKey)

	for _, tc := range []struct {
		name, uri, algorithm string
		flags                []string
	}{
		{"gcpkms", "gcpkms:" + cryptoKey, "ECDSAP256", []string{"--gcpkms-emulator", gcp.Addr()}},
		{"awskms", "awskms:region=eu-west-1?endpoint=" + awsKMS.URL(), "RSA3072", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			signer := "keyward.dev/" + uniqueName(t, tc.name)
			args := append([]string{"ca", "init", "--signer", signer, "--generation", "g1", "--key-uri", tc.uri, "--create-key", "--algorithm", tc.algorithm}, tc.flags...)
			if out, err := keyward(t, args...); err != nil {
				t.Fatalf("ca init: %v\n%s", err, out)
			}
			a := authorityFor(t, c, signer)
			if a == nil {
				t.Fatal("no Authority written")
			}
			g := generation(t, a, "g1")
			certs, err := trustpublisher.ParseGeneration(g)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasPrefix(g.KeyURI, tc.name+":") || certs[0].CheckSignatureFrom(certs[0]) != nil {
				t.Errorf("key URI %s; self-signed: %v", g.KeyURI, certs[0].CheckSignatureFrom(certs[0]))
			}
			if g.Phase != kwv1alpha1.PhaseActive {
				t.Errorf("phase %s, want Active", g.Phase)
			}
		})
	}
}

// `keyward trust promote` while the canary soak runs is refused with the
// gate named (exit code 3) and the spec unchanged; with --force --reason it
// makes the edit and sets the override annotation.
func TestTrustPromoteRefusedThenForced(t *testing.T) {
	ctx := testContext(t)
	installAuthorityCRD(t, ctx)
	c := authorityClient(t)
	u := uniqueName(t, "trust")
	signer := "keyward.dev/" + u
	for _, g := range []string{"g1", "g2"} {
		if out, err := keyward(t, "ca", "init", "--signer", signer, "--generation", g, "--key-uri", tokenKeyURI(u+"-"+g), "--create-key"); err != nil {
			t.Fatalf("ca init %s: %v\n%s", g, err, out)
		}
	}
	a := authorityFor(t, c, signer)
	// Play the controller and the signer: g1 Active for a day, g2 Staged
	// just now, both bundles published ten minutes ago.
	now := time.Now().Truncate(time.Second)
	day, just := metav1.NewTime(now.Add(-24*time.Hour)), metav1.NewTime(now)
	a.Status.Generations = []kwv1alpha1.GenerationStatus{{Name: "g1", Phase: kwv1alpha1.PhaseActive, Since: &day}, {Name: "g2", Phase: kwv1alpha1.PhaseStaged, Since: &just}}
	canary, live := trustpublisher.BundleContents(a)
	changed := metav1.NewTime(now.Add(-10 * time.Minute))
	if _, err := c.ApplyStatus(ctx, a.Name, map[string]any{
		"generations": a.Status.Generations,
		"bundles": []kwv1alpha1.BundleStatus{
			{Version: kwv1alpha1.BundleCanary, Digest: trustpublisher.BundleDigest(canary), Published: true, LastChangeTime: &changed},
			{Version: kwv1alpha1.BundleLive, Digest: trustpublisher.BundleDigest(live), Published: true, LastChangeTime: &changed},
		},
	}, kwv1alpha1.FieldManagerTrustPublisher); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ApplyStatus(ctx, a.Name, map[string]any{"generations": []map[string]any{
		{"name": "g1", "keyCheck": readyKeyCheck(a, "g1")}, {"name": "g2", "keyCheck": readyKeyCheck(a, "g2")},
	}}, kwv1alpha1.FieldManagerSigner); err != nil {
		t.Fatal(err)
	}
	before := authorityFor(t, c, signer)

	out, err := keyward(t, "trust", "promote", signer, "g2")
	var gate *app.GateError
	if !errors.As(err, &gate) || gate.Step.Gate != kwv1alpha1.GateCanarySoak || gate.Step.OpensAt == nil {
		t.Fatalf("promote during the soak: got %v, want a GateError naming CanarySoak\n%s", err, out)
	}
	t.Logf("keyward trust promote %s g2:\n%s", signer, out)
	if app.ExitCode(err) != app.ExitGateHolds {
		t.Errorf("exit code %d, want %d", app.ExitCode(err), app.ExitGateHolds)
	}
	if !strings.Contains(out, "CanarySoak") || !strings.Contains(out, "opens in") {
		t.Errorf("the refusal does not name the gate and when it opens:\n%s", out)
	}
	after := authorityFor(t, c, signer)
	if after.Generation != before.Generation || generation(t, after, "g2").Phase != kwv1alpha1.PhaseStaged {
		t.Fatalf("a refused promote changed the spec (generation %d → %d)", before.Generation, after.Generation)
	}

	if out, err := keyward(t, "trust", "promote", signer, "g2", "--force", "--reason", "CHG-1 approved"); err != nil {
		t.Fatalf("promote --force: %v\n%s", err, out)
	}
	after = authorityFor(t, c, signer)
	if generation(t, after, "g2").Phase != kwv1alpha1.PhasePromoted {
		t.Errorf("forced promote left g2 desired %s", generation(t, after, "g2").Phase)
	}
	var o kwv1alpha1.Override
	if err := json.Unmarshal([]byte(after.Annotations[kwv1alpha1.OverrideAnnotation]), &o); err != nil {
		t.Fatalf("override annotation %q: %v", after.Annotations[kwv1alpha1.OverrideAnnotation], err)
	}
	if o.Reason != "CHG-1 approved" || o.Generations["g2"] != kwv1alpha1.PhasePromoted || len(o.Generations) != 1 || o.RequestedBy == "" {
		t.Errorf("override %+v", o)
	}
	if plan := trustpublisher.Evaluate(after, time.Now()); !plan.Changed() {
		t.Errorf("with the override the controller would not move: %+v", plan.Steps)
	}
	status, err := keyward(t, "trust", "status", signer)
	t.Logf("keyward trust status %s:\n%s", signer, status)
	if err != nil || !strings.Contains(status, "(forced to Promoted)") || !strings.Contains(status, "override pending") {
		t.Errorf("trust status: %v\n%s", err, status)
	}

	// A second --force while that override is pending (no controller runs
	// here) is refused: replacing the annotation would drop g2's entry.
	pending := after.Annotations[kwv1alpha1.OverrideAnnotation]
	out, err = keyward(t, "trust", "activate", signer, "g2", "--force", "--reason", "CHG-2")
	if !errors.Is(err, app.ErrOverridePending) {
		t.Fatalf("a second --force while an override is pending: got %v, want ErrOverridePending\n%s", err, out)
	}
	t.Logf("keyward trust activate --force while an override is pending:\n%s", out)
	if again := authorityFor(t, c, signer); again.Annotations[kwv1alpha1.OverrideAnnotation] != pending || generation(t, again, "g2").Phase != kwv1alpha1.PhasePromoted {
		t.Fatalf("the refused --force changed the Authority: override %q, g2 desired %s", again.Annotations[kwv1alpha1.OverrideAnnotation], generation(t, again, "g2").Phase)
	}

	// Emergency: g2 Active and g1 Retired at once, the blast radius first.
	lastIssued := metav1.NewTime(now.Add(20 * time.Hour))
	// (An apply carries all of a manager's fields: keyCheck again.)
	if _, err := c.ApplyStatus(ctx, a.Name, map[string]any{"generations": []map[string]any{
		{"name": "g1", "lastIssuedNotAfter": lastIssued, "keyCheck": readyKeyCheck(a, "g1")}, {"name": "g2", "keyCheck": readyKeyCheck(a, "g2")},
	}},
		kwv1alpha1.FieldManagerSigner); err != nil {
		t.Fatal(err)
	}
	before = authorityFor(t, c, signer)
	out, err = keyward(t, "trust", "emergency", signer, "--compromised", "g1", "--activate", "g2", "--reason", "INC-1 key exfiltrated")
	t.Logf("keyward trust emergency without --yes:\n%s", out)
	if !errors.Is(err, app.ErrNotConfirmed) {
		t.Fatalf("emergency without --yes: got %v, want ErrNotConfirmed", err)
	}
	if !strings.Contains(out, lastIssued.UTC().Format(time.RFC3339)) || !strings.Contains(out, "beginRefreshAt") {
		t.Errorf("the blast radius does not say until when g1's leaves are valid and that kubelet refreshes only at beginRefreshAt:\n%s", out)
	}
	if after := authorityFor(t, c, signer); after.ResourceVersion != before.ResourceVersion {
		t.Error("emergency without --yes changed the Authority")
	}
	if out, err := keyward(t, "trust", "emergency", signer, "--compromised", "g1", "--activate", "g2", "--reason", "INC-1 key exfiltrated", "--yes"); err != nil {
		t.Fatalf("emergency --yes: %v\n%s", err, out)
	}
	after = authorityFor(t, c, signer)
	if generation(t, after, "g2").Phase != kwv1alpha1.PhaseActive || generation(t, after, "g1").Phase != kwv1alpha1.PhaseRetired {
		t.Errorf("after emergency: g1 %s, g2 %s", generation(t, after, "g1").Phase, generation(t, after, "g2").Phase)
	}
	o = kwv1alpha1.Override{}
	if err := json.Unmarshal([]byte(after.Annotations[kwv1alpha1.OverrideAnnotation]), &o); err != nil ||
		o.Generations["g2"] != kwv1alpha1.PhaseActive || o.Generations["g1"] != kwv1alpha1.PhaseRetired {
		t.Errorf("override %+v (%v)", o, err)
	}
	plan := trustpublisher.Evaluate(after, time.Now())
	for gen, want := range o.Generations {
		if s, _ := plan.Step(gen); s.Next != want || !s.Forced {
			t.Errorf("the controller would move %s to %s (gate %s, forced %v), want %s at once", gen, s.Next, s.Gate, s.Forced, want)
		}
	}

	// --wait: returns once status shows the phase, and exits 4 when it
	// does not in time (nobody plays the controller here).
	if _, err := c.ApplyStatus(ctx, a.Name, map[string]any{"generations": []map[string]any{
		{"name": "g1", "phase": "Retired", "since": just}, {"name": "g2", "phase": "Active", "since": just},
	}}, kwv1alpha1.FieldManagerTrustPublisher); err != nil {
		t.Fatal(err)
	}
	if out, err := keyward(t, "trust", "activate", signer, "g2", "--wait", "--timeout", "20s"); err != nil {
		t.Errorf("activate --wait with status Active: %v\n%s", err, out)
	}
	out, err = keyward(t, "trust", "stage", signer, "g1", "--wait", "--timeout", "2s", "--force", "--reason", "back")
	if app.ExitCode(err) != app.ExitWaitTimeout {
		t.Errorf("stage --wait with no controller: exit %d (%v), want %d\n%s", app.ExitCode(err), err, app.ExitWaitTimeout, out)
	}
}
