package pcr

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/x509"
	"strings"
	"testing"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/profile"
	"github.com/keyward/keyward/testsupport/testkeys"
	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// FuzzPublicKey: whatever a request carries in stubPKCS10Request,
// pkixPublicKey and proofOfPossession, decoding it (v1 and v1beta1) never
// panics and gives either an error that names the field at fault or a key
// of a family the apiserver issues for (RSA, ECDSA, Ed25519) that
// round-trips through PKIX DER; check then denies or passes with a reason,
// never panics.
func FuzzPublicKey(f *testing.F) {
	kts := []string{nodehelper.KeyTypeECDSAP256, nodehelper.KeyTypeECDSAP384, nodehelper.KeyTypeED25519}
	keys, stubs := map[string]crypto.Signer{}, map[string][]byte{}
	for _, kt := range kts {
		key, err := nodehelper.GenerateKey(kt)
		if err != nil {
			f.Fatal(err)
		}
		if stubs[kt], err = nodehelper.NewStubPKCS10Request(key); err != nil {
			f.Fatal(err)
		}
		keys[kt] = key
	}
	for _, kt := range kts {
		key, stub := keys[kt], stubs[kt]
		der, err := x509.MarshalPKIXPublicKey(key.Public())
		if err != nil {
			f.Fatal(err)
		}
		proof, err := testkeys.ProofOfPossession(key, popPodUID)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(stub, []byte(nil), []byte(nil), popPodUID)           // v1 form
		f.Add([]byte(nil), der, proof, popPodUID)                  // pre-1.37 kubelet form
		f.Add([]byte(nil), der, proof, popPodUID+"x")              // proof over another pod
		f.Add(stub[:len(stub)/2], der[:len(der)-1], proof[1:], "") // truncated
	}
	f.Add([]byte{0x30, 0x00}, []byte{0x30, 0x00}, []byte{}, "")
	// Stubs whose key crypto/x509 cannot use: their signatures no longer
	// verify, which keyward leaves to the apiserver. The ECDSA key's
	// algorithm OID 1.2.840.10045.2.1 made 2.2 (unknown: the key parses
	// as nil) and the Ed25519 one made X25519 (1.3.101.110, also nil).
	for kt, swap := range map[string][2][]byte{
		nodehelper.KeyTypeECDSAP256: {{0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01}, {0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x02}},
		nodehelper.KeyTypeED25519:   {{0x06, 0x03, 0x2b, 0x65, 0x70}, {0x06, 0x03, 0x2b, 0x65, 0x6e}},
	} {
		if !bytes.Contains(stubs[kt], swap[0]) {
			f.Fatalf("no algorithm OID %x in the %s stub", swap[0], kt)
		}
		f.Add(bytes.Replace(stubs[kt], swap[0], swap[1], 1), []byte(nil), []byte(nil), popPodUID)
	}
	signer := &signerState{Signer: &Signer{Name: "keyward.dev/unit", AllowedKeyTypes: config.AllKeyTypes()}}
	f.Fuzz(func(t *testing.T, stub, der, proof []byte, podUID string) {
		beta := decodeV1beta1(&certv1beta1.PodCertificateRequest{Spec: certv1beta1.PodCertificateRequestSpec{
			PodUID: types.UID(podUID), StubPKCS10Request: stub, PKIXPublicKey: der, ProofOfPossession: proof,
		}})
		checkDecodedKey(t, beta, "stubPKCS10Request", "pkixPublicKey", "proofOfPossession")
		v1 := decodeV1(&certv1.PodCertificateRequest{Spec: certv1.PodCertificateRequestSpec{
			PodUID: types.UID(podUID), StubPKCS10Request: stub,
		}})
		checkDecodedKey(t, v1, "stubPKCS10Request")
		for _, r := range []*request{beta, v1} {
			if d := (&Controller{}).check(signer, r); d != nil && (d.Reason == "" || d.Message == "") {
				t.Fatalf("denial without a reason or message: %+v", d)
			}
		}
	})
}

