package softhsmtests

import (
	"bytes"
	"context"
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends/all"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/signer/pcr"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/certificate"
)

// kubeletSignerCA makes a CA key in the run's SoftHSM token for signerName,
// its Authority with that generation Active, and returns the root.
func kubeletSignerCA(t *testing.T, signerName, label string) *x509.Certificate {
	t.Helper()
	uri, file, root := caInToken(t, uniqueName(t, label))
	a := activeAuthority(t, signerName, uri, file)
	t.Cleanup(func() { _ = authorities(t).Delete(context.Background(), a.Name, metav1.DeleteOptions{}) })
	return root
}

// dropAuthorities deletes every Authority that names signerName.
func dropAuthorities(t *testing.T, ctx context.Context, signerName string) {
	t.Helper()
	c := authorities(t)
	list, err := c.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range list.Items {
		if a.Spec.SignerName == signerName {
			if err := c.Delete(ctx, a.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
}

// kubeletSignerConfig is keyward's configuration serving the kubernetes.io
// kubelet signer names, for a cluster whose kube-controller-manager runs
// without its csrsigning controller.
func kubeletSignerConfig(t testing.TB, profiles ...string) *config.SignerConfiguration {
	t.Helper()
	var signers []config.Signer
	for _, p := range profiles {
		signers = append(signers, config.Signer{Name: config.KubernetesSignerNames[p], Profile: p})
	}
	return baseConfig(t, signers...)
}

// keywardForKubelet runs keyward for the kubernetes.io name of profile as
// a cluster that hands it over from kube-controller-manager does: sign
// granted on the name, a CA key in SoftHSM and its Authority Active, the
// signer, and keyward's approver. It returns the CA's root.
func keywardForKubelet(t *testing.T, ctx context.Context, profile string) *x509.Certificate {
	t.Helper()
	name := config.KubernetesSignerNames[profile]
	grantSigner(t, ctx, name, "sign")
	root := kubeletSignerCA(t, name, strings.ToLower(profile)+"-ca")
	runSigner(t, kubeletSignerConfig(t, profile), profile+"-signer")
	kubeletApprover(t, ctx, profile)
	return root
}

// startManager starts m and waits for its first certificate.
func startManager(t *testing.T, ctx context.Context, m certificate.Manager, what string) *tls.Certificate {
	t.Helper()
	start := time.Now()
	m.Start()
	c := waitCurrent(t, ctx, m, "the first "+what+" certificate", func(*x509.Certificate) bool { return true })
	t.Logf("first %s certificate after %s: %s", what, time.Since(start).Round(time.Millisecond), describeCert(c))
	return c
}

// checkKubeletCert checks what KEP-1513 requires of a certificate for a
// kubelet signer name: subject system:node:<name> in system:nodes, exactly
// the extended usage asked for, the key usages kubelet's manager asked for
// (digital signature, for its ECDSA key), no CA bit, and the key the
// manager holds.
func checkKubeletCert(t *testing.T, n *kubeletNode, c *tls.Certificate, usage x509.ExtKeyUsage) {
	t.Helper()
	l := c.Leaf
	if l.Subject.CommonName != n.user() || !slices.Equal(l.Subject.Organization, []string{"system:nodes"}) {
		t.Errorf("subject %s, want CN=%s, O=system:nodes", l.Subject, n.user())
	}
	if !slices.Equal(l.ExtKeyUsage, []x509.ExtKeyUsage{usage}) || len(l.UnknownExtKeyUsage) > 0 {
		t.Errorf("extended key usages %v %v, want exactly %v", l.ExtKeyUsage, l.UnknownExtKeyUsage, usage)
	}
	if l.KeyUsage != x509.KeyUsageDigitalSignature {
		t.Errorf("key usage %b, want digital signature only", l.KeyUsage)
	}
	if l.IsCA || (l.BasicConstraintsValid && l.MaxPathLen > 0) {
		t.Errorf("a kubelet certificate with the CA bit")
	}
	if pub, ok := c.PrivateKey.(interface{ Public() crypto.PublicKey }); !ok || !pub.Public().(interface{ Equal(crypto.PublicKey) bool }).Equal(l.PublicKey) {
		t.Errorf("the certificate is not for the key the manager holds")
	}
}

// issuedIn reports whether csr's status.certificate starts with c's leaf.
func issuedIn(csr certv1.CertificateSigningRequest, c *tls.Certificate) bool {
	b, _ := pem.Decode(csr.Status.Certificate)
	return b != nil && bytes.Equal(b.Bytes, c.Certificate[0])
}

// kubelet's client certificate manager, configured as kubelet configures
// it, gets a certificate for its node from keyward for
// kubernetes.io/kube-apiserver-client-kubelet, signed with the CA key in
// SoftHSM; once the apiserver trusts keyward's CA (--client-ca-file) the
// certificate authenticates as the node, and the manager renews with it
// twice (each renewal is the rotation its timer runs at 70–90% of the
// lifetime, started through the manager's RotateCerts hook: its clock
// cannot be injected, and the apiserver's shortest CSR is 10 minutes).
// Sampled every 2 ms throughout, the manager always holds a valid
// certificate, and the file it keeps for a kubelet restart always holds
// the newest. A manager that asks for 10 minutes (expirationSeconds 600,
// the apiserver's minimum) gets 10 minutes.
func TestKubeletClientCertificateFromKeyward(t *testing.T) {
	ctx := testContext(t)
	signerName := certv1.KubeAPIServerClientKubeletSignerName
	root := keywardForKubelet(t, ctx, config.ProfileKubeAPIServerClientKubelet)
	n := newKubeletNode(t, ctx, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.20.0.1"})
	m := n.clientManager()
	first := startManager(t, ctx, m, "client")
	verifyLeaf(t, first, root, x509.ExtKeyUsageClientAuth)
	checkKubeletCert(t, n, first, x509.ExtKeyUsageClientAuth)
	if csrs := csrsOf(t, ctx, signerName, n.user()); len(csrs) != 1 || !issuedIn(csrs[0], first) {
		t.Fatalf("want one CSR whose status.certificate is the manager's certificate, got %d", len(csrs))
	}
	trustClientCA(t, ctx, root, first, n.user())

	watch := startGapWatch(t, m)
	held := []*tls.Certificate{first}
	for i := 1; i <= 2; i++ {
		before := m.Current()
		began := time.Now()
		rotated, err := m.(rotator).RotateCerts()
		if err != nil || !rotated {
			t.Fatalf("rotation %d: rotated %v, %v (renewal failures %d)", i, rotated, err, n.renewFailures.Load())
		}
		after := m.Current()
		if after.Leaf.SerialNumber.Cmp(before.Leaf.SerialNumber) == 0 {
			t.Fatalf("rotation %d kept certificate %s", i, describeCert(after))
		}
		if !after.Leaf.NotBefore.Before(before.Leaf.NotAfter) {
			t.Errorf("rotation %d: the new certificate starts at %s, after the old one ended (%s)", i, after.Leaf.NotBefore, before.Leaf.NotAfter)
		}
		verifyLeaf(t, after, root, x509.ExtKeyUsageClientAuth)
		checkKubeletCert(t, n, after, x509.ExtKeyUsageClientAuth)
		onDisk, err := tls.LoadX509KeyPair(filepath.Join(n.certDir, "kubelet-client-current.pem"), filepath.Join(n.certDir, "kubelet-client-current.pem"))
		if err != nil || !slices.Equal(onDisk.Certificate[0], after.Certificate[0]) {
			t.Errorf("rotation %d: kubelet-client-current.pem does not hold the new pair (%v)", i, err)
		}
		if u, err := whoAmI(ctx, after); err != nil || u.Username != n.user() {
			t.Errorf("rotation %d: the renewed certificate authenticates as %q (%v), want %s", i, u.Username, err, n.user())
		}
		t.Logf("rotation %d in %s: %s", i, time.Since(began).Round(time.Millisecond), describeCert(after))
		held = append(held, after)
	}
	watch.check(t, held...)
	if got := n.withCurrent.Load(); got < 2 {
		t.Errorf("%d renewals authenticated with the current certificate, want 2 (kubelet renews with the certificate it holds)", got)
	}
	if csrs := csrsOf(t, ctx, signerName, n.user()); len(csrs) != 3 {
		t.Errorf("%d CSRs for the node, want 3", len(csrs))
	} else {
		approvedByKeyward(t, csrs)
	}
	if f := n.renewFailures.Load(); f != 0 {
		t.Errorf("%d renewal failures", f)
	}
	// A kubelet restarting now starts from the newest pair on disk.
	if got := n.clientManager().Current(); got == nil || !slices.Equal(got.Certificate[0], m.Current().Certificate[0]) {
		t.Errorf("a restarted manager starts with %s, want the newest certificate %s", describeCert(got), describeCert(m.Current()))
	}

	// A manager asking for the shortest lifetime the apiserver admits
	// (expirationSeconds 600) gets it: min(maxLifetime, expirationSeconds).
	short := newKubeletNode(t, ctx)
	short.requestedLifetime = ptr(10 * time.Minute)
	c := startManager(t, ctx, short.clientManager(), "10-minute client")
	if got := c.Leaf.NotAfter.Sub(c.Leaf.NotBefore); got != 10*time.Minute {
		t.Errorf("requested 10m, got a certificate valid for %s", got)
	}
	verifyLeaf(t, c, root, x509.ExtKeyUsageClientAuth)
}

// kubelet's serving certificate manager, configured as kubelet configures
// it, gets a certificate for kubernetes.io/kubelet-serving from keyward
// naming exactly the addresses the Node reports, serves TLS with it as
// kubelet's server does (GetCertificate = Current), and renews by itself
// twice when the node's addresses change (its own rotation loop, as a
// kubelet whose node gains an address). Sampled every 2 ms, the manager
// always holds a valid certificate; every handshake verifies against
// keyward's CA in SoftHSM.
func TestKubeletServingCertificateFromKeyward(t *testing.T) {
	ctx := testContext(t)
	signerName := certv1.KubeletServingSignerName
	root := keywardForKubelet(t, ctx, config.ProfileKubeletServing)
	// DNS SANs are node-bound: the node's own name, or it under a suffix.
	n := newKubeletNode(t, ctx)
	host := n.name
	n.setAddresses(ctx,
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: host},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.30.0.1"},
		corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: host + ".nodes.example"})
	m := n.servingManager()
	first := startManager(t, ctx, m, "serving")
	srv := serveWith(t, m)
	check := func(what string, c *tls.Certificate, dns []string, ips []string) {
		t.Helper()
		verifyLeaf(t, c, root, x509.ExtKeyUsageServerAuth)
		checkKubeletCert(t, n, c, x509.ExtKeyUsageServerAuth)
		var gotIPs []string
		for _, ip := range c.Leaf.IPAddresses {
			gotIPs = append(gotIPs, ip.String())
		}
		if !slices.Equal(c.Leaf.DNSNames, dns) || !slices.Equal(gotIPs, ips) || len(c.Leaf.URIs)+len(c.Leaf.EmailAddresses) > 0 {
			t.Errorf("%s: SANs DNS %v IP %v (URIs %v, emails %v), want exactly DNS %v IP %v", what, c.Leaf.DNSNames, gotIPs, c.Leaf.URIs, c.Leaf.EmailAddresses, dns, ips)
		}
		if got := srv.handshake(t, root, dns[0]); got.SerialNumber.Cmp(c.Leaf.SerialNumber) != 0 {
			t.Errorf("%s: kubelet's server presented %s, want the current certificate %s", what, got.SerialNumber, c.Leaf.SerialNumber)
		}
	}
	check("first certificate", first, []string{host, host + ".nodes.example"}, []string{"10.30.0.1"})

	watch := startGapWatch(t, m)
	second := rotateByAddresses(t, ctx, n, m, "10.30.0.2",
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: host},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.30.0.1"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.30.0.2"},
		corev1.NodeAddress{Type: corev1.NodeInternalDNS, Address: host + ".nodes.example"})
	check("after the node gained 10.30.0.2", second, []string{host, host + ".nodes.example"}, []string{"10.30.0.1", "10.30.0.2"})
	third := rotateByAddresses(t, ctx, n, m, host+".edge.example",
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: host},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.30.0.2"},
		corev1.NodeAddress{Type: corev1.NodeExternalDNS, Address: host + ".edge.example"})
	check("after the node's addresses moved", third, []string{host, host + ".edge.example"}, []string{"10.30.0.2"})
	if csrs := csrsOf(t, ctx, signerName, n.user()); len(csrs) != 3 {
		t.Errorf("%d CSRs for the node, want 3", len(csrs))
	} else {
		approvedByKeyward(t, csrs)
	}

	watch.check(t, first, second, third)
	if f := n.renewFailures.Load(); f != 0 {
		t.Errorf("%d renewal failures", f)
	}
}

