package softhsmtests

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"testing"
	"time"

	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/nodehelper/certstore"
	"github.com/keyward/keyward/nodehelper/csrclient"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/csr"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
)

// A node identity requests a daemon certificate with csrclient against the
// real apiserver, keyward signing from a SoftHSM2-held CA key: one CSR per
// request however often it is submitted, the chain once approved, and the
// refusals and the deletion as the typed errors a node agent branches on.
func TestCSRClientRoundTrip(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	const signerName = "keyward.dev/csrclient-daemons"
	keyURI, caFile, root := caInToken(t, uniqueName(t, "csrclient-ca"))
	activeAuthority(t, signerName, keyURI, caFile)
	letNodesRequest(t, ctx)
	runSigner(t, baseConfig(t, config.Signer{Name: signerName, Profile: config.ProfileCSR, CSR: &config.CSRPolicy{
		TrustDistribution: "ClusterTrustBundle keyward.dev:csrclient-daemons:live",
		CommonNames:       []string{"*.daemons.example.com"}, Organizations: []string{"daemons"},
		DNSNames: []string{"*.daemons.example.com"}, KeyUsages: []string{"digital signature", "client auth"},
	}}), "csrclient-signer")
	admin := cp.AdminClient()
	node := uniqueName(t, "node")
	client := nodeClient(t, node)

	request := func(t *testing.T, key crypto.Signer, usages ...certv1.KeyUsage) csrclient.Request {
		t.Helper()
		if key == nil {
			var err error
			if key, err = nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256); err != nil {
				t.Fatal(err)
			}
		}
		if len(usages) == 0 {
			usages = []certv1.KeyUsage{certv1.UsageDigitalSignature, certv1.UsageClientAuth}
		}
		return csrclient.Request{
			SignerName: signerName,
			Template: &x509.CertificateRequest{
				Subject:  pkix.Name{CommonName: node + ".daemons.example.com", Organization: []string{"daemons"}},
				DNSNames: []string{node + ".daemons.example.com"},
			},
			Usages: usages, ExpirationSeconds: ptrInt32(3600), Key: key, NamePrefix: "keyward-node-daemon-",
		}
	}
	submit := func(t *testing.T, r csrclient.Request) *certv1.CertificateSigningRequest {
		t.Helper()
		c, err := csrclient.Submit(ctx, client, r)
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		t.Cleanup(func() {
			_ = admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), c.Name, metav1.DeleteOptions{})
		})
		return c
	}
	// Helpers are closures: other files of this package are written at
	// the same time, and top-level names could clash.
	type waitResult struct {
		chain []byte
		err   error
	}
	waitWith := func(client kubernetes.Interface, c *certv1.CertificateSigningRequest) <-chan waitResult {
		done := make(chan waitResult, 1)
		go func() {
			chain, err := csrclient.Wait(ctx, client, c)
			done <- waitResult{chain, err}
		}()
		return done
	}
	waitInBackground := func(c *certv1.CertificateSigningRequest) <-chan waitResult { return waitWith(client, c) }
	// deny adds Denied=True as an admin would (kubectl certificate deny).
	deny := func(t *testing.T, name, reason, message string) {
		t.Helper()
		err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			cur, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			cur.Status.Conditions = append(cur.Status.Conditions, certv1.CertificateSigningRequestCondition{
				Type: certv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: reason, Message: message,
			})
			_, err = admin.CertificatesV1().CertificateSigningRequests().UpdateApproval(ctx, name, cur, metav1.UpdateOptions{})
			if apierrors.IsConflict(err) {
				return false, nil
			}
			return err == nil, err
		})
		if err != nil {
			t.Fatalf("denying %s: %v", name, err)
		}
	}

	t.Run("a pending key is requested once however often it is submitted, and the issued chain is committed", func(t *testing.T) {
		store, err := certstore.New(t.TempDir(), "daemon")
		if err != nil {
			t.Fatal(err)
		}
		key, _, err := store.Pending(nodehelper.KeyTypeECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		r := request(t, key)
		first := submit(t, r)
		// As a restarted agent would: the key from the store, submitted again.
		resumedKey, resumed, err := store.Pending(nodehelper.KeyTypeECDSAP256)
		if err != nil || !resumed {
			t.Fatalf("Pending again: resumed %v, %v", resumed, err)
		}
		second := submit(t, request(t, resumedKey))
		name, _ := csrclient.Name(r)
		if first.Name != name || second.UID != first.UID {
			t.Fatalf("CSRs %s (%s) and %s (%s), want one, named %s", first.Name, first.UID, second.Name, second.UID, name)
		}
		if first.Spec.Username != "system:node:"+node {
			t.Fatalf("CSR requested by %q, want the node", first.Spec.Username)
		}
		all, err := admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range all.Items {
			if c.Spec.Username == first.Spec.Username {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("%d CSRs by %s, want 1", n, first.Spec.Username)
		}

		waited := waitInBackground(first) // before the approval: Wait watches
		approve(t, ctx, first)
		res := <-waited
		if res.err != nil {
			t.Fatalf("Wait: %v", res.err)
		}
		chain, err := pemcert.Parse(res.chain)
		if err != nil || len(chain) == 0 {
			t.Fatalf("parsing the chain: %v (%d certificates)", err, len(chain))
		}
		if err := chain[0].CheckSignatureFrom(root); err != nil {
			t.Fatalf("leaf not signed by the HSM-held CA: %v", err)
		}
		pair, err := store.Commit(key, res.chain, time.Now())
		if err != nil {
			t.Fatalf("Commit: %v", err)
		}
		if pair.Chain[0].Subject.CommonName != node+".daemons.example.com" {
			t.Fatalf("leaf subject %v", pair.Chain[0].Subject)
		}

		// Submitting the issued request again (a crash before Commit)
		// finds it, and Wait answers from it at once.
		again := submit(t, r)
		if again.UID != first.UID || len(again.Status.Certificate) == 0 {
			t.Fatalf("Submit after issuance: UID %s, certificate of %d bytes", again.UID, len(again.Status.Certificate))
		}
		got, err := csrclient.Wait(ctx, nil, again) // no client needed
		if err != nil || string(got) != string(res.chain) {
			t.Fatalf("Wait on the issued CSR = %v", err)
		}
	})

	t.Run("a denied CSR is a DecisionError with the approver's reason and message", func(t *testing.T) {
		c := submit(t, request(t, nil))
		waited := waitInBackground(c)
		deny(t, c.Name, "NotAllowed", "daemons on this node may not")
		res := <-waited
		var d *csrclient.DecisionError
		if !errors.As(res.err, &d) || d.Type != certv1.CertificateDenied || d.Reason != "NotAllowed" || d.Message != "daemons on this node may not" || d.Name != c.Name {
			t.Fatalf("Wait = %v, want a Denied DecisionError with the reason and message", res.err)
		}
	})

	t.Run("a CSR keyward refuses to sign is a Failed DecisionError with keyward's reason", func(t *testing.T) {
		c := submit(t, request(t, nil, certv1.UsageDigitalSignature, certv1.UsageServerAuth))
		approve(t, ctx, c)
		_, err := csrclient.Wait(ctx, client, c)
		var d *csrclient.DecisionError
		if !errors.As(err, &d) || d.Type != certv1.CertificateFailed || d.Reason != csr.ReasonUsagesNotPermitted || d.Message == "" {
			t.Fatalf("Wait = %v, want a Failed DecisionError %s", err, csr.ReasonUsagesNotPermitted)
		}
	})

	t.Run("a CSR deleted while waited for is ErrDeleted", func(t *testing.T) {
		c := submit(t, request(t, nil))
		waited := waitInBackground(c)
		if err := admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if res := <-waited; !errors.Is(res.err, csrclient.ErrDeleted) {
			t.Fatalf("Wait = %v, want ErrDeleted", res.err)
		}
	})

	t.Run("a CSR deleted before Wait starts is ErrDeleted, not a wait until the context ends", func(t *testing.T) {
		c := submit(t, request(t, nil))
		if err := admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Bounded, so that a Wait that misses the deletion fails here.
		bounded, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := csrclient.Wait(bounded, client, c); !errors.Is(err, csrclient.ErrDeleted) {
			t.Fatalf("Wait = %v, want ErrDeleted", err)
		}
	})

	t.Run("a CSR deleted and made again under its name is ErrDeleted for the old one", func(t *testing.T) {
		r := request(t, nil)
		c := submit(t, r)
		if err := admin.CertificatesV1().CertificateSigningRequests().Delete(ctx, c.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if again := submit(t, r); again.UID == c.UID {
			t.Fatal("the CSR was not made again")
		}
		// Bounded, so that a Wait that misses the deletion fails here.
		bounded, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		if _, err := csrclient.Wait(bounded, client, c); !errors.Is(err, csrclient.ErrDeleted) {
			t.Fatalf("Wait = %v, want ErrDeleted", err)
		}
	})

	t.Run("a Wait whose connections to the apiserver are cut resumes and returns the chain", func(t *testing.T) {
		c := submit(t, request(t, nil))
		p := apiProxy(t)
		cfg, err := cp.NodeConfig(node)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Host = p.URL()
		waited := waitWith(clientFor(t, cfg, nil), c)
		// Cut once Wait is connected (listing or watching), so that an
		// open request breaks.
		if err := wait.PollUntilContextTimeout(ctx, 5*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return p.accepted.Load() >= 1, nil
		}); err != nil {
			t.Fatalf("Wait never connected: %v", err)
		}
		p.Cut() // existing connections closed, new ones refused
		if err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return p.refused.Load() >= 2, nil // it tried again, and again
		}); err != nil {
			t.Fatalf("Wait never reconnected: %v", err)
		}
		p.Restore()
		approve(t, ctx, c)
		res := <-waited
		if res.err != nil {
			t.Fatalf("Wait after the outage: %v", res.err)
		}
		if chain, err := pemcert.Parse(res.chain); err != nil || len(chain) == 0 || chain[0].CheckSignatureFrom(root) != nil {
			t.Fatalf("chain after the outage: %v", err)
		}
	})

	t.Run("a request issued with a certificate that has since expired is found, and the store refuses its chain", func(t *testing.T) {
		store, err := certstore.New(t.TempDir(), "daemon")
		if err != nil {
			t.Fatal(err)
		}
		key, _, err := store.Pending(nodehelper.KeyTypeECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		r := request(t, key)
		// A signer name keyward does not serve: the test plays the signer
		// and issues a certificate that expired an hour ago (as if the
		// node was down from issuance until after the certificate's end).
		r.SignerName = "example.com/csrclient-expired"
		c := submit(t, r)
		approve(t, ctx, c)
		chain, _ := newTestCA(t).issue(t, key.Public(), time.Now().Add(-2*time.Hour), time.Hour)
		cur, err := admin.CertificatesV1().CertificateSigningRequests().Get(ctx, c.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Status.Certificate = []byte(chain)
		if _, err := admin.CertificatesV1().CertificateSigningRequests().UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		// client-go's helper calls such a CSR incompatible, in text only;
		// Submit returns it as the request it is.
		again, err := csrclient.Submit(ctx, client, r)
		if err != nil || again.UID != c.UID {
			t.Fatalf("Submit of the expired request = %v", err)
		}
		got, err := csrclient.Wait(ctx, client, again)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := store.Commit(key, got, time.Now()); !errors.Is(err, certstore.ErrExpired) {
			t.Fatalf("Commit = %v, want ErrExpired", err)
		}
	})

	t.Run("the end of the context ends a Wait with its error", func(t *testing.T) {
		c := submit(t, request(t, nil))
		short, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if _, err := csrclient.Wait(short, client, c); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want the context's deadline", err)
		}
	})

	for _, tc := range []struct {
		name   string
		change func(r csrclient.Request) csrclient.Request
	}{
		{"another key", func(r csrclient.Request) csrclient.Request {
			other, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
			if err != nil {
				t.Fatal(err)
			}
			r.Key = other
			return r
		}},
		// client-go's compatibility check looks at subject, signer and key only.
		{"other usages", func(r csrclient.Request) csrclient.Request {
			r.Usages = []certv1.KeyUsage{certv1.UsageDigitalSignature}
			return r
		}},
		{"another expiration", func(r csrclient.Request) csrclient.Request {
			r.ExpirationSeconds = ptrInt32(7200)
			return r
		}},
	} {
		t.Run("a CSR of the derived name asking for "+tc.name+" is ErrConflict", func(t *testing.T) {
			r := request(t, nil)
			name, err := csrclient.Name(r)
			if err != nil {
				t.Fatal(err)
			}
			squatter := tc.change(r)
			der, err := x509.CreateCertificateRequest(rand.Reader, squatter.Template, squatter.Key)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.CertificatesV1().CertificateSigningRequests().Create(ctx, &certv1.CertificateSigningRequest{
				ObjectMeta: metav1.ObjectMeta{Name: name},
				Spec: certv1.CertificateSigningRequestSpec{SignerName: signerName, Usages: squatter.Usages, ExpirationSeconds: squatter.ExpirationSeconds,
					Request: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				_ = admin.CertificatesV1().CertificateSigningRequests().Delete(context.Background(), name, metav1.DeleteOptions{})
			})
			if _, err := csrclient.Submit(ctx, client, r); !errors.Is(err, csrclient.ErrConflict) {
				t.Fatalf("Submit = %v, want ErrConflict", err)
			}
		})
	}
}