// checkDecodedKey holds decoding's promise for one decoded request: an
// error naming one of fields, or a key that round-trips.
func checkDecodedKey(t *testing.T, r *request, fields ...string) {
	t.Helper()
	if r.keyErr != nil {
		if r.publicKey != nil {
			t.Fatalf("both a key (%T) and an error: %v", r.publicKey, r.keyErr)
		}
		msg := r.keyErr.Error()
		if !containsAny(msg, fields) {
			t.Fatalf("error names none of %v: %q", fields, msg)
		}
		return
	}
	if r.publicKey == nil {
		t.Fatal("neither a key nor an error")
	}
	kt := KeyType(r.publicKey)
	if !strings.HasPrefix(kt, "RSA") && !strings.HasPrefix(kt, "ECDSA") && kt != "ED25519" {
		t.Fatalf("accepted a %s key: no proof or issuance scheme for it", kt)
	}
	der, err := x509.MarshalPKIXPublicKey(r.publicKey)
	if err != nil {
		t.Fatalf("accepted %s key does not marshal: %v", kt, err)
	}
	again, err := x509.ParsePKIXPublicKey(der)
	if err != nil {
		t.Fatalf("accepted %s key does not parse back: %v", kt, err)
	}
	if eq, ok := r.publicKey.(interface{ Equal(crypto.PublicKey) bool }); !ok || !eq.Equal(again) {
		t.Fatalf("%s key changed in a PKIX round trip", kt)
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// FuzzUnverifiedUserAnnotations: whatever two annotations a request
// carries, check and the server profile never panic; an unknown key is
// denied with every unknown key quoted, an invalid DNS-names value with a
// denial that names the annotation, each denial stays small; an accepted
// value gives at most profile.MaxDNSNames distinct valid DNS names, each
// taken from the value, none a wildcard.
func FuzzUnverifiedUserAnnotations(f *testing.F) {
	const team = "example.com/team"
	f.Add(config.DefaultDNSNamesKey, "sa.ns.svc", team, "a")
	f.Add(config.DefaultDNSNamesKey, "sa.ns.svc, web.ns.svc.cluster.local,sa.ns.svc", team, "")
	f.Add(config.DefaultDNSNamesKey, "*.ns.svc.cluster.local", "other.example.com/x", "y")
	f.Add(config.DefaultDNSNamesKey, " , ,", team, "")
	f.Add(config.DefaultDNSNamesKey, "Bad_Name.ns.svc", team, "")
	f.Add(config.DefaultDNSNamesKey, "other.ns2.svc", team, "")
	f.Add("unknown", "v", "also-unknown", "w")
	// Oversize: more names than a certificate should carry, each allowed.
	var many []string
	for i := range 3 * profile.MaxDNSNames {
		many = append(many, "h"+strings.Repeat("x", i%40)+string(rune('a'+i%26))+"-"+string(rune('a'+i/26%26))+".ns.svc.cluster.local")
	}
	f.Add(config.DefaultDNSNamesKey, strings.Join(many, ","), team, "")
	f.Add(config.DefaultDNSNamesKey, strings.Repeat("a", 300)+".ns.svc", team, "")

	prof, err := profile.New(config.Signer{Name: "keyward.dev/server", Profile: config.ProfileServer, Server: &config.Server{
		DNSNamesAnnotation: config.DefaultDNSNamesKey,
		AllowedDNSNames:    []string{"{serviceAccount}.{namespace}.svc", "*.{namespace}.svc.cluster.local"},
	}})
	if err != nil {
		f.Fatal(err)
	}
	signer := &signerState{Signer: &Signer{Name: "keyward.dev/server", Profile: prof, AllowedKeyTypes: config.AllKeyTypes(),
		Annotations: []string{config.DefaultDNSNamesKey, team}}}
	key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
	if err != nil {
		f.Fatal(err)
	}
	pub := key.Public().(*ecdsa.PublicKey)
	// A denial is written into a condition and an Event: a few hundred
	// bytes of prose plus quoted (bounded) values, never the whole input.
	const maxMessage = 1024

	f.Fuzz(func(t *testing.T, k1, v1, k2, v2 string) {
		ann := map[string]string{k1: v1, k2: v2}
		r := &request{namespace: "ns", podName: "pod", serviceAccountName: "sa", publicKey: pub, annotations: ann}
		if d := (&Controller{}).check(signer, r); d != nil {
			if d.Reason != profile.ReasonInvalidAnnotations {
				t.Fatalf("denied with %s, want %s: %s", d.Reason, profile.ReasonInvalidAnnotations, d.Message)
			}
			for k := range ann {
				if k != config.DefaultDNSNamesKey && k != team && !strings.Contains(d.Message, profile.Quote(k)) {
					t.Fatalf("denial does not quote unknown key %q: %s", k, d.Message)
				}
			}
			if len(d.Message) > maxMessage {
				t.Fatalf("denial of %d bytes", len(d.Message))
			}
			return
		}
		tmpl, err := prof.Template(profile.Request{Namespace: "ns", PodName: "pod", ServiceAccountName: "sa", Annotations: ann, PublicKey: pub})
		if err != nil {
			d, ok := err.(*profile.Denial)
			if !ok {
				t.Fatalf("not a denial: %v", err)
			}
			switch d.Reason {
			case profile.ReasonInvalidAnnotations:
				if !strings.Contains(d.Message, config.DefaultDNSNamesKey) {
					t.Fatalf("denial does not name the annotation: %s", d.Message)
				}
			case profile.ReasonDNSNameNotAllowed:
			default:
				t.Fatalf("denied with %s: %s", d.Reason, d.Message)
			}
			if len(d.Message) > maxMessage {
				t.Fatalf("denial of %d bytes", len(d.Message))
			}
			return
		}
		names := tmpl.DNSNames
		if len(names) == 0 || len(names) > profile.MaxDNSNames {
			t.Fatalf("%d DNS names issued (want 1 to %d)", len(names), profile.MaxDNSNames)
		}
		items := strings.Split(ann[config.DefaultDNSNamesKey], ",")
		seen := map[string]bool{}
		for _, n := range names {
			if seen[n] {
				t.Fatalf("%q issued twice", n)
			}
			seen[n] = true
			if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
				t.Fatalf("issued %q, not a DNS name: %v", n, errs)
			}
			if strings.Contains(n, "*") {
				t.Fatalf("issued wildcard %q", n)
			}
			found := false
			for _, it := range items {
				found = found || strings.TrimSpace(it) == n
			}
			if !found {
				t.Fatalf("issued %q, which the annotation does not list", n)
			}
		}
		if cn := tmpl.Subject.CommonName; cn != "" && !seen[cn] {
			t.Fatalf("common name %q is none of the DNS names", cn)
		}
	})
}
