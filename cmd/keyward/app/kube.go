package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strings"

	"github.com/keyward/keyward/kubeclient"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/spf13/cobra"
	authnv1 "k8s.io/api/authentication/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// kubeFlags reach the cluster as kubectl would: --kubeconfig, else
// $KUBECONFIG, else in-cluster when running in a pod, else ~/.kube/config.
type kubeFlags struct {
	kubeconfig string
}

func (k *kubeFlags) addFlags(cmd *cobra.Command) {
	cmd.Flags().StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, in-cluster, or ~/.kube/config)")
}

// path resolves which kubeconfig to use; "" means in-cluster.
func (k *kubeFlags) path() string {
	if k.kubeconfig != "" {
		return k.kubeconfig
	}
	if env := os.Getenv("KUBECONFIG"); env != "" {
		// A list: the first file, as kubectl reads contexts from it first.
		return filepath.SplitList(env)[0]
	}
	if os.Getenv("KUBERNETES_SERVICE_HOST") != "" {
		return ""
	}
	if home, err := os.UserHomeDir(); err == nil {
		if p := filepath.Join(home, ".kube", "config"); fileExists(p) {
			return p
		}
	}
	return ""
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

func (k *kubeFlags) restConfig() (*rest.Config, error) {
	return kubeclient.Config(k.path(), 20, 40)
}

// clients builds the Authority client and a clientset.
func (k *kubeFlags) clients() (*authclient.Client, kubernetes.Interface, error) {
	cfg, err := k.restConfig()
	if err != nil {
		return nil, nil, err
	}
	ac, err := authclient.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("building a Kubernetes client: %w", err)
	}
	return ac, cs, nil
}

// ErrNoAuthority means no Authority names the signer (or has the name).
var ErrNoAuthority = errors.New("no Authority found")

// ErrNoAuthorityCRD means the cluster does not serve the Authority
// resource: its CRD is not installed.
var ErrNoAuthorityCRD = errors.New("the cluster does not serve Authorities (authorities.keyward.dev): the CRD is not installed")

// noCRD is the error for a request the apiserver answered 404 because it
// does not serve the resource at all.
func noCRD(err error) error {
	return fmt.Errorf("%w; install it first: kubectl apply -f deploy/crds/ (docs/rotation.md#migrating-from-the-ca-block, step 1): %w", ErrNoAuthorityCRD, err)
}

// findAuthority reads the Authority named ref, or, when ref is a signer
// name (it has a "/"), the one Authority whose spec.signerName is ref.
func findAuthority(ctx context.Context, c *authclient.Client, ref string) (*v1alpha1.Authority, error) {
	if !strings.Contains(ref, "/") {
		a, err := c.Get(ctx, ref)
		if apierrors.IsNotFound(err) {
			// The object, or the whole resource? A list is never 404
			// while the resource is served.
			if _, lerr := c.List(ctx, metav1.ListOptions{Limit: 1}); apierrors.IsNotFound(lerr) {
				return nil, noCRD(lerr)
			}
			return nil, fmt.Errorf("%w: Authority %q does not exist", ErrNoAuthority, ref)
		}
		if err != nil {
			return nil, fmt.Errorf("reading Authority %s: %w", ref, err)
		}
		return a, nil
	}
	a, err := authorityForSigner(ctx, c, ref)
	if err != nil {
		return nil, err
	}
	if a == nil {
		return nil, fmt.Errorf("%w for signer %s (create one with keyward ca init)", ErrNoAuthority, ref)
	}
	return a, nil
}

// authorityForSigner returns the Authority for signer, nil if none; two
// are a conflict.
func authorityForSigner(ctx context.Context, c *authclient.Client, signer string) (*v1alpha1.Authority, error) {
	list, err := c.List(ctx, metav1.ListOptions{})
	if apierrors.IsNotFound(err) {
		return nil, noCRD(err)
	}
	if err != nil {
		return nil, fmt.Errorf("listing Authorities: %w", err)
	}
	var found []*v1alpha1.Authority
	for i := range list.Items {
		if list.Items[i].Spec.SignerName == signer {
			found = append(found, &list.Items[i])
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	default:
		return nil, fmt.Errorf("Authorities %s and %s both name signer %s: delete one", found[0].Name, found[1].Name, signer)
	}
}

// authorityNameFor derives an Authority's name from a signer name:
// "example.com/my-signer" becomes "example.com.my-signer"
// (v1alpha1.DefaultAuthorityName, the name the shipped RBAC grants).
func authorityNameFor(signer string) (string, error) {
	s, err := v1alpha1.DefaultAuthorityName(signer)
	if err != nil {
		return "", fmt.Errorf("%w: pass --authority NAME", err)
	}
	return s, nil
}

// requester names who runs the command: the Kubernetes user if the
// apiserver says (SelfSubjectReview), else the local user.
func requester(ctx context.Context, cs kubernetes.Interface) string {
	local := ""
	if u, err := user.Current(); err == nil {
		local = u.Username
	}
	r, err := cs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authnv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err == nil && r.Status.UserInfo.Username != "" {
		if local != "" {
			return r.Status.UserInfo.Username + " (local user " + local + ")"
		}
		return r.Status.UserInfo.Username
	}
	return local
}
