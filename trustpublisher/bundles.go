package trustpublisher

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	authzv1 "k8s.io/api/authorization/v1"
	certv1 "k8s.io/api/certificates/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certv1ac "k8s.io/client-go/applyconfigurations/certificates/v1"
	"k8s.io/klog/v2"
)

// DefaultLabelDomain is the label domain of a bundle whose Authority does
// not set spec.trustBundleLabelDomain (the CRD defaults it the same).
const DefaultLabelDomain = "keyward.dev"

// BundleName is the name of a signer's ClusterTrustBundle of one version
// (canary or live): the signer name with / as :, then :version.
func BundleName(signerName, version string) string {
	return record.BundleName(signerName, version)
}

// BundleLabels are the labels of a published bundle: the version label
// kubelet selects on and the managed-by label the controller watches.
func BundleLabels(domain, version string) map[string]string {
	if domain == "" {
		domain = DefaultLabelDomain
	}
	return map[string]string{v1alpha1.BundleVersionLabel(domain): version, ManagedByLabel: ManagedByValue}
}

// desiredBundle is one ClusterTrustBundle as the observed phases want it.
type desiredBundle struct {
	name, signer, version string
	labels                map[string]string
	// annotations carry the trust publisher's phase record.
	annotations map[string]string
	pem         string
	members     []Member
	// status is what status.bundles says of it.
	status v1alpha1.BundleStatus
}

func (c *Controller) desiredBundle(a *v1alpha1.Authority, version string, members []Member, rec *record.Record) desiredBundle {
	name := BundleName(a.Spec.SignerName, version)
	var gens []string
	for _, m := range members {
		gens = append(gens, m.Generations...)
	}
	return desiredBundle{
		name: name, signer: a.Spec.SignerName, version: version,
		labels:      BundleLabels(a.Spec.TrustBundleLabelDomain, version),
		annotations: map[string]string{record.Annotation: rec.Encode()},
		pem:         BundlePEM(members),
		members:     members,
		status:      v1alpha1.BundleStatus{Version: version, Name: name, Generations: gens, Digest: BundleDigest(members)},
	}
}

// bundleStatusBefore is a bundle's status before this sync publishes: the
// new digest, still marked published only if it was already.
// lastChangeTime moves only when the published content changes
// (bundleStatusAfter), so a repaired drift is not a change.
func bundleStatusBefore(a *v1alpha1.Authority, d desiredBundle) v1alpha1.BundleStatus {
	st := *d.status.DeepCopy()
	for _, prev := range a.Status.Bundles {
		if prev.Version != d.version {
			continue
		}
		st.LastChangeTime = prev.LastChangeTime.DeepCopy()
		st.PropagationWindow = prev.PropagationWindow.DeepCopy()
		if prev.Digest == st.Digest && prev.Name == st.Name {
			st.Published = prev.Published
		}
	}
	return st
}

// bundleStatusAfter records the outcome of a publish: a digest that is
// published now and was not before starts the propagation window, from
// confirmed (the moment the write had returned, rounded up: a node may see
// the new content from then at the latest), recording window, the window
// in force (none when 0).
func bundleStatusAfter(st v1alpha1.BundleStatus, ok bool, confirmed time.Time, window time.Duration) v1alpha1.BundleStatus {
	if ok && !st.Published {
		st.LastChangeTime = &metav1.Time{Time: CeilSecond(confirmed)}
		st.PropagationWindow = nil
		if window > 0 {
			st.PropagationWindow = &metav1.Duration{Duration: window}
		}
	}
	st.Published = ok
	return st
}

// windowToRecord is the propagation window a change of a's bundle version
// records: spec's now, or none for the bundle's first content (its
// status named no digest yet). A first publication replaces nothing a
// node trusted, so spec's window, whatever it is by then, is enough.
func windowToRecord(a *v1alpha1.Authority, version string, window time.Duration) time.Duration {
	for _, b := range a.Status.Bundles {
		if b.Version == version && b.Digest != "" {
			return window
		}
	}
	return 0
}

type publishResult struct {
	// err names the bundle and carries the apiserver's error.
	err error
	// generation is the bundle's metadata.generation (0: absent).
	generation int64
	// written: this sync wrote or deleted the bundle.
	written bool
}

// publish makes each ClusterTrustBundle hold what desired says, by
// server-side apply (forcing ownership), or deletes it when it has no
// member. A bundle that already matches is not written.
func (c *Controller) publish(ctx context.Context, a *v1alpha1.Authority, desired []desiredBundle) []publishResult {
	out := make([]publishResult, len(desired))
	api := c.opts.Client.CertificatesV1().ClusterTrustBundles()
	for i, d := range desired {
		obj, exists, _ := c.bundles.GetStore().GetByKey(d.name)
		cached, _ := obj.(*certv1.ClusterTrustBundle)
		if d.pem == "" {
			if !exists {
				continue
			}
			err := api.Delete(ctx, d.name, metav1.DeleteOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				out[i].err = fmt.Errorf("deleting ClusterTrustBundle %s (no generation belongs in it): %w", d.name, err)
			}
			out[i].written = true
			continue
		}
		if exists && cached != nil && matches(cached, d) {
			out[i].generation = cached.Generation
			continue
		}
		ac := certv1ac.ClusterTrustBundle(d.name).
			WithLabels(d.labels).
			WithAnnotations(d.annotations).
			WithSpec(certv1ac.ClusterTrustBundleSpec().WithSignerName(d.signer).WithTrustBundle(d.pem))
		got, err := api.Apply(ctx, ac, metav1.ApplyOptions{FieldManager: v1alpha1.FieldManagerTrustPublisher, Force: true})
		if err != nil {
			out[i].err = fmt.Errorf("publishing ClusterTrustBundle %s for signer %s: %w", d.name, d.signer, err)
			continue
		}
		out[i].generation, out[i].written = got.Generation, true
		klog.FromContext(ctx).V(2).Info("Published ClusterTrustBundle", "bundle", d.name, "generations", d.status.Generations, "digest", d.status.Digest)
	}
	return out
}

