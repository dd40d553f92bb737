package softhsmtests

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	certv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/certificate"
	"k8s.io/client-go/util/retry"

	"github.com/keyward/keyward/signer/approver"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// kubeletNode plays one kubelet: a Node object whose status.addresses it
// reports, and the directory its certificate managers keep their pairs in
// (kubelet's --cert-dir).
type kubeletNode struct {
	t       *testing.T
	name    string
	certDir string
	// addresses are what the kubelet last reported in the Node's status;
	// its serving certificate template is built from them, as kubelet's
	// getLastObservedNodeAddresses feeds newGetTemplateFn.
	addresses atomic.Pointer[[]corev1.NodeAddress]
	// renewFailures counts CertificateRenewFailure as kubelet's counter does.
	renewFailures atomic.Int64
	// requestedLifetime, when set, is the client manager's
	// RequestedCertificateLifetime (spec.expirationSeconds); kubelet sets
	// none.
	requestedLifetime *time.Duration
	// withCurrent counts the clientsets the client manager built from its
	// current certificate (renewals), rather than the bootstrap credentials.
	withCurrent atomic.Int64
}

// newKubeletNode creates Node name (unique per test) and reports addrs in
// its status.
func newKubeletNode(t *testing.T, ctx context.Context, addrs ...corev1.NodeAddress) *kubeletNode {
	t.Helper()
	n := &kubeletNode{t: t, name: uniqueName(t, "node"), certDir: t.TempDir()}
	if _, err := controlplane.EnsureNode(ctx, cp.AdminClient(), n.name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cp.AdminClient().CoreV1().Nodes().Delete(context.Background(), n.name, metav1.DeleteOptions{})
	})
	n.setAddresses(ctx, addrs...)
	return n
}

// setAddresses writes the Node's status.addresses as the node itself (a
// kubelet's node status update), then lets its template see them.
func (n *kubeletNode) setAddresses(ctx context.Context, addrs ...corev1.NodeAddress) {
	n.t.Helper()
	client := nodeClient(n.t, n.name)
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		node.Status.Addresses = addrs
		_, err = client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		n.t.Fatalf("node %s reporting its addresses: %v", n.name, err)
	}
	n.addresses.Store(&addrs)
}

// user is the node's identity, system:node:<name>.
func (n *kubeletNode) user() string { return "system:node:" + n.name }

// bootstrapConfig stands in for kubelet's bootstrap credentials: a client
// certificate for system:node:<name> from the test control plane's CA.
func (n *kubeletNode) bootstrapConfig() (*rest.Config, error) { return cp.NodeConfig(n.name) }

// clientManager is kubelet's client certificate manager for n, configured
// as pkg/kubelet/certificate NewKubeletClientCertificateManager configures
// it: store prefix kubelet-client in the cert dir, CN system:node:<name>
// and O system:nodes, signer kubernetes.io/kube-apiserver-client-kubelet,
// DefaultKubeletClientGetUsages, no requested lifetime. Its clientset is
// the one cmd/kubelet builds: the bootstrap credentials while there is no
// current certificate, afterwards the current certificate itself (so a
// renewal authenticates with what keyward issued; the apiserver must trust
// keyward's CA, see trustClientCA).
func (n *kubeletNode) clientManager() certificate.Manager {
	n.t.Helper()
	store, err := certificate.NewFileStore("kubelet-client", n.certDir, n.certDir, "", "")
	if err != nil {
		n.t.Fatal(err)
	}
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: func(current *tls.Certificate) (kubernetes.Interface, error) {
			cfg, err := n.bootstrapConfig()
			if err != nil {
				return nil, err
			}
			if current != nil {
				n.withCurrent.Add(1)
				cfg = certConfig(cfg, current)
			}
			return kubernetes.NewForConfig(cfg)
		},
		Template: &x509.CertificateRequest{Subject: pkix.Name{
			CommonName:   n.user(),
			Organization: []string{"system:nodes"},
		}},
		SignerName:                   certv1.KubeAPIServerClientKubeletSignerName,
		GetUsages:                    certificate.DefaultKubeletClientGetUsages,
		RequestedCertificateLifetime: n.requestedLifetime,
		CertificateStore:             store,
		CertificateRenewFailure:      counter{&n.renewFailures},
		Name:                         "kubelet-client " + n.name,
	})
	if err != nil {
		n.t.Fatalf("kubelet client certificate manager: %v", err)
	}
	n.t.Cleanup(m.Stop)
	return m
}

