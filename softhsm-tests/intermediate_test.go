package softhsmtests

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends/all"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/intermediate"
	"github.com/keyward/keyward/signer/pcr"
	"github.com/keyward/keyward/testsupport/awskmsfake"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/faults"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// startIntermediateRun is startKMSRun with signers[].intermediate on: a
// root of pathLen 1 whose key is in the AWS KMS fake, the signer in this
// process as replica identity.
func startIntermediateRun(t *testing.T, kms *awskmsfake.Server, opts all.Options, identity string) kmsRun {
	t.Helper()
	suffix := uniqueName(t, "inter")
	r := kmsRun{name: "keyward.dev/inter-" + suffix}
	var keyURI, caFile string
	keyURI, caFile, r.root = newCAPathLen(t, opts, kmsURI(kms), "ca-"+suffix, 1)
	sc := signerConfig(t, r.name, config.ProfilePodIdentity, keyURI, caFile)
	sc.Intermediate = &config.Intermediate{Enabled: true}
	cfg := baseConfig(t, sc)
	r.signer = runSignerWith(t, cfg, identity, pcr.V1, opts)
	r.w = podOnNode(t, testContext(t), uniqueName(t, "node"), r.name)
	return r
}

// kmsSignatures are the KMS fake's signatures that are not readiness
// probes.
func kmsSignatures(signed []awskmsfake.SignRequest) []awskmsfake.SignRequest {
	probe := sha256.Sum256([]byte("keyward readiness probe"))
	var out []awskmsfake.SignRequest
	for _, r := range signed {
		if string(r.Message) != string(probe[:]) {
			out = append(out, r)
		}
	}
	return out
}

// pemCerts decodes a PEM chain.
func pemCerts(t *testing.T, chain string) []*x509.Certificate {
	t.Helper()
	var out []*x509.Certificate
	for rest := []byte(chain); ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, c)
	}
}

// With signers[].intermediate on, a burst of PCRs issued through a real
// kube-apiserver costs the KMS-held CA key exactly one signature: that of
// the in-memory intermediate, bound to the replica, which signs every
// leaf. Each status.certificateChain is leaf, intermediate (and the root,
// as keyward serves it), and verifies with the root as the only root,
// through Go's x509.Verify and openssl verify -untrusted. With the KMS then
// failing every call, requests are still issued by the same intermediate.
func TestIntermediateModeSignsABurstWithOneKMSSignature(t *testing.T) {
	const n, more = 40, 10
	kms, opts := startKMS(t)
	r := startIntermediateRun(t, kms, opts, "replica-inter-0") // the root's self-signature is made here
	before := len(kms.SignRequests())

	pcrs := reconcileIssued(t, len(createBurst(t, r.w, r.name, n)), 60*time.Second, namespacesOf(r.w), logFileOf(r.signer.LogPath))
	signed := kmsSignatures(kms.SignRequests()[before:])
	if len(signed) != 1 {
		t.Fatalf("the KMS signed %d times for %d certificates, want 1 (the intermediate)", len(signed), n)
	}
	inter := checkIntermediateChains(t, pcrs, r.root, "replica-inter-0")
	if d := sha256.Sum256(inter.RawTBSCertificate); string(signed[0].Message) != string(d[:]) {
		t.Fatal("the one KMS signature is not the intermediate's")
	}
	if log, _ := os.ReadFile(r.signer.LogPath); strings.Contains(string(log), "PRIVATE KEY") {
		t.Fatal("the signer logged a private key")
	}

	// The KMS fails every call: the intermediate keeps issuing.
	kms.Inject(awskmsfake.Sign, awskmsfake.Fault{Code: "KMSInternalException"}, faults.Always)
	defer kms.ClearFaults()
	calls := kms.Calls(awskmsfake.Sign)
	createBurst(t, r.w, r.name, more)
	pcrs = reconcileIssued(t, n+more, 60*time.Second, namespacesOf(r.w), logFileOf(r.signer.LogPath))
	if got := checkIntermediateChains(t, pcrs, r.root, "replica-inter-0"); !got.Equal(inter) {
		t.Error("a second intermediate appeared while the KMS was down")
	}
	if c := kms.Calls(awskmsfake.Sign) - calls; c != 0 {
		t.Errorf("%d Sign calls while the intermediate was valid, want 0", c)
	}
}