func matches(b *certv1.ClusterTrustBundle, d desiredBundle) bool {
	if b.Spec.SignerName != d.signer || b.Spec.TrustBundle != d.pem || b.DeletionTimestamp != nil {
		return false
	}
	for k, v := range d.labels {
		if b.Labels[k] != v {
			return false
		}
	}
	for k, v := range d.annotations {
		if b.Annotations[k] != v {
			return false
		}
	}
	return true
}

// publishFailure is why the latest publish of an Authority's bundles
// failed, as the BundlesPublished condition says it.
type publishFailure struct {
	reason, message string
	err             error
}

func (c *Controller) failure(name string) *publishFailure {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.publishErr[name]; ok {
		return &f
	}
	return nil
}

// recordFailure classifies the first failed write of results (nil: none),
// remembers it, and logs it once per change at default verbosity.
func (c *Controller) recordFailure(ctx context.Context, a *v1alpha1.Authority, results []publishResult) *publishFailure {
	logger := klog.FromContext(ctx)
	var err error
	for _, r := range results {
		if r.err != nil {
			err = r.err
			break
		}
	}
	c.mu.Lock()
	prev, had := c.publishErr[a.Name]
	c.mu.Unlock()
	if err == nil {
		if had {
			c.mu.Lock()
			delete(c.publishErr, a.Name)
			c.mu.Unlock()
			logger.Info("ClusterTrustBundles published again", "signerName", a.Spec.SignerName, "after", prev.reason)
		}
		return nil
	}
	f := c.classify(ctx, a.Spec.SignerName, err)
	c.mu.Lock()
	c.publishErr[a.Name] = f
	c.mu.Unlock()
	if !had || prev.message != f.message {
		logger.Error(err, "Publishing ClusterTrustBundles failed; retrying with backoff", "signerName", a.Spec.SignerName, "reason", f.reason, "detail", f.message)
	}
	return &f
}

// classify turns a failed bundle write into the BundlesPublished
// condition. A 403 is asked back of the apiserver: is it the `attest`
// grant on the signer name, or the ClusterTrustBundle write itself?
func (c *Controller) classify(ctx context.Context, signer string, err error) publishFailure {
	if errors.Is(err, errInvalidMember) {
		return publishFailure{reason: v1alpha1.GateInvalidCertificate, message: err.Error(), err: err}
	}
	if !apierrors.IsForbidden(err) {
		return publishFailure{reason: ReasonWriteFailed, message: err.Error(), err: err}
	}
	allowed, aerr := c.mayAttest(ctx, signer)
	switch {
	case aerr == nil && !allowed:
		return publishFailure{reason: ReasonAttestForbidden, err: err, message: fmt.Sprintf(
			"missing grant: verb attest on certificates.k8s.io signers/%s (or signers/%s/*) for the signer's identity; the apiserver refused: %v",
			signer, signerDomain(signer), err)}
	case aerr == nil:
		return publishFailure{reason: ReasonWriteForbidden, err: err, message: fmt.Sprintf(
			"missing grant on certificates.k8s.io clustertrustbundles (create, update, patch, delete) for the signer's identity; attest on signers/%s is held; the apiserver refused: %v",
			signer, err)}
	default:
		return publishFailure{reason: ReasonWriteForbidden, err: err, message: fmt.Sprintf(
			"forbidden: the signer's identity needs attest on certificates.k8s.io signers/%s and writes on clustertrustbundles (checking which is missing failed: %v); the apiserver refused: %v",
			signer, aerr, err)}
	}
}

// mayAttest asks the apiserver whether the controller's identity holds
// attest on signer, by exact name or on "<domain>/*" (both satisfy the
// apiserver's ClusterTrustBundle admission).
func (c *Controller) mayAttest(ctx context.Context, signer string) (bool, error) {
	var errs []error
	for _, name := range []string{signer, signerDomain(signer) + "/*"} {
		r, err := c.opts.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{
			Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authzv1.ResourceAttributes{
				Group: "certificates.k8s.io", Resource: "signers", Verb: "attest", Name: name,
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("asking whether attest on signers/%s is held: %w", name, err))
			continue
		}
		if r.Status.Allowed {
			return true, nil
		}
	}
	return false, errors.Join(errs...)
}

func signerDomain(signer string) string {
	d, _, _ := strings.Cut(signer, "/")
	return d
}
