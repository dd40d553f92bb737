package nodetests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"path/filepath"
	"slices"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// The node joined with a bootstrap token only (setUp): keyward's approver
// approved its kubelet client CSR and keyward's signer issued it, then the
// same for its serving CSR; kube-apiserver, whose --kubelet-certificate-
// authority is keyward's kubelet-serving root, reaches it for logs. With
// keyward's 3-minute lifetime kubelet rotates both certificates (at 70-90%
// of their life) through the same path. The test runs in parallel, so after
// every other test, and waits for the rotation to be seen.
func TestKubeletBootstrapsAndRotatesWithKeyward(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 5*time.Minute)
	pki := filepath.Join(env.node.Dir, "kubelet", "pki")

	client := currentCert(t, filepath.Join(pki, "kubelet-client-current.pem"))
	verifyWith(t, client, env.roots[kubeletClient], x509.ExtKeyUsageClientAuth)
	if want := "system:node:" + nodeName; client.Subject.CommonName != want {
		t.Errorf("client certificate CN %q, want %q", client.Subject.CommonName, want)
	}
	serving := currentCert(t, filepath.Join(pki, "kubelet-server-current.pem"))
	verifyWith(t, serving, env.roots[kubeletServing], x509.ExtKeyUsageServerAuth)
	if !slices.ContainsFunc(serving.IPAddresses, func(ip net.IP) bool { return ip.String() == env.node.IP }) {
		t.Errorf("serving certificate IPs %v lack the node's InternalIP %s", serving.IPAddresses, env.node.IP)
	}
	// What kube-apiserver checks when it dials the kubelet, checked here too.
	dialKubelet(t, env.roots[kubeletServing])

	// Both CSRs were approved by keyward's approver and signed by keyward.
	for _, signer := range []string{kubeletClient, kubeletServing} {
		issued := issuedCSRs(t, ctx, signer)
		if len(issued) == 0 {
			t.Fatalf("no issued %s CSR", signer)
		}
		if c := issued[0]; !approvedBy(c, "AutoApproved") {
			t.Errorf("%s CSR %s conditions %+v, want keyward's AutoApproved", signer, c.Name, c.Status.Conditions)
		}
	}

	// Rotation: kubelet asks again once 70-90% of notAfter-notBefore has
	// passed.
	latest := func(c *x509.Certificate) time.Time {
		return c.NotBefore.Add(time.Duration(0.9 * float64(c.NotAfter.Sub(c.NotBefore))))
	}
	last := latest(client)
	if s := latest(serving); s.After(last) {
		last = s
	}
	deadline := time.Until(last) + time.Minute
	t.Logf("waiting up to %s for kubelet to rotate both certificates", deadline.Round(time.Second))
	var rotatedClient, rotatedServing *x509.Certificate
	err := wait.PollUntilContextTimeout(ctx, time.Second, deadline, true, func(ctx context.Context) (bool, error) {
		if err := env.node.KubeletExited(); err != nil {
			return false, err
		}
		if c := currentCert(t, filepath.Join(pki, "kubelet-client-current.pem")); c.SerialNumber.Cmp(client.SerialNumber) != 0 {
			rotatedClient = c
		}
		if c := currentCert(t, filepath.Join(pki, "kubelet-server-current.pem")); c.SerialNumber.Cmp(serving.SerialNumber) != 0 {
			rotatedServing = c
		}
		return rotatedClient != nil && rotatedServing != nil, nil
	})
	if err != nil {
		t.Fatalf("kubelet did not rotate (client rotated: %v, serving rotated: %v): %v", rotatedClient != nil, rotatedServing != nil, err)
	}
	verifyWith(t, rotatedClient, env.roots[kubeletClient], x509.ExtKeyUsageClientAuth)
	verifyWith(t, rotatedServing, env.roots[kubeletServing], x509.ExtKeyUsageServerAuth)
	for _, signer := range []string{kubeletClient, kubeletServing} {
		if n := len(issuedCSRs(t, ctx, signer)); n < 2 {
			t.Errorf("%d issued %s CSRs after a rotation, want at least 2", n, signer)
		}
	}
	// kube-apiserver still reaches the kubelet, now on its rotated
	// certificate, and the node still authenticates with its rotated one.
	dialKubelet(t, env.roots[kubeletServing])
	// The node's Lease is renewed (every 10s) by kubelet under its
	// rotated client certificate.
	rotatedAt := time.Now()
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		l, err := env.admin.CoordinationV1().Leases("kube-node-lease").Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(rotatedAt), nil
	}); err != nil {
		t.Errorf("kubelet did not renew its node Lease after its client certificate rotated: %v", err)
	}
	t.Logf("client certificate rotated %s after the first was issued, serving %s",
		rotatedClient.NotBefore.Sub(client.NotBefore).Round(time.Second), rotatedServing.NotBefore.Sub(serving.NotBefore).Round(time.Second))
}

// currentCert reads the certificate of a kubelet *-current.pem file (it
// holds the certificate and the key).
func currentCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	certs, err := readCerts(path)
	if err != nil || len(certs) == 0 {
		t.Fatalf("kubelet's certificate %s: %v (%d certificates)", path, err, len(certs))
	}
	return certs[0]
}

func verifyWith(t *testing.T, c, root *x509.Certificate, usage x509.ExtKeyUsage) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(root)
	if _, err := c.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		t.Errorf("certificate %s (serial %x) does not verify against keyward's %s: %v", c.Subject, c.SerialNumber, root.Subject, err)
	}
}

// dialKubelet does the TLS handshake kube-apiserver does with kubelet's
// port, trusting only keyward's kubelet-serving root.
func dialKubelet(t *testing.T, root *x509.Certificate) {
	t.Helper()
	roots := x509.NewCertPool()
	roots.AddCert(root)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", net.JoinHostPort(env.node.IP, "10250"),
		&tls.Config{RootCAs: roots, ServerName: env.node.IP})
	if err != nil {
		t.Errorf("TLS to kubelet at %s:10250 with keyward's serving root: %v", env.node.IP, err)
		return
	}
	conn.Close()
}

func issuedCSRs(t *testing.T, ctx context.Context, signer string) []certv1.CertificateSigningRequest {
	t.Helper()
	list, err := env.admin.CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []certv1.CertificateSigningRequest
	for _, c := range list.Items {
		if c.Spec.SignerName == signer && len(c.Status.Certificate) > 0 {
			out = append(out, c)
		}
	}
	slices.SortFunc(out, func(a, b certv1.CertificateSigningRequest) int {
		return a.CreationTimestamp.Compare(b.CreationTimestamp.Time)
	})
	return out
}

func approvedBy(c certv1.CertificateSigningRequest, reason string) bool {
	return slices.ContainsFunc(c.Status.Conditions, func(cond certv1.CertificateSigningRequestCondition) bool {
		return cond.Type == certv1.CertificateApproved && cond.Reason == reason
	})
}