// checkIntermediateChains checks every Issued PCR's chain: leaf then one
// intermediate, the same for all, bound to replica, pathLen 0, under root;
// verified by x509.Verify (root the only root) and openssl verify
// (-CAfile root, -untrusted the intermediate). It returns the
// intermediate.
func checkIntermediateChains(t *testing.T, pcrs []*certv1.PodCertificateRequest, root *x509.Certificate, replica string) *x509.Certificate {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, certs ...*x509.Certificate) string {
		var b []byte
		for _, c := range certs {
			b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rootFile := write("root.pem", root)
	var inter *x509.Certificate
	for i, p := range pcrs {
		if c := condition(p); c.Type != "Issued" {
			t.Fatalf("%s: %s/%s: %s", p.Name, c.Type, c.Reason, c.Message)
		}
		certs := pemCerts(t, p.Status.CertificateChain)
		if len(certs) < 2 || !certs[1].IsCA {
			t.Fatalf("%s: chain of %d certificates, want leaf then intermediate", p.Name, len(certs))
		}
		for _, c := range certs[2:] {
			if !c.Equal(root) {
				t.Fatalf("%s: chain carries %q besides leaf, intermediate and root", p.Name, c.Subject)
			}
		}
		if inter == nil {
			inter = certs[1]
			if !inter.MaxPathLenZero || inter.KeyUsage != x509.KeyUsageCertSign {
				t.Errorf("intermediate pathLen %d (zero %v), keyUsage %v", inter.MaxPathLen, inter.MaxPathLenZero, inter.KeyUsage)
			}
			if want := intermediate.BindingURI(p.Spec.SignerName, replica).String(); len(inter.URIs) != 1 || inter.URIs[0].String() != want {
				t.Errorf("intermediate URIs %v, want [%s]", inter.URIs, want)
			}
			if err := inter.CheckSignatureFrom(root); err != nil {
				t.Fatalf("intermediate not signed by the root: %v", err)
			}
		} else if !certs[1].Equal(inter) {
			t.Fatalf("%s: signed by another intermediate (serial %s, first %s)", p.Name, certs[1].SerialNumber.Text(16), inter.SerialNumber.Text(16))
		}
		leaf := certs[0]
		if leaf.NotAfter.After(inter.NotAfter) {
			t.Errorf("%s: leaf ends %s, after its intermediate %s", p.Name, leaf.NotAfter, inter.NotAfter)
		}
		roots, inters := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(root)
		inters.AddCert(certs[1])
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
			t.Fatalf("%s: x509.Verify: %v", p.Name, err)
		}
		// openssl for a few: one exec each.
		if i < 5 {
			interFile, leafFile := write("inter.pem", certs[1]), write("leaf.pem", leaf)
			if out, err := exec.Command("openssl", "verify", "-CAfile", rootFile, "-untrusted", interFile, leafFile).CombinedOutput(); err != nil {
				t.Fatalf("%s: openssl verify: %v\n%s", p.Name, err, out)
			}
			// And not without the intermediate: the root alone trusts nothing.
			if err := exec.Command("openssl", "verify", "-CAfile", rootFile, leafFile).Run(); err == nil {
				t.Fatalf("%s: openssl verified the leaf without its intermediate", p.Name)
			}
		}
	}
	if inter == nil {
		t.Fatal("no PCR")
	}
	return inter
}

