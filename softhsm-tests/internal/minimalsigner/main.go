// Command minimalsigner is the floor BenchmarkBurst10k measures keyward
// against: the smallest honest client-go PodCertificateRequest signer. A
// shared informer filtered by spec.signerName, a rate-limited workqueue,
// 8 workers, a CA key in process memory (a crypto.Signer parsed from a
// PKCS#8 file), one Issued status write per request, no Events, no
// metrics, no cache trimming. It speaks protobuf to the apiserver, as
// keyward does. It is built and run by the benchmark, never shipped.
//
//	minimalsigner --kubeconfig F --signer-name N --ca-cert F --ca-key F --health-address 127.0.0.1:P [--cpuprofile F]
package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"math/big"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync/atomic"
	"syscall"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig file")
	signerName := flag.String("signer-name", "", "the signer name to answer")
	caCert := flag.String("ca-cert", "", "CA certificate (PEM)")
	caKey := flag.String("ca-key", "", "CA private key (PKCS#8 PEM)")
	health := flag.String("health-address", "", "serve /readyz here")
	workers := flag.Int("workers", 8, "workers")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the whole run here")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "minimalsigner:", err)
			os.Exit(1)
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer cancel()
	if err := run(ctx, *kubeconfig, *signerName, *caCert, *caKey, *health, *workers); err != nil {
		fmt.Fprintln(os.Stderr, "minimalsigner:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

type signer struct {
	client   kubernetes.Interface
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	caCert   *x509.Certificate
	caPEM    []byte
	caKey    crypto.Signer
}

func run(ctx context.Context, kubeconfig, signerName, certFile, keyFile, health string, workers int) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 500, 1000
	cfg.ContentType = runtime.ContentTypeProtobuf
	cfg.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	s := &signer{client: client}
	if s.caCert, s.caPEM, s.caKey, err = loadCA(certFile, keyFile); err != nil {
		return err
	}

	selector := fields.OneTermEqualSelector("spec.signerName", signerName).String()
	pcrs := client.CertificatesV1().PodCertificateRequests(metav1.NamespaceAll)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return pcrs.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return pcrs.Watch(ctx, o)
		},
	}
	s.informer = cache.NewSharedIndexInformer(lw, &certv1.PodCertificateRequest{}, 0, cache.Indexers{})
	s.queue = workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	defer s.queue.ShutDown()
	enqueue := func(obj any) {
		if key, err := cache.MetaNamespaceKeyFunc(obj); err == nil {
			s.queue.Add(key)
		}
	}
	if _, err := s.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		return err
	}

	var ready atomic.Bool
	if health != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if !ready.Load() {
				http.Error(w, "not synced", http.StatusServiceUnavailable)
			}
		})
		srv := &http.Server{Addr: health, Handler: mux}
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}
	go s.informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), s.informer.HasSynced) {
		return errors.New("informer did not sync")
	}
	ready.Store(true)
	for range workers {
		go func() {
			for s.next(ctx) {
			}
		}()
	}
	<-ctx.Done()
	return nil
}

func (s *signer) next(ctx context.Context) bool {
	key, quit := s.queue.Get()
	if quit {
		return false
	}
	defer s.queue.Done(key)
	if err := s.sync(ctx, key); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", key, err)
		s.queue.AddRateLimited(key)
		return true
	}
	s.queue.Forget(key)
	return true
}

func (s *signer) sync(ctx context.Context, key string) error {
	obj, exists, err := s.informer.GetIndexer().GetByKey(key)
	if err != nil || !exists {
		return err
	}
	pcr := obj.(*certv1.PodCertificateRequest)
	for _, c := range pcr.Status.Conditions {
		switch c.Type {
		case certv1.PodCertificateRequestConditionTypeIssued, certv1.PodCertificateRequestConditionTypeDenied, certv1.PodCertificateRequestConditionTypeFailed:
			return nil
		}
	}
	// The apiserver verified the request's signature; only its key is needed.
	csr, err := x509.ParseCertificateRequest(pcr.Spec.StubPKCS10Request)
	if err != nil {
		return err
	}
	lifetime := 24 * time.Hour
	if m := pcr.Spec.MaxExpirationSeconds; m != nil && time.Duration(*m)*time.Second < lifetime {
		lifetime = time.Duration(*m) * time.Second
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return err
	}
	notBefore := time.Now().Add(-time.Minute).Truncate(time.Second)
	notAfter := notBefore.Add(lifetime)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    notBefore,
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:         []*url.URL{{Scheme: "spiffe", Host: "cluster.local", Path: "/ns/" + pcr.Namespace + "/sa/" + pcr.Spec.ServiceAccountName}},
	}, s.caCert, csr.PublicKey, s.caKey)
	if err != nil {
		return err
	}
	pcr = pcr.DeepCopy()
	pcr.Status = certv1.PodCertificateRequestStatus{
		Conditions: []metav1.Condition{{
			Type: certv1.PodCertificateRequestConditionTypeIssued, Status: metav1.ConditionTrue,
			Reason: "Issued", Message: "issued", LastTransitionTime: metav1.Now(),
		}},
		CertificateChain: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})) + string(s.caPEM),
		NotBefore:        &metav1.Time{Time: notBefore},
		BeginRefreshAt:   &metav1.Time{Time: notBefore.Add(lifetime / 2)},
		NotAfter:         &metav1.Time{Time: notAfter},
	}
	_, err = s.client.CertificatesV1().PodCertificateRequests(pcr.Namespace).UpdateStatus(ctx, pcr, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

func loadCA(certFile, keyFile string) (*x509.Certificate, []byte, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, nil, nil, err
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil, nil, nil, fmt.Errorf("%s: no PEM block", certFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, nil, nil, err
	}
	if block, _ = pem.Decode(keyPEM); block == nil {
		return nil, nil, nil, fmt.Errorf("%s: no PEM block", keyFile)
	}
	parsed, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		return nil, nil, nil, err
	}
	key, ok := parsed.(crypto.Signer)
	if !ok {
		return nil, nil, nil, fmt.Errorf("%s: a %T is not a crypto.Signer", keyFile, parsed)
	}
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), key, nil
}
