package softhsmtests

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/agent"
	"github.com/keyward/keyward/testsupport/controlplane"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"
)

// A node agent whose CSR stays pending says why at default verbosity once
// renewal.waitTimeout has passed, and further tries look up the same CSR
// (one CSR in all) without repeating anything at default verbosity,
// neither the agent's wait nor client-go's "csr for this node already
// exists, reusing".
func TestAPendingCSRIsReportedOnceWithWhatItLacks(t *testing.T) {
	cases := []struct {
		name string
		// identity returns the agent's client config and user name.
		identity func(t *testing.T, ctx context.Context) (*rest.Config, string)
		want     string
	}{
		{
			name: "a signer name nobody serves is not approved",
			identity: func(t *testing.T, _ context.Context) (*rest.Config, string) {
				node := uniqueName(t, "node")
				cfg, err := cp.NodeConfig(node)
				if err != nil {
					t.Fatal(err)
				}
				return cfg, node
			},
			want: "not approved (is an approver for signer",
		},
		{
			name: "an identity that may create and get CSRs but not list them is told the list is forbidden",
			identity: func(t *testing.T, ctx context.Context) (*rest.Config, string) {
				user := uniqueName(t, "no-list")
				grantCSRVerbs(t, ctx, user, "create", "get")
				cfg, err := cp.UserConfig(user)
				if err != nil {
					t.Fatal(err)
				}
				return cfg, user
			},
			want: `cannot list resource \"certificatesigningrequests\"`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			restCfg, user := tc.identity(t, ctx)
			signerName := "keyward.dev/" + uniqueName(t, "nobody-serves")
			dir := t.TempDir()
			kubeconfig := filepath.Join(dir, "kubeconfig")
			if err := controlplane.WriteKubeconfig(restCfg, user, kubeconfig); err != nil {
				t.Fatal(err)
			}
			exp := int32(3600)
			cfg := &agent.Configuration{
				APIVersion: agent.APIVersion, Kind: agent.Kind, NodeName: user, StateDir: filepath.Join(dir, "state"),
				Kubeconfig: kubeconfig, MetricsAddress: agent.Disabled, HealthAddress: agent.Disabled,
				Renewal: agent.Renewal{
					RetryInitial: metav1.Duration{Duration: 100 * time.Millisecond},
					RetryMax:     metav1.Duration{Duration: 200 * time.Millisecond},
					WaitTimeout:  metav1.Duration{Duration: 2 * time.Second},
				},
				Credentials: []agent.Credential{{Name: "daemon", SignerName: signerName, ExpirationSeconds: &exp,
					URIs: []string{"spiffe://cluster.local/node/${NODE_NAME}/daemon"}, Output: agent.Output{Dir: filepath.Join(dir, "out")}}},
			}
			a, err := agent.New(agent.Options{Config: cfg})
			if err != nil {
				t.Fatal(err)
			}
			var logs lockedBuffer
			runCtx, stop := context.WithCancel(klog.NewContext(ctx,
				textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(0), textlogger.Output(&logs)))))
			done := make(chan error, 1)
			go func() { done <- a.Run(runCtx) }()
			if err := wait.PollUntilContextCancel(ctx, 100*time.Millisecond, true, func(context.Context) (bool, error) {
				return a.Status()[0].Errors >= 3, nil
			}); err != nil {
				t.Fatalf("three waits did not time out: %v; status %+v", err, a.Status())
			}
			stop()
			if err := <-done; err != nil {
				t.Fatalf("Run: %v", err)
			}
			out := logs.String()
			var failures []string
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "Renewing the credential failed") {
					failures = append(failures, line)
				}
			}
			if len(failures) != 1 || !strings.Contains(failures[0], tc.want) {
				t.Errorf("want one failure at default verbosity saying %q; logs:\n%s", tc.want, out)
			}
			if n := strings.Count(out, "Waiting for the certificate"); n != 1 {
				t.Errorf("%d waits logged at default verbosity, want 1; logs:\n%s", n, out)
			}
			if strings.Contains(out, "csr for this node") {
				t.Errorf("client-go's reuse lines at default verbosity; logs:\n%s", out)
			}
			csrs, err := cp.AdminClient().CertificatesV1().CertificateSigningRequests().List(ctx, metav1.ListOptions{})
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, c := range csrs.Items {
				if c.Spec.SignerName == signerName {
					n++
				}
			}
			if n != 1 {
				t.Errorf("%d CSRs for %s, want the one looked up again", n, signerName)
			}
		})
	}
}

// grantCSRVerbs lets user do verbs on CertificateSigningRequests, until the test ends.
func grantCSRVerbs(t *testing.T, ctx context.Context, user string, verbs ...string) {
	t.Helper()
	admin := cp.AdminClient()
	name := uniqueName(t, "csr-verbs")
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"}, Verbs: verbs}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: user}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}
