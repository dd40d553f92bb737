package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/keyward/keyward/nodehelper/atomicdir"
	"github.com/keyward/keyward/nodehelper/csrclient"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
)

// Mistakes a newcomer makes in the configuration's paths and identity end
// Run at start, with the field's name, before any CSR is asked for.
func TestRunStopsAtStartOnADirectoryItCannotUse(t *testing.T) {
	cases := []struct {
		name  string
		field string
		edit  func(cfg *Configuration, file string)
	}{
		{"stateDir is a file", "stateDir", func(cfg *Configuration, file string) { cfg.StateDir = file }},
		{"an output dir sits under a file", "credentials[0].output.dir", func(cfg *Configuration, file string) {
			cfg.Credentials[0].Output.Dir = filepath.Join(file, "out")
		}},
		{"a trust dir sits under a file", "trust[0].dir", func(cfg *Configuration, file string) {
			cfg.Trust = []Trust{{Name: "t", SignerName: "keyward.dev/t", Dir: filepath.Join(file, "trust")}}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmp := t.TempDir()
			file := filepath.Join(tmp, "a-file")
			if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(tmp)
			tc.edit(cfg, file)
			h := newHarness(t, cfg, nil)
			// Bounded only so that a Run that does not stop fails the test
			// instead of hanging it.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			err := h.agent.Run(ctx)
			if !errors.Is(err, syscall.ENOTDIR) {
				t.Fatalf("Run: %v, want ENOTDIR", err)
			}
			// The message is what the user reads: it starts with the field.
			if !strings.HasPrefix(err.Error(), tc.field+": ") {
				t.Errorf("Run: %q does not start with %q", err, tc.field+": ")
			}
			if s := h.csrs.submitted(); len(s) != 0 {
				t.Errorf("CSRs submitted before the failure: %q", s)
			}
			if b, err := os.ReadFile(file); err != nil || string(b) != "x" {
				t.Errorf("the file in the way was changed: %q, %v", b, err)
			}
		})
	}
}

// A kubeconfig that does not load is named by its field; without any, the
// message says which fields to set (not another command's).
func TestAKubeconfigErrorNamesItsField(t *testing.T) {
	t.Run("a missing kubeconfig file", func(t *testing.T) {
		cfg := testConfig(t.TempDir())
		cfg.Kubeconfig = filepath.Join(t.TempDir(), "missing")
		h := newHarness(t, cfg, nil)
		h.agent.deps.restConfig = loadRESTConfig
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		err := h.agent.Run(ctx)
		if !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Run: %v, want ErrNotExist", err)
		}
		if !strings.HasPrefix(err.Error(), "kubeconfig: ") {
			t.Errorf("Run: %q does not start with the field", err)
		}
	})
	t.Run("no kubeconfig outside a pod", func(t *testing.T) {
		t.Setenv("KUBERNETES_SERVICE_HOST", "")
		t.Setenv("KUBERNETES_SERVICE_PORT", "")
		_, err := loadRESTConfig("")
		if !errors.Is(err, rest.ErrNotInCluster) {
			t.Fatalf("loadRESTConfig: %v, want ErrNotInCluster", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "neither kubeconfig nor bootstrap.kubeconfig is set") || strings.Contains(msg, "kubeClient") {
			t.Errorf("loadRESTConfig: %q does not name the agent's fields", msg)
		}
	})
}

// An apiserver that takes the connection and never answers (a wrong
// address on a host that accepts it, a hung proxy) does not hold a renewal
// for good: the submission ends, is counted and logged, and is tried again.
func TestASubmissionThatIsNeverAnsweredEndsAndIsRetried(t *testing.T) {
	h := newHarness(t, testConfig(t.TempDir()), nil)
	var calls atomic.Int32
	h.agent.deps.submit = func(ctx context.Context, _ kubernetes.Interface, _ csrclient.Request) (*certv1.CertificateSigningRequest, error) {
		calls.Add(1)
		<-ctx.Done() // the apiserver never answers
		return nil, fmt.Errorf("creating: %w", ctx.Err())
	}
	h.agent.deps.submitTimeout = 10 * time.Millisecond
	h.run()
	h.eventually("two submissions ended", 100*time.Millisecond, func() bool { return h.status("daemon").Errors >= 2 })
	if s := h.status("daemon"); !strings.Contains(s.LastError, "no answer from the apiserver within 10ms") {
		t.Errorf("last error %q does not say that the apiserver did not answer", s.LastError)
	}
	if n := calls.Load(); n < 2 {
		t.Errorf("%d submissions, want a retry", n)
	}
}

