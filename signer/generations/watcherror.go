package generations

import (
	"context"
	"errors"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
)

// ErrNoAuthorityAPI means the apiserver answered 404 to the Authority
// list: the cluster does not serve the resource (its CRD is not installed,
// or was deleted).
var ErrNoAuthorityAPI = errors.New("the cluster does not serve Authorities (authorities.keyward.dev): is the CRD installed? kubectl apply -f deploy/crds/")

// watchError is the Authority informer's watch error handler: a 404 is
// said once, in words, and reported by Err (for /readyz) until a list
// succeeds or an Authority arrives; client-go's own handler would log it
// at every retry as "Failed to watch … could not find the requested
// resource". Other errors go to client-go's handler.
func (m *Manager) watchError(ctx context.Context, r *cache.Reflector, err error) {
	if !apierrors.IsNotFound(err) {
		cache.DefaultWatchErrorHandler(ctx, r, err)
		return
	}
	if !m.noAPI.Swap(true) {
		klog.FromContext(ctx).Error(err, "No signer name issues: the cluster does not serve Authorities (authorities.keyward.dev); install the CRD (kubectl apply -f deploy/crds/) and create an Authority (keyward ca init or ca import); retrying quietly")
	}
}

// apiServed clears what watchError recorded.
func (m *Manager) apiServed(ctx context.Context) {
	if m.noAPI.Swap(false) {
		klog.FromContext(ctx).Info("The cluster serves Authorities again")
	}
}
