package record

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const testSigner = "example.com/workload"

func rootPEMOf(t *testing.T, cn string) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: cn}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// authority is an Authority of generations name → (root, status phase).
func authority(uid types.UID, gens ...any) *v1alpha1.Authority {
	a := &v1alpha1.Authority{ObjectMeta: metav1.ObjectMeta{Name: "example.com.workload", UID: uid},
		Spec: v1alpha1.AuthoritySpec{SignerName: testSigner}}
	since := metav1.NewTime(time.Unix(1700000000, 0))
	for i := 0; i+2 < len(gens); i += 3 {
		name, root, phase := gens[i].(string), gens[i+1].(string), gens[i+2].(v1alpha1.Phase)
		a.Spec.Generations = append(a.Spec.Generations, v1alpha1.Generation{Name: name, KeyURI: "pkcs11:object=" + name, CertificatePEM: root})
		a.Status.Generations = append(a.Status.Generations, v1alpha1.GenerationStatus{Name: name, Phase: phase, Since: &since})
	}
	return a
}

func bundle(version, content string, r *Record) *certv1.ClusterTrustBundle {
	b := &certv1.ClusterTrustBundle{ObjectMeta: metav1.ObjectMeta{Name: BundleName(testSigner, version)},
		Spec: certv1.ClusterTrustBundleSpec{SignerName: testSigner, TrustBundle: content}}
	if r != nil {
		b.Annotations = map[string]string{Annotation: r.Encode()}
	}
	return b
}

func getter(bs ...*certv1.ClusterTrustBundle) Getter {
	return func(name string) (*certv1.ClusterTrustBundle, error) {
		for _, b := range bs {
			if b.Name == name {
				return b, nil
			}
		}
		return nil, nil
	}
}

// The newest record of the two bundles counts; a record of another
// Authority object (same name, other UID: deleted and recreated) counts
// for nothing, and is not adopted as a legacy bundle either.
func TestLookupTakesTheNewestRecordOfThisAuthorityOnly(t *testing.T) {
	root := rootPEMOf(t, "g1")
	a := authority("uid-1", "g1", root, v1alpha1.PhaseActive)
	g1 := a.Spec.Generations[0]
	older := &Record{Authority: a.Name, UID: a.UID, Revision: 3, Generations: []Entry{{Name: "g1", Phase: v1alpha1.PhasePromoted, CertificateDigest: CertificateDigest(g1)}}}
	newer := &Record{Authority: a.Name, UID: a.UID, Revision: 4, Generations: []Entry{{Name: "g1", Phase: v1alpha1.PhaseActive, CertificateDigest: CertificateDigest(g1)}}}
	for _, order := range [][2]*Record{{older, newer}, {newer, older}} {
		r, err := Lookup(getter(bundle(v1alpha1.BundleCanary, root, order[0]), bundle(v1alpha1.BundleLive, root, order[1])), a)
		if err != nil || r.Revision != 4 || r.Phase(g1) != v1alpha1.PhaseActive {
			t.Fatalf("Lookup = %+v, %v; want revision 4 (g1 Active)", r, err)
		}
	}

	foreign := &Record{Authority: a.Name, UID: "uid-0", Revision: 9, Generations: []Entry{{Name: "g1", Phase: v1alpha1.PhaseActive, CertificateDigest: CertificateDigest(g1)}}}
	if _, err := Decode(bundle(v1alpha1.BundleLive, root, foreign), a); !errors.Is(err, ErrForeign) {
		t.Fatalf("Decode of another UID's record: %v, want ErrForeign", err)
	}
	r, err := Lookup(getter(bundle(v1alpha1.BundleCanary, root, foreign), bundle(v1alpha1.BundleLive, root, foreign)), a)
	if err != nil || len(r.Generations) != 0 || r.UID != a.UID {
		t.Fatalf("Lookup over another UID's records = %+v, %v; want an empty record of uid-1", r, err)
	}
	if got := Verify(a, r, nil); len(got) != 1 || got[0].Generation != "g1" {
		t.Fatalf("Verify with the foreign record: %+v, want g1's status Active reported", got)
	}

	r, err = Lookup(getter(), a)
	if err != nil || r == nil || len(r.Generations) != 0 {
		t.Fatalf("Lookup with no bundle = %+v, %v; want an empty record", r, err)
	}
	bad := bundle(v1alpha1.BundleLive, root, nil)
	bad.Annotations = map[string]string{Annotation: "{"}
	if _, err := Lookup(getter(bad), a); err == nil || !strings.Contains(err.Error(), Annotation) {
		t.Fatalf("Lookup of a malformed record: %v, want an error naming %s", err, Annotation)
	}
}

