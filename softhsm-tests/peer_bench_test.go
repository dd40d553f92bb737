package softhsmtests

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/backends/all"
	"github.com/keyward/keyward/signer/config"
	"github.com/keyward/keyward/testsupport/controlplane"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	informerscertv1 "k8s.io/client-go/informers/certificates/v1"
	"k8s.io/client-go/tools/cache"
)

// Run with: go test -run '^$' -bench CSRSigning -benchtime 1x ./softhsm-tests/
// (make bench, after make controller-manager). Like the PCR benchmarks, each
// sub-benchmark is one measured run, not b.N loops.

const (
	// kube-controller-manager runs 5 workers per signer (hard-coded in
	// cmd/kube-controller-manager/app/certificates.go); keyward gets as many.
	peerWorkers = 5
	// Both signers' API client limits: baseConfig's, and kube-controller-
	// manager's --kube-api-qps / --kube-api-burst set to the same.
	peerQPS, peerBurst = 500, 1000
	// How many issued certificates of each run are checked against the CA.
	peerSample = 25
	// envPeerN shrinks (or grows) the workload: KEYWARD_PEER_N=100.
	envPeerN     = "KEYWARD_PEER_N"
	peerDefaultN = 1000
	// peerLabel marks a run's CSRs, for its watch and its clean-up.
	peerLabel = "keyward.dev/peer-bench"
	// peerTimeout bounds the wait for a run's last certificate.
	peerTimeout = 10 * time.Minute
)

// BenchmarkCSRSigning: keyward (a file CA key, then a SoftHSM2 one) and
// kube-controller-manager's csrsigning controller (a file CA key), one after
// the other on the shared apiserver, each sign N CSRs for
// kubernetes.io/kube-apiserver-client that were created and approved
// before the signer starts. CSR/s is (N − 1) over the time from the first
// certificate seen on a watch to the last, so neither signer's start-up
// counts (first-cert-s is start to first certificate, CSR/s-from-start
// includes it); of-kcm is keyward's CSR/s over
// kube-controller-manager's in the same run (kcm runs first for that; make
// bench runs one -count 1 invocation per round, so that the three
// alternate). Both signers run as processes of their own.
// All are ECDSA P-256 CAs, 5 workers, client QPS 500 / burst 1000, protobuf.
func BenchmarkCSRSigning(b *testing.B) {
	n := peerSize(b)
	signerName := certv1.KubeAPIServerClientSignerName
	var kcmRate float64
	report := func(b *testing.B, rate float64) {
		if kcmRate == 0 {
			b.Logf("no kcm rate in this run (sub-benchmark filtered out?): of-kcm not reported")
			return
		}
		b.ReportMetric(rate/kcmRate, "of-kcm")
	}

	b.Run("signer=kcm", func(b *testing.B) {
		if _, err := controlplane.FindKubeControllerManager(); err != nil {
			b.Fatal(err)
		}
		_, keyPath, caFile, root := peerFileCA(b)
		kcmRate = peerRun(b, n, root, func() (<-chan error, int) {
			m, err := cp.StartControllerManager(controlplane.ControllerManagerOptions{
				Dir: b.TempDir(),
				// csrsigning is its alias.
				Controllers: []string{"certificatesigningrequest-signing-controller"},
				QPS:         peerQPS, Burst: peerBurst,
				ExtraFlags: []string{
					"--cluster-signing-kube-apiserver-client-cert-file=" + caFile,
					"--cluster-signing-kube-apiserver-client-key-file=" + keyPath,
				},
			})
			if err != nil {
				b.Fatalf("starting kube-controller-manager: %v", err)
			}
			b.Cleanup(func() {
				m.Stop()
				if b.Failed() {
					b.Logf("kube-controller-manager log (last lines):\n%s", m.LogTail(40))
				}
			})
			exited := make(chan error, 1)
			go func() {
				<-m.Done()
				exited <- m.Exited()
			}()
			return exited, m.PID()
		})
	})

	b.Run("signer=keyward-file", func(b *testing.B) {
		keyURI, _, caFile, root := peerFileCA(b)
		rate := peerRun(b, n, root, keywardPeer(b, signerName, keyURI, caFile))
		report(b, rate)
	})

	b.Run("signer=keyward-softhsm", func(b *testing.B) {
		keyURI, caFile, root := caInToken(b, uniqueName(b, "peer-ca"))
		rate := peerRun(b, n, root, keywardPeer(b, signerName, keyURI, caFile))
		report(b, rate)
	})
}

