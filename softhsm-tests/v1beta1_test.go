package softhsmtests

import (
	"context"
	"crypto/x509"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/kubeclient"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	"github.com/keyward/keyward/testsupport/testkeys"
	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// During an upgrade to 1.37 an admin may keep certificates.k8s.io/v1beta1
// served, and kubelets older than 1.37 create PodCertificateRequests through
// it with pkixPublicKey + proofOfPossession, a form v1 does not show.
// keyward, discovering versions on its own (none forced), reads through
// v1beta1 while it is served and issues for both key forms; the apiserver's
// deprecation warning, returned on every v1beta1 request, is logged at most
// once.
func TestV1beta1RequestsInBothKeyForms(t *testing.T) {
	ctx := testContext(t)
	for _, v := range []string{"v1", "v1beta1"} {
		if _, err := cp.AdminClient().Discovery().ServerResourcesForGroupVersion("certificates.k8s.io/" + v); err != nil {
			t.Fatalf("the test needs certificates.k8s.io/%s served: %v", v, err)
		}
	}
	suffix := uniqueName(t, "b")
	name := "keyward.dev/beta-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	cfg := baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile))
	s := runSignerVersion(t, cfg, "replica-0", "") // discovery, not a forced version
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	node := nodeClient(t, w.Node.Name)

	cases := []struct {
		name    string
		keyType string
		pkix    bool
	}{
		{name: "stubPKCS10Request", keyType: nodehelper.KeyTypeECDSAP256},
		{name: "pkixPublicKey with an ECDSA proof", keyType: nodehelper.KeyTypeECDSAP256, pkix: true},
		{name: "pkixPublicKey with an Ed25519 proof", keyType: nodehelper.KeyTypeED25519, pkix: true},
		{name: "pkixPublicKey with an RSA-PSS proof", keyType: nodehelper.KeyTypeRSA3072, pkix: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, err := nodehelper.GenerateKey(c.keyType)
			if err != nil {
				t.Fatal(err)
			}
			v1, err := nodehelper.NewPodCertificateRequest(podRef(w), name, key, nodehelper.PodCertificateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			p := &certv1beta1.PodCertificateRequest{
				ObjectMeta: v1.ObjectMeta,
				Spec: certv1beta1.PodCertificateRequestSpec{
					SignerName: name, PodName: v1.Spec.PodName, PodUID: v1.Spec.PodUID,
					ServiceAccountName: v1.Spec.ServiceAccountName, ServiceAccountUID: v1.Spec.ServiceAccountUID,
					NodeName: v1.Spec.NodeName, NodeUID: v1.Spec.NodeUID,
				},
			}
			if c.pkix {
				if p.Spec.PKIXPublicKey, err = x509.MarshalPKIXPublicKey(key.Public()); err != nil {
					t.Fatal(err)
				}
				if p.Spec.ProofOfPossession, err = testkeys.ProofOfPossession(key, string(p.Spec.PodUID)); err != nil {
					t.Fatal(err)
				}
			} else {
				p.Spec.StubPKCS10Request = v1.Spec.StubPKCS10Request
			}
			created, err := node.CertificatesV1beta1().PodCertificateRequests(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("node creating v1beta1 PCR: %v", err)
			}
			var got *certv1beta1.PodCertificateRequest
			err = wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
				got, err = cp.AdminClient().CertificatesV1beta1().PodCertificateRequests(p.Namespace).Get(ctx, created.Name, metav1.GetOptions{})
				return err == nil && len(got.Status.Conditions) > 0, err
			})
			if err != nil {
				t.Fatalf("no status: %v", err)
			}
			if c := got.Status.Conditions[0]; c.Type != "Issued" {
				t.Fatalf("%s/%s: %s", c.Type, c.Reason, c.Message)
			}
			leaf := parseChain(t, got.Status.CertificateChain, root)
			want, _ := x509.MarshalPKIXPublicKey(key.Public())
			if string(leaf.RawSubjectPublicKeyInfo) != string(want) {
				t.Fatal("leaf is not for the requested key")
			}
		})
	}

	s.Stop()
	log, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `version="certificates.k8s.io/v1beta1"`) {
		t.Errorf("the signer did not say it reads through v1beta1:\n%s", log)
	}
	if n := strings.Count(string(log), "is deprecated"); n > 1 {
		t.Errorf("the deprecation warning was logged %d times, want at most once", n)
	}
}

// The version keyward reads through is what kubeclient's discovery picks
// on this control plane: v1beta1, served next to v1.
func TestV1beta1DiscoveryPicksV1beta1WhenServed(t *testing.T) {
	v, err := kubeclient.PodCertificateVersion(cp.AdminClient().Discovery())
	if err != nil {
		t.Fatal(err)
	}
	if v != "v1beta1" {
		t.Fatalf("discovery picked %s, want v1beta1 (it alone shows pkixPublicKey requests)", v)
	}
}

// podCertificateRequestVersion: v1 makes the signer read through v1 on a
// cluster that also serves v1beta1 (no conversion by kube-apiserver), and
// it issues as before.
func TestConfiguredVersionOverridesDiscovery(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "v")
	name := "keyward.dev/v1-" + suffix
	keyURI, caFile, _ := caInToken(t, "ca-"+suffix)
	cfg := baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile))
	cfg.PodCertificateRequestVersion = "v1"
	s := runSignerVersion(t, cfg, "replica-0", "") // no version forced by the test: the configuration's
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	created, _ := createPCR(t, ctx, w, name, pcrOptions{})
	if got := waitTerminal(t, ctx, created, time.Minute); condition(got).Type != certv1.PodCertificateRequestConditionTypeIssued {
		t.Fatalf("status %+v, want Issued", got.Status.Conditions)
	}
	s.Stop()
	log, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), `version="certificates.k8s.io/v1"`) {
		t.Errorf("the signer did not say it reads through v1:\n%s", log)
	}
}

// A configured version the cluster does not serve stops the start with one
// error that names the field, before anything is signed.
func TestConfiguredVersionNotServedStopsTheStart(t *testing.T) {
	ownControlPlaneWith(t, controlplane.Options{ExtraAPIServerFlags: []string{"--runtime-config=certificates.k8s.io/v1beta1=false"}})
	suffix := uniqueName(t, "n")
	name := "keyward.dev/unserved-" + suffix
	keyURI, caFile, _ := caInToken(t, "ca-"+suffix)
	cfg := baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile))
	cfg.PodCertificateRequestVersion = "v1beta1"
	reg, err := all.NewRegistry(all.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	ctx, cancel := context.WithTimeout(testContext(t), time.Minute)
	defer cancel()
	err = signer.Run(ctx, signer.Options{Config: cfg, Backends: reg, Identity: "replica-0"})
	want := "podCertificateRequestVersion is v1beta1, but the cluster does not serve PodCertificateRequests in certificates.k8s.io/v1beta1"
	if err == nil || err.Error() != want {
		t.Fatalf("signer.Run: %v; want %q", err, want)
	}
}