// servingManager is kubelet's serving certificate manager for n, configured
// as NewKubeletServerCertificateManager configures it: store prefix
// kubelet-server, signer kubernetes.io/kubelet-serving,
// DefaultKubeletServingGetUsages, and a template made from the addresses
// the node last reported (no template, so no request, without an IP), with
// the node's own client.
func (n *kubeletNode) servingManager() certificate.Manager {
	n.t.Helper()
	store, err := certificate.NewFileStore("kubelet-server", n.certDir, n.certDir, "", "")
	if err != nil {
		n.t.Fatal(err)
	}
	client := nodeClient(n.t, n.name)
	m, err := certificate.NewManager(&certificate.Config{
		ClientsetFn: func(*tls.Certificate) (kubernetes.Interface, error) { return client, nil },
		GetTemplate: func() *x509.CertificateRequest {
			dns, ips := hostnamesAndIPs(*n.addresses.Load())
			if len(ips) == 0 {
				return nil
			}
			return &x509.CertificateRequest{
				Subject:     pkix.Name{CommonName: n.user(), Organization: []string{"system:nodes"}},
				DNSNames:    dns,
				IPAddresses: ips,
			}
		},
		SignerName:              certv1.KubeletServingSignerName,
		GetUsages:               certificate.DefaultKubeletServingGetUsages,
		CertificateStore:        store,
		CertificateRenewFailure: counter{&n.renewFailures},
		Name:                    "kubelet-server " + n.name,
	})
	if err != nil {
		n.t.Fatalf("kubelet serving certificate manager: %v", err)
	}
	n.t.Cleanup(m.Stop)
	return m
}

// hostnamesAndIPs sorts a Node's addresses into the SANs kubelet requests:
// Hostname (a name or an IP), InternalIP/ExternalIP, InternalDNS/ExternalDNS;
// without duplicates, in a stable order.
func hostnamesAndIPs(addrs []corev1.NodeAddress) ([]string, []net.IP) {
	var dns []string
	var ips []net.IP
	addIP := func(ip net.IP) {
		if !slices.ContainsFunc(ips, ip.Equal) {
			ips = append(ips, ip)
		}
	}
	for _, a := range addrs {
		ip := net.ParseIP(a.Address)
		switch a.Type {
		case corev1.NodeHostName:
			if ip != nil {
				addIP(ip)
			} else if a.Address != "" && !slices.Contains(dns, a.Address) {
				dns = append(dns, a.Address)
			}
		case corev1.NodeInternalIP, corev1.NodeExternalIP:
			if ip != nil {
				addIP(ip)
			}
		case corev1.NodeInternalDNS, corev1.NodeExternalDNS:
			if a.Address != "" && !slices.Contains(dns, a.Address) {
				dns = append(dns, a.Address)
			}
		}
	}
	sort.Strings(dns)
	sort.Slice(ips, func(i, j int) bool { return ips[i].String() < ips[j].String() })
	return dns, ips
}

// certConfig is cfg authenticating with cert instead of its own client
// certificate.
func certConfig(cfg *rest.Config, cert *tls.Certificate) *rest.Config {
	var certPEM []byte
	for _, der := range cert.Certificate {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		panic(fmt.Sprintf("a certificate manager's key does not marshal: %v", err))
	}
	out := rest.CopyConfig(cfg)
	out.TLSClientConfig.CertData = certPEM
	out.TLSClientConfig.KeyData = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	out.TLSClientConfig.CertFile, out.TLSClientConfig.KeyFile = "", ""
	return out
}

// whoAmI is the user the apiserver authenticates cert as.
func whoAmI(ctx context.Context, cert *tls.Certificate) (authnv1.UserInfo, error) {
	cfg, err := cp.NodeConfig("unused")
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	cs, err := kubernetes.NewForConfig(certConfig(cfg, cert))
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		return authnv1.UserInfo{}, err
	}
	return r.Status.UserInfo, nil
}

