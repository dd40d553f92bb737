package softhsmtests

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/asn1"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/profile"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

func httpOK(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return &httpStatusError{resp.Status}
	}
	return nil
}

type httpStatusError struct{ status string }

func (e *httpStatusError) Error() string { return e.status }

// parseChain decodes an issued chain and verifies the leaf to root.
func parseChain(t *testing.T, chain string, root *x509.Certificate) *x509.Certificate {
	t.Helper()
	var certs []*x509.Certificate
	rest := []byte(chain)
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		certs = append(certs, c)
	}
	if len(certs) < 2 {
		t.Fatalf("chain has %d certificates, want leaf and CA", len(certs))
	}
	leaf := certs[0]
	// Go's verifier refuses unknown critical extensions; the PodIdentity
	// extension is one, by design, for consumers that do not know it. Any
	// other unhandled critical extension is a defect.
	var unhandled []asn1.ObjectIdentifier
	for _, oid := range leaf.UnhandledCriticalExtensions {
		if !oid.Equal(profile.OIDPodIdentity) {
			unhandled = append(unhandled, oid)
		}
	}
	if len(unhandled) > 0 {
		t.Fatalf("leaf has unhandled critical extensions %v", unhandled)
	}
	leaf.UnhandledCriticalExtensions = nil
	roots := x509.NewCertPool()
	roots.AddCert(root)
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		t.Fatalf("issued leaf does not verify to the CA: %v", err)
	}
	return leaf
}

// signerConfig is the policy of signer name with profileName. Its CA, the
// key at keyURI and the certificate in caFile, becomes the one generation
// (testGeneration) of the signer name's Authority, desired and observed
// Active, as the trust publisher leaves a bootstrapped Authority.
func signerConfig(t testing.TB, name, profileName, keyURI, caFile string) config.Signer {
	t.Helper()
	activeAuthority(t, name, keyURI, caFile)
	return config.Signer{Name: name, Profile: profileName}
}

// Every key type the apiserver accepts is issued by a signer that allows
// it, and denied with UnsupportedKeyType by one that does not; the PCR of a
// signer name keyward does not own is never touched.
func TestKeyTypesAreIssuedOrDenied(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "s")
	all := "keyward.dev/all-" + suffix
	ecOnly := "keyward.dev/ec-" + suffix
	notOurs := "keyward.dev/not-ours-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	ec := signerConfig(t, ecOnly, config.ProfilePodIdentity, keyURI, caFile)
	ec.AllowedKeyTypes = []string{"ECDSAP256", "ECDSAP384"}
	runSigner(t, baseConfig(t, signerConfig(t, all, config.ProfilePodIdentity, keyURI, caFile), ec), "replica-0")

	node := uniqueName(t, "node")
	for _, kt := range []string{"RSA3072", "RSA4096", "ECDSAP256", "ECDSAP384", "ECDSAP521", "ED25519"} {
		t.Run(kt, func(t *testing.T) {
			w := podOnNode(t, ctx, node, all, ecOnly)
			issued, key := createPCR(t, ctx, w, all, pcrOptions{keyType: kt})
			got := waitTerminal(t, ctx, issued, 30*time.Second)
			if c := condition(got); c.Type != "Issued" {
				t.Fatalf("%s for %s: %s/%s: %s", kt, all, c.Type, c.Reason, c.Message)
			}
			leaf := parseChain(t, got.Status.CertificateChain, root)
			want, _ := x509.MarshalPKIXPublicKey(key.Public())
			if !bytes.Equal(leaf.RawSubjectPublicKeyInfo, want) {
				t.Fatal("leaf is not for the requested key")
			}
			// podIdentity leaves are client-only: no keyEncipherment, RSA or not.
			if leaf.KeyUsage != x509.KeyUsageDigitalSignature {
				t.Errorf("key usage %v, want digitalSignature alone", leaf.KeyUsage)
			}

			denied, _ := createPCR(t, ctx, w, ecOnly, pcrOptions{keyType: kt})
			got = waitTerminal(t, ctx, denied, 30*time.Second)
			c := condition(got)
			if kt == "ECDSAP256" || kt == "ECDSAP384" {
				if c.Type != "Issued" {
					t.Fatalf("%s for %s: %s/%s", kt, ecOnly, c.Type, c.Reason)
				}
				return
			}
			if c.Type != "Denied" || c.Reason != "UnsupportedKeyType" || !strings.Contains(c.Message, "ECDSAP256") {
				t.Fatalf("%s for %s: %s/%s %q, want Denied/UnsupportedKeyType suggesting ECDSAP256", kt, ecOnly, c.Type, c.Reason, c.Message)
			}
			if got.Status.CertificateChain != "" || got.Status.NotAfter != nil {
				t.Errorf("Denied status carries certificate fields: %+v", got.Status)
			}
		})
	}

	t.Run("a signer name keyward does not own", func(t *testing.T) {
		w := podOnNode(t, ctx, node, notOurs)
		p, _ := createPCR(t, ctx, w, notOurs, pcrOptions{})
		time.Sleep(2 * time.Second) // long enough for a signer that wrongly watched it
		got, err := cp.AdminClient().CertificatesV1().PodCertificateRequests(p.Namespace).Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Status.Conditions) != 0 || got.ResourceVersion != p.ResourceVersion {
			t.Fatalf("PCR for %s was touched: %+v", notOurs, got.Status)
		}
	})
}