// A certificate that is not valid yet by the node's clock (the clock is
// behind the signer's) is kept and written, and the agent says once that
// the node's clock may be behind.
func TestACertificateNotValidYetByTheNodesClockIsReportedOnce(t *testing.T) {
	logger, said := capturedLogs("not valid yet")
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	h := newHarness(t, cfg, nil)
	h.agent.deps.wait = func(_ context.Context, _ kubernetes.Interface, csr *certv1.CertificateSigningRequest) ([]byte, error) {
		h.csrs.mu.Lock()
		r := h.csrs.requests[csr.Name]
		h.csrs.mu.Unlock()
		// The signer's clock is an hour ahead of this node's.
		return h.csrs.ca.issue(t, r.Template, r.Key.Public(), h.clk.Now().Add(time.Hour), time.Hour), nil
	}
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("the output is written", 0, func() bool {
		files, err := atomicdir.Read(cfg.Credentials[0].Output.Dir, "credential-bundle.pem")
		return err == nil && len(files["credential-bundle.pem"]) > 0
	})
	h.stop()
	if lines := said(); len(lines) != 1 {
		t.Errorf("%d 'not valid yet' lines, want 1: %q", len(lines), lines)
	}
}

// A trust projection whose identity may not list ClusterTrustBundles (or
// whose apiserver does not answer) is not silent: client-go's informer
// retries quietly, so the agent says why at default verbosity once a
// minute has passed without a first pass.
func TestATrustProjectionThatCannotListSaysWhy(t *testing.T) {
	t.Setenv("KUBE_FEATURE_WatchListClient", "false") // as TestTrustEntriesAreProjectedWithMetrics
	logger, said := capturedLogs("Trust projection")
	tmp := t.TempDir()
	cfg := testConfig(tmp)
	cfg.Credentials = nil
	cfg.Trust = []Trust{{Name: "registry", SignerName: "keyward.dev/registry", Dir: filepath.Join(tmp, "trust")}}
	h := newHarness(t, cfg, nil)
	h.agent.deps.newClient = func(*rest.Config) (kubernetes.Interface, error) {
		c := fake.NewClientset()
		c.PrependReactor("list", "clustertrustbundles", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(certv1.Resource("clustertrustbundles"), "", errors.New("no grant"))
		})
		return c, nil
	}
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("the projection says why it has no trust file", 10*time.Second, func() bool { return len(said()) > 0 })
	got := said()
	if len(got) != 1 || !strings.Contains(got[0], "cannot list ClusterTrustBundles") || !strings.Contains(got[0], "forbidden") {
		t.Errorf("logged %q, want one line with the refusal", got)
	}
}

// The start line names the kubeconfig in use, so that a later
// "Unauthorized" (a wrong or expired token) points at a file.
func TestTheStartLineNamesTheKubeconfig(t *testing.T) {
	logger, said := capturedLogs("")
	cfg := testConfig(t.TempDir())
	cfg.Kubeconfig = "/etc/kubernetes/kubelet.conf"
	h := newHarness(t, cfg, nil)
	h.runWith(klog.NewContext(context.Background(), logger))
	h.eventually("started", 0, func() bool { return len(said()) > 0 })
	h.stop()
	lines := said()
	if !strings.Contains(lines[0], "Node agent started") || !strings.Contains(lines[0], `"kubeconfig"="/etc/kubernetes/kubelet.conf"`) {
		t.Errorf("start line %q does not name the kubeconfig", lines[0])
	}
}

// A certificate requested in this very try that has already expired by
// the node's clock (the clock is ahead of the signer's) is refused with a
// message that asks about the clock, and the credential error is Invalid.
func TestACertificateExpiredOnArrivalAsksWhetherTheClockIsAhead(t *testing.T) {
	h := newHarness(t, testConfig(t.TempDir()), nil)
	h.agent.deps.wait = func(_ context.Context, _ kubernetes.Interface, csr *certv1.CertificateSigningRequest) ([]byte, error) {
		h.csrs.mu.Lock()
		r := h.csrs.requests[csr.Name]
		h.csrs.mu.Unlock()
		// The signer's clock is two hours behind this node's.
		return h.csrs.ca.issue(t, r.Template, r.Key.Public(), h.clk.Now().Add(-2*time.Hour), time.Hour), nil
	}
	h.run()
	h.eventually("a try failed", 0, func() bool { return h.status("daemon").Errors >= 1 })
	if s := h.status("daemon"); !strings.Contains(s.LastError, "is this node's clock ahead?") {
		t.Errorf("last error %q does not ask about the clock", s.LastError)
	}
	if got := value(t, h.agent.metrics.renewErrors.WithLabelValues("daemon", ReasonInvalid)); got < 1 {
		t.Errorf("renew_errors_total{reason=Invalid} = %v, want at least 1", got)
	}
}

// capturedLogs is a logger that keeps, at default verbosity, the lines
// holding a substring, and what it kept so far.
func capturedLogs(substring string) (logr.Logger, func() []string) {
	var mu sync.Mutex
	var lines []string
	logger := funcr.New(func(_, args string) {
		if strings.Contains(args, substring) {
			mu.Lock()
			lines = append(lines, args)
			mu.Unlock()
		}
	}, funcr.Options{})
	return logger, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), lines...)
	}
}