// peerSize is N: KEYWARD_PEER_N or 1000.
func peerSize(b *testing.B) int { return envCount(b, envPeerN, peerDefaultN, 1) }

// peerFileCA makes an ECDSA P-256 CA whose key is a PEM file (PKCS #8, which
// kube-controller-manager reads too) and returns the key's URI and path, the
// certificate's path and the certificate.
func peerFileCA(b *testing.B) (string, string, string, *x509.Certificate) {
	createURI := fileKeyURI(b)
	keyURI, caFile, root := newCA(b, all.Options{}, createURI, uniqueName(b, "peer-ca"))
	return keyURI, strings.TrimPrefix(createURI, "file:"), caFile, root
}

// keywardPeer returns what starts keyward, in a child process, as the signer of
// signerName with the CA key at keyURI: sign granted to its service
// account, the CA's Authority Active, 5 workers.
func keywardPeer(b *testing.B, signerName, keyURI, caFile string) func() (<-chan error, int) {
	grantSigner(b, testContext(b), signerName, "sign")
	a := activeAuthority(b, signerName, keyURI, caFile)
	b.Cleanup(func() { _ = authorities(b).Delete(context.Background(), a.Name, metav1.DeleteOptions{}) })
	cfg := kubeletSignerConfig(b, config.ProfileKubeAPIServerClient)
	cfg.Workers = peerWorkers
	cfg.KubeClient.QPS, cfg.KubeClient.Burst = peerQPS, peerBurst
	return func() (<-chan error, int) {
		// A process of its own, as kube-controller-manager is: neither
		// shares a Go runtime with the benchmark's watch. An early exit
		// shows as the run's timeout, with the replica's output.
		p := startSignerProcess(b, cfg, "peer-keyward")
		return nil, p.cmd.Process.Pid
	}
}

// peerRun creates and approves n CSRs, runs start (which starts a signer
// that stops when b ends, and returns a channel that says when the signer
// ended early, or nil, and the signer's process ID), and waits until
// every CSR has a certificate. It reports CSR/s, first-cert-s and the CPU
// per CSR from start to the last certificate (of this process: the
// benchmark's watch; of the signer's process, its start-up included; of
// kube-apiserver and etcd), checks a sample of the certificates against
// root, and returns CSR/s.
func peerRun(b *testing.B, n int, root *x509.Certificate, start func() (<-chan error, int)) float64 {
	ctx, cancel := context.WithTimeout(b.Context(), 30*time.Minute)
	defer cancel()
	admin := cp.AdminClient()
	csrs := admin.CertificatesV1().CertificateSigningRequests()
	run := uniqueName(b, "peer")
	selector := peerLabel + "=" + run
	b.Cleanup(func() {
		// Gone before the next signer starts, so that it does not list
		// this run's CSRs.
		if err := csrs.DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: selector}); err != nil {
			b.Errorf("deleting the CSRs labelled %s: %v", selector, err)
		}
	})

	parallel(n, benchCreators, func(i int) {
		c, err := peerCSR(fmt.Sprintf("%s-%d", run, i), run)
		if err == nil {
			_, err = csrs.Create(ctx, c, metav1.CreateOptions{})
		}
		if err == nil {
			err = tryApprove(ctx, admin, c.Name)
		}
		if err != nil {
			b.Errorf("CSR %d: %v", i, err)
		}
	})
	if b.Failed() {
		b.FailNow()
	}

	inf := informerscertv1.NewFilteredCertificateSigningRequestInformer(admin, 0, cache.Indexers{},
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
	iw := watchOutcomes(b, ctx, inf, n, csrOutcome)
	if err := peerAllApprovedUnsigned(inf, n); err != nil {
		b.Fatalf("before the signer starts: %v", err)
	}

	cpu := readCPU(b)
	began := time.Now()
	exited, pid := start()
	select {
	case <-iw.done:
	case err := <-exited:
		b.Fatalf("the signer ended with %d of %d CSRs done: %v", len(iw.snapshot()), n, err)
	case <-time.After(peerTimeout):
	}
	iw.wait(b, time.Second) // fails b on the timeout and on Failed CSRs
	use := readCPU(b).since(cpu, n)
	signerCPU := float64(procCPU(b, pid).Microseconds()) / 1000 / float64(n)

	var first, last time.Time
	for _, at := range iw.snapshot() {
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	// The signing rate is taken from the first certificate to the last:
	// both signers are processes that start and connect, and neither's
	// start-up is signing. Start-up is reported on its own (first-cert-s),
	// and the rate with it included.
	if n < 2 || !last.After(first) {
		b.Fatalf("%d CSRs signed between %s and %s: too few to take a rate from", n, first, last)
	}
	rate := float64(n-1) / last.Sub(first).Seconds()
	b.ReportMetric(rate, "CSR/s")
	b.ReportMetric(float64(n)/last.Sub(began).Seconds(), "CSR/s-from-start")
	b.ReportMetric(first.Sub(began).Seconds(), "first-cert-s")
	b.ReportMetric(signerCPU, "process-cpu-ms/CSR")
	use.report(b, "", "CSR")

	peerCheckSample(b, inf, root)
	return rate
}

// peerCSR is an unsent CSR for kubernetes.io/kube-apiserver-client with a
// fresh P-256 key, client auth, name as CN, and an hour's lifetime, which
// both signers honour (unasked, keyward gives 8h and kube-controller-manager
// a year cut to its CA's end).
func peerCSR(name, run string) (*certv1.CertificateSigningRequest, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: name}}, key)
	if err != nil {
		return nil, err
	}
	return &certv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{peerLabel: run}},
		Spec: certv1.CertificateSigningRequestSpec{
			SignerName:        certv1.KubeAPIServerClientSignerName,
			Usages:            usages(certv1.UsageDigitalSignature, certv1.UsageClientAuth),
			ExpirationSeconds: ptrInt32(3600),
			Request:           pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}),
		},
	}, nil
}

