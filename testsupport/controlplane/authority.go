package controlplane

import (
	"context"
	"fmt"
	"time"

	"github.com/keyward/keyward/deploy"
	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"github.com/keyward/keyward/kubeclient/authority/record"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/trustpublisher"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	certv1ac "k8s.io/client-go/applyconfigurations/certificates/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// InstallAuthorityCRD applies the shipped Authority CRD (deploy/crds) and
// returns a client once the apiserver serves the resource.
func InstallAuthorityCRD(ctx context.Context, cfg *rest.Config) (*authclient.Client, error) {
	manifest, err := deploy.CRDs.ReadFile("crds/keyward.dev_authorities.yaml")
	if err != nil {
		return nil, fmt.Errorf("reading the Authority CRD: %w", err)
	}
	if err := ApplyManifest(ctx, cfg, manifest); err != nil {
		return nil, fmt.Errorf("applying deploy/crds: %w", err)
	}
	c, err := authclient.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("making an Authority client: %w", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		_, err := c.List(ctx, metav1.ListOptions{Limit: 1})
		return err == nil, nil
	})
	if err != nil {
		return nil, fmt.Errorf("waiting for the apiserver to serve authorities.keyward.dev: %w", err)
	}
	return c, nil
}

// ActiveAuthority creates (or replaces the spec of) Authority name for
// signerName with one generation, desired Active, and applies its status
// phase Active as the trust publisher would (its bootstrap: no generation
// was Active before). It returns the Authority as written.
func ActiveAuthority(ctx context.Context, c *authclient.Client, kc kubernetes.Interface, name, signerName, generation, keyURI, certificatePEM string) (*v1alpha1.Authority, error) {
	a := &v1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.AuthoritySpec{SignerName: signerName, Generations: []v1alpha1.Generation{
			{Name: generation, KeyURI: keyURI, CertificatePEM: certificatePEM, Phase: v1alpha1.PhaseActive},
		}},
	}
	if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("creating Authority %s: %w", name, err)
		}
		// A test fixture replaces its CA: the apiserver refuses to change
		// the key or certificate of a generation that has signed, so the
		// Authority is made anew (an operator adds a generation instead).
		if err := c.Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("deleting Authority %s: %w", name, err)
		}
		if _, err := c.Create(ctx, a, metav1.CreateOptions{}); err != nil {
			return nil, fmt.Errorf("creating Authority %s again: %w", name, err)
		}
	}
	return SetObservedPhases(ctx, c, kc, name, map[string]v1alpha1.Phase{generation: v1alpha1.PhaseActive})
}

// SetObservedPhases applies status phases as the trust publisher's field
// manager, standing in for it: phases maps every generation it reports.
// Like the trust publisher it then publishes the canary and live
// ClusterTrustBundles those phases put roots in, carrying its record of
// them (the signer issues only with a generation that record calls
// Active); kc's identity needs attest on the signer name (the admin has it).
func SetObservedPhases(ctx context.Context, c *authclient.Client, kc kubernetes.Interface, name string, phases map[string]v1alpha1.Phase) (*v1alpha1.Authority, error) {
	since := metav1.NewTime(time.Now().Truncate(time.Second))
	var gens []map[string]any
	for g, p := range phases {
		gens = append(gens, map[string]any{"name": g, "phase": p, "since": since})
	}
	out, err := c.ApplyStatus(ctx, name, map[string]any{"generations": gens}, v1alpha1.FieldManagerTrustPublisher)
	if err != nil {
		return nil, fmt.Errorf("applying the status phases of Authority %s: %w", name, err)
	}
	r := &record.Record{Authority: out.Name, UID: out.UID, Revision: time.Now().UnixNano()}
	for _, g := range out.Spec.Generations {
		if p := phases[g.Name]; p != "" {
			r.Generations = append(r.Generations, record.Entry{Name: g.Name, Phase: p, Since: since.DeepCopy(), CertificateDigest: record.CertificateDigest(g)})
		}
	}
	canary, live := trustpublisher.BundleContents(out)
	force := true
	for version, members := range map[string][]trustpublisher.Member{v1alpha1.BundleCanary: canary, v1alpha1.BundleLive: live} {
		if len(members) == 0 {
			continue
		}
		bname := trustpublisher.BundleName(out.Spec.SignerName, version)
		ac := certv1ac.ClusterTrustBundle(bname).
			WithLabels(trustpublisher.BundleLabels(out.Spec.TrustBundleLabelDomain, version)).
			WithAnnotations(map[string]string{record.Annotation: r.Encode()}).
			WithSpec(certv1ac.ClusterTrustBundleSpec().WithSignerName(out.Spec.SignerName).WithTrustBundle(trustpublisher.BundlePEM(members)))
		if _, err := kc.CertificatesV1().ClusterTrustBundles().Apply(ctx, ac, metav1.ApplyOptions{FieldManager: v1alpha1.FieldManagerTrustPublisher, Force: force}); err != nil {
			return nil, fmt.Errorf("publishing ClusterTrustBundle %s with the phase record: %w", bname, err)
		}
	}
	return out, nil
}