// When the Active generation moves (trust activate, then the trust
// publisher's record), the next leaf is signed by a new intermediate under
// the new generation's key: its chain verifies with the new root alone,
// the old intermediate signs nothing more, each generation's key signed
// exactly one certificate (its intermediate), and each generation's
// lastIssuedNotAfter covers every leaf chained through its intermediate.
func TestIntermediateModeFollowsActivation(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	kms, opts := startKMS(t)
	suffix := uniqueName(t, "act")
	name := "keyward.dev/inter-act-" + suffix
	type kmsCA struct {
		uri, pem string
		root     *x509.Certificate
	}
	newKMSCA := func(label string) kmsCA {
		uri, file, root := newCAPathLen(t, opts, kmsURI(kms), label, 1)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		return kmsCA{uri: uri, pem: string(b), root: root}
	}
	oldCA, newCA := newKMSCA("old-"+suffix), newKMSCA("new-"+suffix)
	ac := authorities(t)
	obj := authorityName(name)
	if _, err := ac.Create(ctx, &kwv1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: obj},
		Spec: kwv1alpha1.AuthoritySpec{SignerName: name, Generations: []kwv1alpha1.Generation{
			{Name: "old", KeyURI: oldCA.uri, CertificatePEM: oldCA.pem, Phase: kwv1alpha1.PhaseActive},
			{Name: "new", KeyURI: newCA.uri, CertificatePEM: newCA.pem, Phase: kwv1alpha1.PhasePromoted},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.SetObservedPhases(ctx, ac, cp.AdminClient(), obj, map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhaseActive, "new": kwv1alpha1.PhasePromoted}); err != nil {
		t.Fatal(err)
	}
	before := len(kms.SignRequests())
	runSignerWith(t, baseConfig(t, config.Signer{Name: name, Profile: config.ProfilePodIdentity, Intermediate: &config.Intermediate{Enabled: true}}),
		"replica-act", pcr.V1, opts)
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	// issue returns the PCR's leaf and intermediate, checked against root.
	issue := func() (leaf, inter *x509.Certificate) {
		p, _ := createPCR(t, ctx, w, name, pcrOptions{})
		got := waitTerminal(t, ctx, p, 30*time.Second)
		if c := condition(got); c.Type != "Issued" {
			t.Fatalf("%s/%s: %s", c.Type, c.Reason, c.Message)
		}
		certs := pemCerts(t, got.Status.CertificateChain)
		if len(certs) < 2 || !certs[1].IsCA {
			t.Fatalf("chain of %d certificates, want leaf then intermediate", len(certs))
		}
		return certs[0], certs[1]
	}
	verifies := func(leaf, inter, root *x509.Certificate) bool {
		roots, inters := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(root)
		inters.AddCert(inter)
		_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
		return err == nil
	}
	latest := map[string]time.Time{}
	var oldInter *x509.Certificate
	for range 3 {
		leaf, inter := issue()
		if !verifies(leaf, inter, oldCA.root) {
			t.Fatal("before activation, a chain does not verify with the old root")
		}
		if oldInter != nil && !inter.Equal(oldInter) {
			t.Fatal("two intermediates before activation")
		}
		oldInter, latest["old"] = inter, leaf.NotAfter
	}

	a, err := ac.Get(ctx, obj)
	if err != nil {
		t.Fatal(err)
	}
	a.Spec.Generations[0].Phase, a.Spec.Generations[1].Phase = kwv1alpha1.PhasePromoted, kwv1alpha1.PhaseActive
	if _, err := ac.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := controlplane.SetObservedPhases(ctx, ac, cp.AdminClient(), obj, map[string]kwv1alpha1.Phase{"old": kwv1alpha1.PhasePromoted, "new": kwv1alpha1.PhaseActive}); err != nil {
		t.Fatal(err)
	}
	var newInter *x509.Certificate
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		leaf, inter := issue()
		if inter.Equal(oldInter) {
			if leaf.NotAfter.After(latest["old"]) {
				latest["old"] = leaf.NotAfter
			}
			return false, nil
		}
		newInter, latest["new"] = inter, leaf.NotAfter
		return true, nil
	})
	if err != nil {
		t.Fatalf("no new intermediate after activation: %v", err)
	}
	if err := newInter.CheckSignatureFrom(newCA.root); err != nil {
		t.Fatalf("the intermediate after activation is not signed by the new generation: %v", err)
	}
	for range 5 {
		leaf, inter := issue()
		if !inter.Equal(newInter) {
			t.Fatal("after the switch, a leaf under another intermediate")
		}
		if !verifies(leaf, inter, newCA.root) || verifies(leaf, inter, oldCA.root) {
			t.Fatal("after the switch, a chain does not verify with the new root alone")
		}
		latest["new"] = leaf.NotAfter
	}
	want := map[string]string{}
	for _, in := range []*x509.Certificate{oldInter, newInter} {
		d := sha256.Sum256(in.RawTBSCertificate)
		want[string(d[:])] = in.Issuer.CommonName
	}
	signed := kmsSignatures(kms.SignRequests()[before:])
	if len(signed) != 2 {
		t.Errorf("the KMS signed %d times, want 2 (one intermediate per generation)", len(signed))
	}
	for _, s := range signed {
		if want[string(s.Message)] == "" {
			t.Error("a KMS signature that is neither intermediate's")
		}
	}
	for gen, na := range latest {
		g := generationStatus(t, ctx, obj, gen, func(g kwv1alpha1.GenerationStatus) bool {
			return g.LastIssuedNotAfter != nil && !g.LastIssuedNotAfter.Time.Before(na)
		})
		t.Logf("generation %s: latest leaf ends %s, lastIssuedNotAfter %s", gen, na.UTC().Format(time.RFC3339), g.LastIssuedNotAfter.UTC().Format(time.RFC3339))
	}
}