// csrOutcome: a CSR is done when it has a certificate (issued) or a Failed
// condition.
func csrOutcome(obj any) (string, bool, bool) {
	c, ok := obj.(*certv1.CertificateSigningRequest)
	if !ok {
		return "", false, false
	}
	if len(c.Status.Certificate) > 0 {
		return c.Name, true, true
	}
	return c.Name, failedCondition(c) != nil, false
}

// peerAllApprovedUnsigned checks the watch's cache holds the n CSRs, each
// approved and none signed yet: the clock must start with all the work
// waiting and no signer already at it.
func peerAllApprovedUnsigned(inf cache.SharedIndexInformer, n int) error {
	objs := inf.GetStore().List()
	if len(objs) != n {
		return fmt.Errorf("the watch holds %d CSRs, want %d", len(objs), n)
	}
	for _, o := range objs {
		c := o.(*certv1.CertificateSigningRequest)
		approved := slices.ContainsFunc(c.Status.Conditions, func(cond certv1.CertificateSigningRequestCondition) bool {
			return cond.Type == certv1.CertificateApproved
		})
		if !approved || len(c.Status.Certificate) > 0 || failedCondition(c) != nil {
			return fmt.Errorf("CSR %s: approved %v, certificate of %d bytes, conditions %+v; want approved and untouched (is another signer of %s running?)",
				c.Name, approved, len(c.Status.Certificate), c.Status.Conditions, c.Spec.SignerName)
		}
	}
	return nil
}

// peerCheckSample checks peerSample certificates, spread over the run, are
// single leaves signed by root for the key and name their CSR asked, with
// client auth.
func peerCheckSample(b *testing.B, inf cache.SharedIndexInformer, root *x509.Certificate) {
	objs := inf.GetStore().List()
	step := max(1, len(objs)/peerSample)
	for i := 0; i < len(objs); i += step {
		c := objs[i].(*certv1.CertificateSigningRequest)
		leaf := csrLeaf(b, c, root)
		block, _ := pem.Decode(c.Spec.Request)
		req, err := x509.ParseCertificateRequest(block.Bytes)
		if err != nil {
			b.Fatalf("CSR %s: parsing its request: %v", c.Name, err)
		}
		if !bytes.Equal(leaf.RawSubjectPublicKeyInfo, req.RawSubjectPublicKeyInfo) {
			b.Fatalf("CSR %s: the certificate is not for the CSR's key", c.Name)
		}
		if leaf.Subject.CommonName != c.Name {
			b.Fatalf("CSR %s: certificate CN %q, want the CSR's %q", c.Name, leaf.Subject.CommonName, c.Name)
		}
		if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}) {
			b.Fatalf("CSR %s: extended key usages %v, want client auth", c.Name, leaf.ExtKeyUsage)
		}
	}
}