// Each profile's certificate carries the identity it promises.
func TestProfilesCarryThePodIdentity(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "p")
	podID := "keyward.dev/pod-id-" + suffix
	spiffe := "keyward.dev/spiffe-" + suffix
	server := "keyward.dev/server-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	sp := signerConfig(t, spiffe, config.ProfileSPIFFE, keyURI, caFile)
	sp.SPIFFE = &config.SPIFFE{TrustDomain: "cluster.local"}
	srv := signerConfig(t, server, config.ProfileServer, keyURI, caFile)
	srv.Server = &config.Server{AllowedDNSNames: []string{"{serviceAccount}.{namespace}.svc"}}
	srv.UnverifiedUserAnnotations = []string{config.DefaultDNSNamesKey}
	runSigner(t, baseConfig(t, signerConfig(t, podID, config.ProfilePodIdentity, keyURI, caFile), sp, srv), "replica-0")

	w := podOnNode(t, ctx, uniqueName(t, "node"), podID, spiffe, server)
	ns := w.Pod.Namespace

	t.Run("podIdentity", func(t *testing.T) {
		p, _ := createPCR(t, ctx, w, podID, pcrOptions{})
		got := waitTerminal(t, ctx, p, 30*time.Second)
		leaf := parseChain(t, got.Status.CertificateChain, root)
		pi, err := profile.ParsePodIdentity(leaf)
		if err != nil {
			t.Fatal(err)
		}
		want := profile.PodIdentity{Namespace: ns,
			ServiceAccountName: w.ServiceAccount.Name, ServiceAccountUID: string(w.ServiceAccount.UID),
			PodName: w.Pod.Name, PodUID: string(w.Pod.UID), NodeName: w.Node.Name, NodeUID: string(w.Node.UID)}
		if *pi != want {
			t.Fatalf("PodIdentity = %+v\nwant %+v", *pi, want)
		}
		if len(leaf.DNSNames)+len(leaf.URIs)+len(leaf.IPAddresses)+len(leaf.EmailAddresses) != 0 {
			t.Error("podIdentity certificate has SANs")
		}
		if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
			t.Errorf("extended key usage %v, want client auth", leaf.ExtKeyUsage)
		}
		// Non-critical by default (podIdentity.critical is opt-in), so a
		// TLS peer that does not know the extension still accepts the leaf.
		found := 0
		for _, e := range leaf.Extensions {
			if e.Id.Equal(profile.OIDPodIdentity) {
				found++
				if e.Critical {
					t.Error("PodIdentity extension is critical without podIdentity.critical")
				}
			}
		}
		if found != 1 {
			t.Errorf("%d PodIdentity extensions, want one", found)
		}
		// parseChain forgives the PodIdentity extension; a fresh parse does not.
		fresh, err := x509.ParseCertificate(leaf.Raw)
		if err != nil {
			t.Fatal(err)
		}
		roots := x509.NewCertPool()
		roots.AddCert(root)
		if _, err := fresh.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("x509.Verify with default options refuses the podIdentity leaf: %v", err)
		}
	})
	t.Run("spiffe", func(t *testing.T) {
		p, _ := createPCR(t, ctx, w, spiffe, pcrOptions{})
		leaf := parseChain(t, waitTerminal(t, ctx, p, 30*time.Second).Status.CertificateChain, root)
		if len(leaf.URIs) != 1 || leaf.URIs[0].String() != "spiffe://cluster.local/ns/"+ns+"/sa/workload" {
			t.Fatalf("URIs = %v", leaf.URIs)
		}
		if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}) {
			t.Errorf("extended key usage %v, want server and client auth", leaf.ExtKeyUsage)
		}
	})
	t.Run("server", func(t *testing.T) {
		p, _ := createPCR(t, ctx, w, server, pcrOptions{annotations: map[string]string{config.DefaultDNSNamesKey: "workload." + ns + ".svc"}})
		leaf := parseChain(t, waitTerminal(t, ctx, p, 30*time.Second).Status.CertificateChain, root)
		if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "workload."+ns+".svc" {
			t.Fatalf("DNS names = %v", leaf.DNSNames)
		}
		if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) {
			t.Errorf("extended key usage %v, want server auth", leaf.ExtKeyUsage)
		}
	})
	t.Run("server name outside the patterns is denied naming it", func(t *testing.T) {
		p, _ := createPCR(t, ctx, w, server, pcrOptions{annotations: map[string]string{config.DefaultDNSNamesKey: "api.kube-system.svc"}})
		c := condition(waitTerminal(t, ctx, p, 30*time.Second))
		if c.Type != "Denied" || c.Reason != profile.ReasonDNSNameNotAllowed || !strings.Contains(c.Message, `"api.kube-system.svc"`) {
			t.Fatalf("got %s/%s %q", c.Type, c.Reason, c.Message)
		}
	})
	t.Run("an unknown annotation is denied", func(t *testing.T) {
		p, _ := createPCR(t, ctx, w, podID, pcrOptions{annotations: map[string]string{"example.com/colour": "red"}})
		c := condition(waitTerminal(t, ctx, p, 30*time.Second))
		if c.Type != "Denied" || c.Reason != "InvalidUnverifiedUserAnnotations" || !strings.Contains(c.Message, "example.com/colour") {
			t.Fatalf("got %s/%s %q", c.Type, c.Reason, c.Message)
		}
	})
	t.Run("maxExpirationSeconds 3600 gives a one-hour certificate", func(t *testing.T) {
		hour := int32(3600)
		p, _ := createPCR(t, ctx, w, podID, pcrOptions{maxExpirationSeconds: &hour})
		got := waitTerminal(t, ctx, p, 30*time.Second)
		leaf := parseChain(t, got.Status.CertificateChain, root)
		if d := leaf.NotAfter.Sub(leaf.NotBefore); d != time.Hour {
			t.Fatalf("lifetime %s, want 1h", d)
		}
		if r := got.Status.BeginRefreshAt.Time; r.Sub(leaf.NotBefore) != 30*time.Minute {
			t.Errorf("beginRefreshAt %s after notBefore, want 30m", r.Sub(leaf.NotBefore))
		}
	})
}