// Bundles written before records existed: a status phase counts only when
// its root is in exactly the bundles that phase puts it in; a deleted
// bundle is not read.
func TestLegacyBundlesAdoptOnlyPhasesTheirContentAgreesWith(t *testing.T) {
	active, staged, retiring, forged := rootPEMOf(t, "active"), rootPEMOf(t, "staged"), rootPEMOf(t, "retiring"), rootPEMOf(t, "forged")
	a := authority("uid-1",
		"active", active, v1alpha1.PhaseActive,
		"staged", staged, v1alpha1.PhaseStaged,
		"retiring", retiring, v1alpha1.PhaseRetiring,
		// Status says Promoted (canary and live), the bundles hold it in
		// canary only: not the trust publisher's word.
		"forged", forged, v1alpha1.PhasePromoted,
		"gone", rootPEMOf(t, "gone"), v1alpha1.PhaseRetired)
	canary := bundle(v1alpha1.BundleCanary, active+staged+forged, nil)
	live := bundle(v1alpha1.BundleLive, active+retiring, nil)
	r, err := Lookup(getter(canary, live), a)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]v1alpha1.Phase{}
	for _, e := range r.Generations {
		got[e.Name] = e.Phase
	}
	want := map[string]v1alpha1.Phase{"active": v1alpha1.PhaseActive, "staged": v1alpha1.PhaseStaged, "retiring": v1alpha1.PhaseRetiring}
	if len(got) != len(want) {
		t.Fatalf("adopted %v, want %v", got, want)
	}
	for n, p := range want {
		if got[n] != p {
			t.Fatalf("adopted %v, want %v", got, want)
		}
	}
	if f := Verify(a, r, nil); len(f) != 1 || f[0].Generation != "forged" || f[0].Recorded != "" {
		t.Fatalf("Verify after adoption: %+v, want only the forged Promoted reported", f)
	}

	now := metav1.Now()
	live.DeletionTimestamp = &now
	r, err = Lookup(getter(canary, live), a)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range r.Generations {
		if e.Name == "active" || e.Name == "retiring" {
			t.Fatalf("adopted %s %s although the live bundle is being deleted", e.Name, e.Phase)
		}
	}
}

// A phase recorded for one certificate does not count for another: a
// root swapped in place is reported as changed, and its keyCheck must
// name the current key and certificate.
func TestARecordedPhaseCountsOnlyForItsCertificate(t *testing.T) {
	old, swapped := rootPEMOf(t, "old"), rootPEMOf(t, "swapped")
	a := authority("uid-1", "g1", old, v1alpha1.PhasePromoted)
	r := &Record{Authority: a.Name, UID: a.UID, Revision: 1, Generations: []Entry{{Name: "g1", Phase: v1alpha1.PhasePromoted,
		Since: a.Status.Generations[0].Since, CertificateDigest: CertificateDigest(a.Spec.Generations[0])}}}
	if f := Verify(a, r, nil); len(f) != 0 {
		t.Fatalf("Verify of the recorded phase: %+v, want nothing", f)
	}
	kc := &v1alpha1.KeyCheck{Ready: true, KeyURI: a.Spec.Generations[0].KeyURI, CertificateDigest: CertificateDigest(a.Spec.Generations[0])}
	if !Checks(kc, a.Spec.Generations[0]) {
		t.Fatal("a keyCheck of the current key and certificate does not count")
	}

	a.Spec.Generations[0].CertificatePEM = swapped
	if r.Phase(a.Spec.Generations[0]) != "" {
		t.Fatal("the record's phase counts for a swapped certificate")
	}
	if Checks(kc, a.Spec.Generations[0]) {
		t.Fatal("a keyCheck of the old certificate counts for the swapped one")
	}
	f := Verify(a, r, nil)
	if len(f) != 1 || !f[0].CertificateChanged || !strings.Contains(f[0].String(), "certificate changed") {
		t.Fatalf("Verify after the swap: %+v, want g1 reported as a changed certificate", f)
	}
	if c := Changed(a, r, nil); c["g1"].CertificateDigest == CertificateDigest(a.Spec.Generations[0]) {
		t.Fatalf("Changed = %+v, want g1 with the digest its phase was reached with", c)
	}
}