// trustClientCA adds root to the apiserver's --client-ca-file (which it
// reloads when the file changes) until the test ends, and waits until cert,
// signed under root, authenticates as want. This is what a cluster that
// hands kubernetes.io/kube-apiserver-client-kubelet to keyward must do.
func trustClientCA(t *testing.T, ctx context.Context, root *x509.Certificate, cert *tls.Certificate, want string) {
	t.Helper()
	trustClientRoot(t, root)
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 90*time.Second, true, func(ctx context.Context) (bool, error) {
		var u authnv1.UserInfo
		u, last = whoAmI(ctx, cert)
		if last != nil {
			return false, nil
		}
		if u.Username != want {
			return false, fmt.Errorf("the certificate authenticates as %q, want %q", u.Username, want)
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("the apiserver does not accept a certificate under %s after adding it to --client-ca-file: %v (last: %v)", root.Subject, err, last)
	}
}

// counter is a certificate.Counter over an atomic count.
type counter struct{ n *atomic.Int64 }

func (c counter) Inc() { c.n.Add(1) }

// waitCurrent waits until m's current certificate satisfies ok and returns
// it.
func waitCurrent(t *testing.T, ctx context.Context, m certificate.Manager, what string, ok func(*x509.Certificate) bool) *tls.Certificate {
	t.Helper()
	var c *tls.Certificate
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		c = m.Current()
		return c != nil && c.Leaf != nil && ok(c.Leaf), nil
	})
	if err != nil {
		t.Fatalf("waiting for %s: %v (current: %s)", what, err, describeCert(c))
	}
	return c
}

func describeCert(c *tls.Certificate) string {
	if c == nil || c.Leaf == nil {
		return "none"
	}
	l := c.Leaf
	return fmt.Sprintf("serial %s, %s, issuer %q, DNS %v, IP %v, valid %s..%s", l.SerialNumber, l.Subject, l.Issuer.CommonName,
		l.DNSNames, l.IPAddresses, l.NotBefore.UTC().Format(time.RFC3339), l.NotAfter.UTC().Format(time.RFC3339))
}

// gapWatch samples a certificate manager's Current() from the moment it is
// started until it is stopped, and records every sample without a valid
// certificate (none, or now outside its validity) and every certificate
// seen, in order.
type gapWatch struct {
	m       certificate.Manager
	stopped chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	samples int
	gaps    []string
	serials []*big.Int
	// last is when the last sample was taken; maxInterval the longest
	// time between two samples (what a gap could hide in).
	last        time.Time
	maxInterval time.Duration
}

