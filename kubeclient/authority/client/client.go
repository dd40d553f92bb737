// Package client is a typed client and informer for keyward's Authority
// resource (keyward.dev/v1alpha1), the only place the signer and the trust
// publisher meet.
package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

var (
	scheme = runtime.NewScheme()
	codecs = serializer.NewCodecFactory(scheme)
)

func init() {
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		panic(err)
	}
	metav1.AddToGroupVersion(scheme, metav1.SchemeGroupVersion)
}

// Client reads and writes Authority objects. It is safe for concurrent use.
type Client struct {
	rest rest.Interface
}

// New builds a Client from a rest.Config (its QPS and Burst apply).
func New(cfg *rest.Config) (*Client, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.SchemeGroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = codecs.WithoutConversion()
	if c.UserAgent == "" {
		c.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("building the Authority client: %w", err)
	}
	return &Client{rest: rc}, nil
}

const resource = "authorities"

// Get reads one Authority.
func (c *Client) Get(ctx context.Context, name string) (*v1alpha1.Authority, error) {
	out := &v1alpha1.Authority{}
	err := c.rest.Get().Resource(resource).Name(name).Do(ctx).Into(out)
	return out, err
}

// List lists Authorities.
func (c *Client) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.AuthorityList, error) {
	out := &v1alpha1.AuthorityList{}
	err := c.rest.Get().Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
	return out, err
}

// Watch watches Authorities.
func (c *Client) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return c.rest.Get().Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

// Create creates an Authority.
func (c *Client) Create(ctx context.Context, a *v1alpha1.Authority, opts metav1.CreateOptions) (*v1alpha1.Authority, error) {
	out := &v1alpha1.Authority{}
	err := c.rest.Post().Resource(resource).VersionedParams(&opts, metav1.ParameterCodec).Body(a).Do(ctx).Into(out)
	return out, err
}

// Update replaces an Authority's metadata and spec (status is ignored).
func (c *Client) Update(ctx context.Context, a *v1alpha1.Authority, opts metav1.UpdateOptions) (*v1alpha1.Authority, error) {
	out := &v1alpha1.Authority{}
	err := c.rest.Put().Resource(resource).Name(a.Name).VersionedParams(&opts, metav1.ParameterCodec).Body(a).Do(ctx).Into(out)
	return out, err
}

// UpdateStatus replaces an Authority's status.
func (c *Client) UpdateStatus(ctx context.Context, a *v1alpha1.Authority, opts metav1.UpdateOptions) (*v1alpha1.Authority, error) {
	out := &v1alpha1.Authority{}
	err := c.rest.Put().Resource(resource).Name(a.Name).SubResource("status").VersionedParams(&opts, metav1.ParameterCodec).Body(a).Do(ctx).Into(out)
	return out, err
}

// Delete deletes an Authority.
func (c *Client) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return c.rest.Delete().Resource(resource).Name(name).Body(&opts).Do(ctx).Error()
}

// Patch patches an Authority, or its status with subresource "status".
func (c *Client) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions, subresources ...string) (*v1alpha1.Authority, error) {
	out := &v1alpha1.Authority{}
	err := c.rest.Patch(pt).Resource(resource).Name(name).SubResource(subresources...).
		VersionedParams(&opts, metav1.ParameterCodec).Body(data).Do(ctx).Into(out)
	return out, err
}

// ApplyStatus server-side-applies status as fieldManager (forcing
// ownership of the fields it sets). status should carry only the fields
// that manager owns: every other manager's fields stay as they are.
// Generations are matched by name.
func (c *Client) ApplyStatus(ctx context.Context, name string, status any, fieldManager string) (*v1alpha1.Authority, error) {
	body, err := json.Marshal(map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(),
		"kind":       "Authority",
		"metadata":   map[string]any{"name": name},
		"status":     status,
	})
	if err != nil {
		return nil, fmt.Errorf("encoding the status of Authority %s: %w", name, err)
	}
	force := true
	a, err := c.Patch(ctx, name, types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: fieldManager, Force: &force}, "status")
	if err != nil && StaleSchema(err) {
		return nil, fmt.Errorf("%w: %w", ErrStaleCRD, err)
	}
	return a, err
}

// ErrStaleCRD matches an apply the cluster's Authority CRD refused for a
// field its schema lacks: the CRD is older than this keyward.
var ErrStaleCRD = errors.New("the Authority CRD in the cluster is older than this keyward (its schema lacks a status field keyward writes): apply deploy/crds/ of this release, then nothing else is needed")

// StaleSchema reports whether err is the apiserver refusing a server-side
// apply for a field the schema does not declare.
func StaleSchema(err error) bool {
	return err != nil && strings.Contains(err.Error(), "field not declared in schema")
}

// IndexSignerName is the informer index of Authorities by spec.signerName.
const IndexSignerName = "signerName"

// NewInformer is a shared informer over every Authority, indexed by
// spec.signerName (IndexSignerName). Start it with Run.
func NewInformer(c *Client, resync time.Duration) cache.SharedIndexInformer {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return c.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return c.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(lw, &v1alpha1.Authority{}, resync, cache.Indexers{
		IndexSignerName: func(obj any) ([]string, error) {
			a, ok := obj.(*v1alpha1.Authority)
			if !ok {
				return nil, nil
			}
			return []string{a.Spec.SignerName}, nil
		},
	})
}

// BySignerName returns the Authorities in inf's cache that name signer.
// More than one is a conflict the caller must refuse to act on.
func BySignerName(inf cache.SharedIndexInformer, signer string) ([]*v1alpha1.Authority, error) {
	objs, err := inf.GetIndexer().ByIndex(IndexSignerName, signer)
	if err != nil {
		return nil, err
	}
	out := make([]*v1alpha1.Authority, 0, len(objs))
	for _, o := range objs {
		if a, ok := o.(*v1alpha1.Authority); ok {
			out = append(out, a)
		}
	}
	return out, nil
}