// A CSR signer name with signers[].intermediate: approved CSRs get the
// leaf then the intermediate in status.certificate (the root is not sent),
// verifying with the root alone; the KMS signs once for all of them.
func TestIntermediateModeSignsCSRs(t *testing.T) {
	ctx := testContext(t)
	kms, opts := startKMS(t)
	name := "keyward.dev/inter-csr-" + uniqueName(t, "c")
	keyURI, caFile, root := newCAPathLen(t, opts, kmsURI(kms), "ca-"+uniqueName(t, "csr"), 1)
	activeAuthority(t, name, keyURI, caFile)
	runSignerWith(t, baseConfig(t, config.Signer{Name: name, Profile: config.ProfileCSR,
		Intermediate: &config.Intermediate{Enabled: true},
		CSR: &config.CSRPolicy{TrustDistribution: "ClusterTrustBundle " + name, CommonNames: []string{"*.daemons.example.com"},
			KeyUsages: []string{"digital signature", "client auth"}},
	}), "replica-csr", pcr.V1, opts)
	before := len(kms.SignRequests())
	admin := cp.AdminClient()
	var inter *x509.Certificate
	for i := range 5 {
		c := newCSR(t, ctx, admin, name, x509.CertificateRequest{Subject: pkix.Name{CommonName: fmt.Sprintf("d%d.daemons.example.com", i)}},
			usages(certv1.UsageDigitalSignature, certv1.UsageClientAuth), ptrInt32(600))
		approve(t, ctx, c)
		got := waitCSRDone(t, ctx, c)
		if f := failedCondition(got); f != nil {
			t.Fatalf("Failed %s: %s", f.Reason, f.Message)
		}
		certs := pemCerts(t, string(got.Status.Certificate))
		if len(certs) != 2 || !certs[1].IsCA || !certs[1].MaxPathLenZero {
			t.Fatalf("status.certificate has %d certificates, want leaf then the intermediate", len(certs))
		}
		if inter == nil {
			inter = certs[1]
		} else if !certs[1].Equal(inter) {
			t.Fatal("CSRs signed by two intermediates")
		}
		roots, inters := x509.NewCertPool(), x509.NewCertPool()
		roots.AddCert(root)
		inters.AddCert(certs[1])
		if _, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Fatalf("x509.Verify: %v", err)
		}
	}
	if n := len(kmsSignatures(kms.SignRequests()[before:])); n != 1 {
		t.Errorf("the KMS signed %d times for 5 CSRs, want 1", n)
	}
}