func startGapWatch(t *testing.T, m certificate.Manager) *gapWatch {
	t.Helper()
	g := &gapWatch{m: m, stopped: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(g.done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			g.sample()
			select {
			case <-g.stopped:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(g.stop)
	return g
}

func (g *gapWatch) sample() {
	c := g.m.Current()
	now := time.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	g.samples++
	if !g.last.IsZero() {
		g.maxInterval = max(g.maxInterval, now.Sub(g.last))
	}
	g.last = now
	switch {
	case c == nil || c.Leaf == nil:
		g.gaps = append(g.gaps, now.UTC().Format(time.RFC3339Nano)+": no current certificate")
		return
	case now.Before(c.Leaf.NotBefore) || now.After(c.Leaf.NotAfter):
		g.gaps = append(g.gaps, fmt.Sprintf("%s: current certificate %s not valid", now.UTC().Format(time.RFC3339Nano), describeCert(c)))
	}
	if n := len(g.serials); n == 0 || g.serials[n-1].Cmp(c.Leaf.SerialNumber) != 0 {
		g.serials = append(g.serials, c.Leaf.SerialNumber)
	}
}

func (g *gapWatch) stop() {
	select {
	case <-g.stopped:
	default:
		close(g.stopped)
	}
	<-g.done
}

// check stops the watch and fails the test if any sample found no valid
// certificate, or if the certificates the manager held were not exactly
// held, in order (a certificate the sampler missed would leave room for a
// gap it missed too). It logs what it saw.
func (g *gapWatch) check(t *testing.T, held ...*tls.Certificate) {
	t.Helper()
	g.stop()
	// One last sample: the last renewal may have returned between two
	// ticks, and the sampler stopped before it saw the new certificate.
	g.sample()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.gaps) > 0 {
		t.Errorf("%d of %d samples without a valid certificate, first: %s", len(g.gaps), g.samples, g.gaps[0])
	}
	var want []*big.Int
	for _, c := range held {
		want = append(want, c.Leaf.SerialNumber)
	}
	if !slices.EqualFunc(g.serials, want, func(a, b *big.Int) bool { return a.Cmp(b) == 0 }) {
		t.Errorf("the sampler saw certificates %s, want %s (longest time between samples %s)", hexSerials(g.serials), hexSerials(want), g.maxInterval)
	}
	t.Logf("%d samples of Current() across %d renewals (at most %s apart), none without a valid certificate", g.samples, len(held)-1, g.maxInterval.Round(time.Microsecond))
}

// hexSerials prints serials as the signer logs them.
func hexSerials(s []*big.Int) []string {
	var out []string
	for _, n := range s {
		out = append(out, n.Text(16))
	}
	return out
}

// kubeletApprover runs keyward's approver, as its shipped service account
// with the shipped RBAC, for the kubelet signer names of profiles until the
// test ends; kubelet-serving with an approval section (auto-approval of
// serving CSRs is opt-in). For the client name it also gives nodes the grant kubeadm
// gives every cluster (selfnodeclient bound to system:nodes), without
// which the approver, like kube-controller-manager, leaves a renewal
// undecided.
func kubeletApprover(t *testing.T, ctx context.Context, profiles ...string) {
	t.Helper()
	installApproverRBAC(t, ctx)
	var signers strings.Builder
	for _, p := range profiles {
		approval := ""
		if p == config.ProfileKubeletServing {
			// Serving auto-approval is opt-in: the node's name under
			// these suffixes, IPs in the tests' range.
			approval = ", approval: {allowedDNSSuffixes: [nodes.example, edge.example], allowedIPRanges: [10.0.0.0/8]}"
		}
		fmt.Fprintf(&signers, "- {name: %s, profile: %s%s}\n", config.KubernetesSignerNames[p], p, approval)
		if p == config.ProfileKubeAPIServerClientKubelet {
			selfNodeClient(t, ctx)
		}
	}
	startApprover(t, signers.String())
}

// approvedByKeyward checks that every CSR in csrs was approved by keyward's
// approver and carries a certificate.
func approvedByKeyward(t *testing.T, csrs []certv1.CertificateSigningRequest) {
	t.Helper()
	for _, c := range csrs {
		approved := slices.ContainsFunc(c.Status.Conditions, func(cond certv1.CertificateSigningRequestCondition) bool {
			return cond.Type == certv1.CertificateApproved && cond.Reason == approver.ReasonAutoApproved
		})
		if !approved || len(c.Status.Certificate) == 0 {
			t.Errorf("CSR %s: conditions %+v, certificate %d bytes; want approved by keyward's approver and signed", c.Name, c.Status.Conditions, len(c.Status.Certificate))
		}
	}
}

// csrsOf lists the CSRs user made for signerName, oldest first.
func csrsOf(t *testing.T, ctx context.Context, signerName, user string) []certv1.CertificateSigningRequest {
	t.Helper()
	list, err := cp.AdminClient().CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []certv1.CertificateSigningRequest
	for _, c := range list.Items {
		if c.Spec.SignerName == signerName && c.Spec.Username == user {
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreationTimestamp.Before(&out[j].CreationTimestamp) })
	return out
}

// verifyLeaf checks that leaf chains to root for usage (with any
// intermediates) and returns the chain.
func verifyLeaf(t *testing.T, c *tls.Certificate, root *x509.Certificate, usage x509.ExtKeyUsage) []*x509.Certificate {
	t.Helper()
	roots, inter := x509.NewCertPool(), x509.NewCertPool()
	roots.AddCert(root)
	for _, der := range c.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		inter.AddCert(ic)
	}
	chains, err := c.Leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		t.Fatalf("certificate %s does not chain to %s: %v", describeCert(c), root.Subject, err)
	}
	return chains[0]
}

// rotator is the testing hook client-go's certificate manager exposes
// beside Manager: one rotation, exactly the code its rotation timer runs
// when the deadline (70–90% of the lifetime) passes.
type rotator interface {
	RotateCerts() (bool, error)
}

// grantSigner gives the signer's service account verbs (sign, attest) on
// signerName until the test ends: the shipped role covers keyward.dev/*
// only, and a cluster handing a kubernetes.io name to keyward adds it.
func grantSigner(t testing.TB, ctx context.Context, signerName string, verbs ...string) {
	t.Helper()
	name := uniqueName(t, "signer-grant")
	rbac := cp.AdminClient().RbacV1()
	if _, err := rbac.ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{certv1.GroupName}, Resources: []string{"signers"},
			ResourceNames: []string{signerName}, Verbs: verbs}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := rbac.ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: signerServiceAccount, Namespace: signerNamespace}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = rbac.ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = rbac.ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}