// rotateByAddresses has the node report addrs and waits until its serving
// manager holds a certificate naming want.
func rotateByAddresses(t *testing.T, ctx context.Context, n *kubeletNode, m certificate.Manager, want string, addrs ...corev1.NodeAddress) *tls.Certificate {
	t.Helper()
	began := time.Now()
	n.setAddresses(ctx, addrs...)
	c := waitCurrent(t, ctx, m, "a serving certificate naming "+want, func(l *x509.Certificate) bool {
		return slices.Contains(l.DNSNames, want) || slices.ContainsFunc(l.IPAddresses, func(ip net.IP) bool { return ip.String() == want })
	})
	t.Logf("rotation for %s in %s: %s", want, time.Since(began).Round(time.Millisecond), describeCert(c))
	return c
}

// kubeletServer is a TLS listener that takes its certificate from a
// serving certificate manager, as kubelet's server does.
type kubeletServer struct{ addr string }

func serveWith(t *testing.T, m certificate.Manager) *kubeletServer {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			if c := m.Current(); c != nil {
				return c, nil
			}
			return nil, errors.New("no serving certificate available for the kubelet")
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_ = conn.(*tls.Conn).Handshake()
			}()
		}
	}()
	return &kubeletServer{addr: ln.Addr().String()}
}