// The signer reports issuances, latency, backend signatures and its CA's
// expiry on /metrics, answers /healthz and /readyz, records an Event for
// each outcome and writes one audit line per issued certificate.
func TestMetricsAndHealth(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "m")
	name := "keyward.dev/metrics-" + suffix
	keyURI, caFile, root := caInToken(t, "ca-"+suffix)
	cfg := baseConfig(t, signerConfig(t, name, config.ProfilePodIdentity, keyURI, caFile))
	cfg.Events.Issued = true
	s := runSigner(t, cfg, "replica-0")
	w := podOnNode(t, ctx, uniqueName(t, "node"), name)
	p, _ := createPCR(t, ctx, w, name, pcrOptions{})
	issued := waitTerminal(t, ctx, p, 30*time.Second)
	leaf := parseChain(t, issued.Status.CertificateChain, root)
	denied, _ := createPCR(t, ctx, w, name, pcrOptions{annotations: map[string]string{"example.com/x": "y"}})
	waitTerminal(t, ctx, denied, 30*time.Second)

	// Events on the PCRs, as kubectl describe shows them.
	for _, tc := range []struct {
		pcr            *certv1.PodCertificateRequest
		typ, reason    string
		messageContent string
	}{
		{p, corev1.EventTypeNormal, "Issued", leaf.SerialNumber.Text(16)},
		{denied, corev1.EventTypeWarning, "InvalidUnverifiedUserAnnotations", "example.com/x"},
	} {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			evs, err := cp.AdminClient().CoreV1().Events(tc.pcr.Namespace).List(ctx, metav1.ListOptions{
				FieldSelector: "involvedObject.name=" + tc.pcr.Name + ",involvedObject.kind=PodCertificateRequest"})
			if err != nil {
				return false, err
			}
			for _, e := range evs.Items {
				if e.Type == tc.typ && e.Reason == tc.reason && strings.Contains(e.Message, tc.messageContent) && e.Source.Component == "keyward-signer" {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Errorf("no %s Event %s mentioning %q on %s: %v", tc.typ, tc.reason, tc.messageContent, tc.pcr.Name, err)
		}
	}

	// The audit line names the certificate, the workload and the CA key.
	logData, err := os.ReadFile(s.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	var audit string
	for _, line := range strings.Split(string(logData), "\n") {
		if strings.Contains(line, `"Issued"`) && strings.Contains(line, `pcr="`+p.Namespace+"/"+p.Name+`"`) {
			audit = line
		}
	}
	for _, field := range []string{
		`serial="` + leaf.SerialNumber.Text(16) + `"`, `signer="` + name + `"`, `namespace="` + p.Namespace + `"`,
		`pod="` + w.Pod.Name + `"`, `serviceAccount="` + w.ServiceAccount.Name + `"`, `node="` + w.Node.Name + `"`,
		`keyType="ECDSAP256"`, `notAfter="` + leaf.NotAfter.UTC().Format(time.RFC3339) + `"`, `caKeyID=`,
	} {
		if !strings.Contains(audit, field) {
			t.Errorf("audit line lacks %s: %q", field, audit)
		}
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		if err := httpOK("http://" + s.HealthAddr + path); err != nil {
			t.Errorf("%s: %v", path, err)
		}
	}
	resp, err := http.Get("http://" + s.MetricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		`keyward_pcr_outcomes_total{outcome="Issued",reason="Issued",signer="` + name + `"} 1`,
		`keyward_pcr_outcomes_total{outcome="Denied",reason="InvalidUnverifiedUserAnnotations",signer="` + name + `"} 1`,
		`keyward_pcr_latency_seconds_count{signer="` + name + `"} 2`,
		`keyward_backend_sign_duration_seconds_count{backend="pkcs11"} 1`,
		fmt.Sprintf(`keyward_ca_not_after_timestamp_seconds{generation="%s",signer="%s"} %s`, testGeneration, name, strconv.FormatFloat(float64(root.NotAfter.Unix()), 'g', -1, 64)),
		`keyward_pcr_queue_depth 0`,
		`keyward_pcr_pending_requests 0`,
		`keyward_events_total{reason="Issued",type="Normal"} 1`,
		`keyward_events_total{reason="InvalidUnverifiedUserAnnotations",type="Warning"} 1`,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	// The replica that issues says it leads (the NoLeader alert sums it).
	if !regexp.MustCompile(`(?m)^keyward_leader\{lease="[^"]*"\} 1$`).Match(body) {
		t.Errorf("/metrics lacks keyward_leader{lease=...} 1")
	}
}

// Per-node limits: in deny mode the request over the burst is Denied
// RateLimited; in delay mode it waits for a token and is Issued.
func TestRateLimitsDenyOrDelay(t *testing.T) {
	ctx := testContext(t)
	suffix := uniqueName(t, "r")
	deny := "keyward.dev/deny-" + suffix
	delay := "keyward.dev/delay-" + suffix
	keyURI, caFile, _ := caInToken(t, "ca-"+suffix)
	d := signerConfig(t, deny, config.ProfilePodIdentity, keyURI, caFile)
	d.RateLimits = config.RateLimits{PerNode: &config.Rate{QPS: 0.01, Burst: 2}, OnLimit: "deny"}
	l := signerConfig(t, delay, config.ProfilePodIdentity, keyURI, caFile)
	l.RateLimits = config.RateLimits{PerNamespace: &config.Rate{QPS: 1, Burst: 1}}
	runSigner(t, baseConfig(t, d, l), "replica-0")
	w := podOnNode(t, ctx, uniqueName(t, "node"), deny, delay)

	var outcomes []string
	for range 3 {
		p, _ := createPCR(t, ctx, w, deny, pcrOptions{})
		c := condition(waitTerminal(t, ctx, p, 30*time.Second))
		outcomes = append(outcomes, c.Type+"/"+c.Reason)
	}
	if want := "Issued/Issued Issued/Issued Denied/RateLimited"; strings.Join(outcomes, " ") != want {
		t.Fatalf("deny mode outcomes %v, want %s", outcomes, want)
	}

	start := time.Now()
	var ps []*certv1.PodCertificateRequest
	for range 3 {
		p, _ := createPCR(t, ctx, w, delay, pcrOptions{})
		ps = append(ps, p)
	}
	for _, p := range ps {
		if c := condition(waitTerminal(t, ctx, p, 30*time.Second)); c.Type != "Issued" {
			t.Fatalf("delay mode: %s/%s", c.Type, c.Reason)
		}
	}
	// A burst of 1 at 1/s: the third waits about two seconds.
	if took := time.Since(start); took < 1500*time.Millisecond {
		t.Fatalf("three requests at 1/s (burst 1) were all issued in %s: not delayed", took)
	}
}
