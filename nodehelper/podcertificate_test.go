package nodehelper_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/keyward/keyward/nodehelper"
	"github.com/keyward/keyward/testsupport/controlplane"
)

const testSigner = "keyward.dev/wait-test"

// watchFaults is a node client's transport that, while failing is set,
// answers every PodCertificateRequest watch with one ERROR event (a watch
// cache's "too large resource version" or an apiserver restart look the
// same to the client), and records when each list was sent.
type watchFaults struct {
	base    http.RoundTripper
	failing atomic.Bool

	mu    sync.Mutex
	lists []time.Time
}

const injectedError = `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"injected watch failure","reason":"InternalError","code":500}}` + "\n"

func (f *watchFaults) RoundTrip(req *http.Request) (*http.Response, error) {
	if strings.HasSuffix(req.URL.Path, "/podcertificaterequests") {
		if req.URL.Query().Get("watch") != "true" {
			f.mu.Lock()
			f.lists = append(f.lists, time.Now())
			f.mu.Unlock()
		} else if f.failing.Load() {
			return &http.Response{
				StatusCode: http.StatusOK, Request: req,
				Header: http.Header{"Content-Type": []string{"application/json"}},
				Body:   io.NopCloser(strings.NewReader(injectedError)),
			}, nil
		}
	}
	return f.base.RoundTrip(req)
}

func (f *watchFaults) listTimes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.lists...)
}

// WaitForTerminal against a real apiserver, as the node identity the
// request names (NodeRestriction and the Node authorizer judging).
func TestWaitForTerminal(t *testing.T) {
	if testing.Short() {
		t.Skip("starts kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cp, err := controlplane.Start(ctx, controlplane.Options{})
	if err != nil {
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Cleanup(cp.Stop)
	admin := cp.AdminClient()
	w, err := controlplane.CreateWorkload(ctx, admin, controlplane.Workload{
		Namespace: "wait", Node: "node-a", Pod: "app", SignerNames: []string{testSigner},
	})
	if err != nil {
		t.Fatal(err)
	}
	nodeCfg, err := cp.NodeConfig("node-a")
	if err != nil {
		t.Fatal(err)
	}
	faults := &watchFaults{}
	nodeCfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { faults.base = rt; return faults }
	node, err := kubernetes.NewForConfig(nodeCfg)
	if err != nil {
		t.Fatal(err)
	}
	create := func(t *testing.T) *certv1.PodCertificateRequest {
		t.Helper()
		key, err := nodehelper.GenerateKey(nodehelper.KeyTypeECDSAP256)
		if err != nil {
			t.Fatal(err)
		}
		req, err := nodehelper.NewPodCertificateRequest(nodehelper.PodRef{
			Namespace: w.Pod.Namespace, Name: w.Pod.Name, UID: w.Pod.UID,
			ServiceAccountName: w.ServiceAccount.Name, ServiceAccountUID: w.ServiceAccount.UID,
			NodeName: w.Node.Name, NodeUID: w.Node.UID,
		}, testSigner, key, nodehelper.PodCertificateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p, err := node.CertificatesV1().PodCertificateRequests(req.Namespace).Create(ctx, req, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("node creating a PodCertificateRequest: %v", err)
		}
		return p
	}
	deny := func(t *testing.T, p *certv1.PodCertificateRequest) {
		t.Helper()
		cur := p.DeepCopy()
		cur.Status.Conditions = []metav1.Condition{{
			Type: certv1.PodCertificateRequestConditionTypeDenied, Status: metav1.ConditionTrue,
			Reason: "TestDenied", Message: "denied by the test", LastTransitionTime: metav1.Now(),
		}}
		if _, err := admin.CertificatesV1().PodCertificateRequests(p.Namespace).UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatalf("denying %s: %v", p.Name, err)
		}
	}
	del := func(t *testing.T, p *certv1.PodCertificateRequest) {
		t.Helper()
		if err := admin.CertificatesV1().PodCertificateRequests(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	type result struct {
		pcr *certv1.PodCertificateRequest
		err error
	}
	// start runs WaitForTerminal and returns once it has listed (so a
	// change made next reaches its watch, not its first read).
	start := func(t *testing.T, p *certv1.PodCertificateRequest) <-chan result {
		t.Helper()
		before := len(faults.listTimes())
		done := make(chan result, 1)
		waitCtx, stop := context.WithTimeout(ctx, 30*time.Second)
		t.Cleanup(stop)
		go func() {
			got, err := nodehelper.WaitForTerminal(waitCtx, node, p)
			done <- result{got, err}
		}()
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			return len(faults.listTimes()) > before, nil
		}); err != nil {
			t.Fatalf("WaitForTerminal never listed: %v", err)
		}
		return done
	}

	t.Run("a request decided before the wait returns at once", func(t *testing.T) {
		p := create(t)
		deny(t, p)
		waitCtx, stop := context.WithTimeout(ctx, 30*time.Second)
		defer stop()
		got, err := nodehelper.WaitForTerminal(waitCtx, node, p)
		if err != nil || got.Status.Conditions[0].Reason != "TestDenied" {
			t.Fatalf("WaitForTerminal = %v, %v; want the Denied request", got, err)
		}
	})
	t.Run("a request deleted during the wait is ErrDeleted", func(t *testing.T) {
		p := create(t)
		done := start(t, p)
		del(t, p)
		if r := <-done; !errors.Is(r.err, nodehelper.ErrDeleted) {
			t.Fatalf("WaitForTerminal = %v, %v; want ErrDeleted", r.pcr, r.err)
		}
	})
	t.Run("a request already gone when the wait begins is ErrDeleted", func(t *testing.T) {
		p := create(t)
		del(t, p)
		waitCtx, stop := context.WithTimeout(ctx, 30*time.Second)
		defer stop()
		if got, err := nodehelper.WaitForTerminal(waitCtx, node, p); !errors.Is(err, nodehelper.ErrDeleted) {
			t.Fatalf("WaitForTerminal = %v, %v; want ErrDeleted", got, err)
		}
	})
	t.Run("a failing watch is resumed with backoff, not at once", func(t *testing.T) {
		p := create(t)
		faults.failing.Store(true)
		before := len(faults.listTimes())
		done := start(t, p)
		var lists []time.Time
		if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
			lists = faults.listTimes()[before:]
			return len(lists) >= 3, nil
		}); err != nil {
			t.Fatalf("WaitForTerminal stopped listing while its watch failed: %v", err)
		}
		faults.failing.Store(false)
		// Backoff starts at 800 ms in client-go's reflector: two retries
		// take at least that long. A machine that is slow only adds to it.
		if gap := lists[2].Sub(lists[0]); gap < 500*time.Millisecond {
			t.Errorf("three lists within %s while the watch failed: re-listed without backoff", gap)
		}
		deny(t, p)
		if r := <-done; r.err != nil || r.pcr.Status.Conditions[0].Reason != "TestDenied" {
			t.Fatalf("WaitForTerminal = %v, %v; want the Denied request once the watch works again", r.pcr, r.err)
		}
	})
	t.Run("the context's end is returned as its error", func(t *testing.T) {
		p := create(t)
		short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
		defer stop()
		if _, err := nodehelper.WaitForTerminal(short, node, p); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitForTerminal = %v; want context.DeadlineExceeded", err)
		}
	})
}