// handshake connects as a client that trusts root and expects serverName,
// and returns the leaf the server presented.
func (s *kubeletServer) handshake(t *testing.T, root *x509.Certificate, serverName string) *x509.Certificate {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(root)
	conn, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: pool, ServerName: serverName})
	if err != nil {
		t.Fatalf("TLS handshake with kubelet's server as %s: %v", serverName, err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// A CA rotation (keyward ca init and keyward trust, in-process, as an
// operator runs them) switches the key kubelet serving CSRs are signed
// with: renewals while the new generation is Staged and Promoted still
// chain to A; once B is Active (and the signer says it issues with it) a
// renewal chains to B and not to A. The manager never lacks a valid
// certificate throughout.
func TestKubeletCSRsFollowCARotation(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	r := newE2ERotation(t, ctx, "kubelet")
	r.signer = certv1.KubeletServingSignerName
	// The name is shared by the package's tests: ca init must make the
	// Authority anew (bootstrap), not add a generation to another test's.
	dropAuthorities(t, ctx, r.signer)
	// sign, and attest for the trust publisher's ClusterTrustBundles.
	grantSigner(t, ctx, r.signer, "sign", "attest")
	cfg := kubeletSignerConfig(t, config.ProfileKubeletServing)
	on := true
	cfg.TrustPublisher.Enabled = &on
	rs := startSigner(t, cfg, "kubelet-rotation-signer", pcr.V1, all.Options{})
	keyPrefix := uniqueName(t, "kubelet-serving")

	r.caInit("a", tokenKeyURI(keyPrefix+"-a"), "--subject", "CN=kubelet serving root A")
	r.waitPhases("A Active by bootstrap", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive})
	caA := r.ca("a")

	n := newKubeletNode(t, ctx, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "10.40.0.1"})
	kubeletApprover(t, ctx, config.ProfileKubeletServing)
	m := n.servingManager()
	first := startManager(t, ctx, m, "serving")
	verifyLeaf(t, first, caA.root, x509.ExtKeyUsageServerAuth)
	watch := startGapWatch(t, m)
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.40.0.1"}}
	renew := func(what string) *tls.Certificate {
		t.Helper()
		ip := fmt.Sprintf("10.40.0.%d", len(addrs)+1)
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
		return rotateByAddresses(t, ctx, n, m, ip, addrs...)
	}

	r.caInit("b", tokenKeyURI(keyPrefix+"-b"), "--subject", "CN=kubelet serving root B")
	r.waitPhases("B Staged", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhaseStaged})
	caB := r.ca("b")
	staged := renew("B Staged")
	verifyLeaf(t, staged, caA.root, x509.ExtKeyUsageServerAuth)
	r.trust("promote", "b")
	r.waitPhases("B Promoted", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhaseActive, "b": kwv1alpha1.PhasePromoted})
	promoted := renew("B Promoted")
	verifyLeaf(t, promoted, caA.root, x509.ExtKeyUsageServerAuth)
	r.trust("activate", "b")
	r.waitPhases("B Active", map[string]kwv1alpha1.Phase{"a": kwv1alpha1.PhasePromoted, "b": kwv1alpha1.PhaseActive})
	issuingWith(t, ctx, rs, "b")
	afterB := renew("B Active")
	verifyLeaf(t, afterB, caB.root, x509.ExtKeyUsageServerAuth)
	if afterB.Leaf.CheckSignatureFrom(caA.root) == nil {
		t.Errorf("a renewal after B's activation is signed by A")
	}
	watch.check(t, first, staged, promoted, afterB)
	if last := observed(r.get(), "b").LastIssuedNotAfter; last == nil || last.Time.Before(afterB.Leaf.NotAfter.Truncate(time.Second)) {
		t.Errorf("B's lastIssuedNotAfter %v does not cover the kubelet certificate it signed (notAfter %s)", last, afterB.Leaf.NotAfter)
	}
}
