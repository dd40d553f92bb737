// Package record is the trust publisher's own record of the phases it
// moved: a JSON annotation on the ClusterTrustBundles it publishes. Only
// the signer's identity may write those bundles (RBAC resourceNames plus
// the apiserver's `attest` check), unlike an Authority's status, which
// any identity granted authorities/status may write, under any field
// manager name it likes. The trust publisher and the signer both honour
// a status phase only when it agrees with this record (docs/trustpublisher.md,
// "Whose phase is it").
package record

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/keyward/keyward/internal/pemcert"
	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	certv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// Annotation holds a Record (JSON) on each ClusterTrustBundle the trust
// publisher writes.
const Annotation = "keyward.dev/phase-record"

// ManagedByLabel and ManagedByValue mark the ClusterTrustBundles the trust
// publisher owns.
const (
	ManagedByLabel = "app.kubernetes.io/managed-by"
	ManagedByValue = "keyward"
)

// BundleName is the name of a signer's ClusterTrustBundle of one version
// (canary or live): the signer name with / as :, then :version.
func BundleName(signerName, version string) string {
	return strings.ReplaceAll(signerName, "/", ":") + ":" + version
}

// Record is what the trust publisher last decided for one Authority.
type Record struct {
	// Authority and UID name the Authority object the record is of: a
	// record of a deleted Authority does not count for a new one.
	Authority string    `json:"authority"`
	UID       types.UID `json:"uid"`
	// Revision grows by one with every change; of two bundles' records
	// the higher revision is the newer.
	Revision    int64   `json:"revision"`
	Generations []Entry `json:"generations,omitempty"`
}

// Entry is one generation's phase as the trust publisher moved it.
type Entry struct {
	Name  string         `json:"name"`
	Phase v1alpha1.Phase `json:"phase"`
	// Since is when the trust publisher moved it to Phase.
	Since *metav1.Time `json:"since,omitempty"`
	// CertificateDigest is CertificateDigest of the generation as it was
	// when it reached Phase: a phase reached with another certificate does
	// not count for this one.
	CertificateDigest string `json:"certificateDigest"`
}

// CertificateDigest is the hex SHA-256 of a generation's certificatePEM and
// chainPEM: what its root, and so every bundle it is in, depends on.
func CertificateDigest(g v1alpha1.Generation) string {
	h := sha256.New()
	h.Write([]byte(g.CertificatePEM))
	h.Write([]byte{0})
	h.Write([]byte(g.ChainPEM))
	return hex.EncodeToString(h.Sum(nil))
}

// Entry returns the record's entry for generation g: its phase counts only
// if it was reached with g's current certificate.
func (r *Record) Entry(g v1alpha1.Generation) (Entry, bool) {
	if r == nil {
		return Entry{}, false
	}
	for _, e := range r.Generations {
		if e.Name == g.Name && e.CertificateDigest == CertificateDigest(g) {
			return e, true
		}
	}
	return Entry{}, false
}

// Phase is the recorded phase of g ("" when the record has none for g's
// current certificate).
func (r *Record) Phase(g v1alpha1.Generation) v1alpha1.Phase {
	e, _ := r.Entry(g)
	return e.Phase
}

// Same reports whether r and o record the same phases (not comparing
// Revision).
func (r *Record) Same(o *Record) bool {
	if r == nil || o == nil {
		return r == o
	}
	if r.Authority != o.Authority || r.UID != o.UID || len(r.Generations) != len(o.Generations) {
		return false
	}
	for i := range r.Generations {
		a, b := r.Generations[i], o.Generations[i]
		if a.Name != b.Name || a.Phase != b.Phase || a.CertificateDigest != b.CertificateDigest || !a.Since.Equal(b.Since) {
			return false
		}
	}
	return true
}

// Encode is the annotation value of r.
func (r *Record) Encode() string {
	b, err := json.Marshal(r)
	if err != nil {
		// A Record is plain data: it always encodes.
		panic(fmt.Sprintf("encoding a phase record: %v", err))
	}
	return string(b)
}

// ErrForeign is matched by the error of a bundle whose record names
// another Authority (or another object of the same name).
var ErrForeign = errors.New("the phase record is of another Authority")

// Decode reads the record on bundle b for Authority a: nil, nil when b
// carries none (a bundle written before records existed).
func Decode(b *certv1.ClusterTrustBundle, a *v1alpha1.Authority) (*Record, error) {
	v, ok := b.Annotations[Annotation]
	if !ok {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal([]byte(v), &r); err != nil {
		return nil, fmt.Errorf("ClusterTrustBundle %s: annotation %s: %w", b.Name, Annotation, err)
	}
	if r.Authority != a.Name || r.UID != a.UID {
		return nil, fmt.Errorf("ClusterTrustBundle %s: %w (%s, uid %s), not of Authority %s (uid %s)", b.Name, ErrForeign, r.Authority, r.UID, a.Name, a.UID)
	}
	return &r, nil
}

// Getter reads a ClusterTrustBundle by name from a cache (nil, nil when
// absent).
type Getter func(name string) (*certv1.ClusterTrustBundle, error)

// StoreGetter is the Getter of an informer's store of ClusterTrustBundles.
func StoreGetter(store cache.Store) Getter {
	return func(name string) (*certv1.ClusterTrustBundle, error) {
		obj, ok, err := store.GetByKey(name)
		if err != nil || !ok {
			return nil, err
		}
		b, _ := obj.(*certv1.ClusterTrustBundle)
		return b, nil
	}
}

// NewInformer is a ClusterTrustBundle informer over the bundles the trust
// publisher writes (ManagedByLabel), where its records are.
func NewInformer(c kubernetes.Interface, resync time.Duration) cache.SharedIndexInformer {
	return informers.NewSharedInformerFactoryWithOptions(c, resync,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = ManagedByLabel + "=" + ManagedByValue }),
	).Certificates().V1().ClusterTrustBundles().Informer()
}

// Lookup returns the trust publisher's newest record for a, read from its
// canary and live bundles. With no bundle at all it is an empty record
// (nothing was published). A bundle without a record (published before
// records existed) yields, once, the status phases its content agrees with
// (Adopt). A record of another Authority object counts as none.
func Lookup(get Getter, a *v1alpha1.Authority) (*Record, error) {
	var best *Record
	var legacy []*certv1.ClusterTrustBundle
	for _, version := range []string{v1alpha1.BundleCanary, v1alpha1.BundleLive} {
		b, err := get(BundleName(a.Spec.SignerName, version))
		if err != nil {
			return nil, fmt.Errorf("reading ClusterTrustBundle %s: %w", BundleName(a.Spec.SignerName, version), err)
		}
		if b == nil || b.DeletionTimestamp != nil {
			continue
		}
		r, err := Decode(b, a)
		switch {
		case errors.Is(err, ErrForeign):
			continue
		case err != nil:
			return nil, err
		case r == nil:
			legacy = append(legacy, b)
		case best == nil || r.Revision > best.Revision:
			best = r
		}
	}
	if best != nil {
		return best, nil
	}
	if len(legacy) > 0 {
		return Adopt(a, legacy), nil
	}
	return &Record{Authority: a.Name, UID: a.UID}, nil
}

// Adopt is the record of bundles written before records existed: each
// generation whose status phase puts its root in exactly the bundles that
// hold it (and in none that are absent). Only the signer's identity wrote
// those bundles, so their content is the trust publisher's word.
func Adopt(a *v1alpha1.Authority, bundles []*certv1.ClusterTrustBundle) *Record {
	holds := map[string]string{} // version → trustBundle
	for _, b := range bundles {
		for _, version := range []string{v1alpha1.BundleCanary, v1alpha1.BundleLive} {
			if b.Name == BundleName(a.Spec.SignerName, version) {
				holds[version] = b.Spec.TrustBundle
			}
		}
	}
	status := map[string]v1alpha1.GenerationStatus{}
	for _, s := range a.Status.Generations {
		status[s.Name] = s
	}
	r := &Record{Authority: a.Name, UID: a.UID}
	for _, g := range a.Spec.Generations {
		s, ok := status[g.Name]
		if !ok || s.Phase == "" || s.Phase == v1alpha1.PhaseRetired {
			continue
		}
		root, ok := rootPEM(g)
		if !ok {
			continue
		}
		inCanary := strings.Contains(holds[v1alpha1.BundleCanary], root)
		inLive := strings.Contains(holds[v1alpha1.BundleLive], root)
		if inCanary != InCanary(s.Phase) || inLive != InLive(s.Phase) {
			continue
		}
		r.Generations = append(r.Generations, Entry{Name: g.Name, Phase: s.Phase, Since: s.Since.DeepCopy(), CertificateDigest: CertificateDigest(g)})
	}
	return r
}

// InCanary and InLive say which bundles a phase puts a generation's root
// in (docs/rotation.md).
func InCanary(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhaseStaged || p == v1alpha1.PhasePromoted || p == v1alpha1.PhaseActive
}

// InLive: see InCanary.
func InLive(p v1alpha1.Phase) bool {
	return p == v1alpha1.PhasePromoted || p == v1alpha1.PhaseActive || p == v1alpha1.PhaseRetiring
}

// rootPEM is g's root (the last certificate of certificatePEM then
// chainPEM) as a PEM block, as the trust publisher writes it in a bundle.
func rootPEM(g v1alpha1.Generation) (string, bool) {
	certs, err := pemcert.Parse([]byte(g.CertificatePEM + "\n" + g.ChainPEM))
	if err != nil || len(certs) == 0 {
		return "", false
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: certs[len(certs)-1].Raw})), true
}

// Checks reports whether a keyCheck names what generation g is now: its
// keyURI and CertificateDigest. A keyCheck of another key or certificate
// (written before a swap) says nothing about this one.
func Checks(kc *v1alpha1.KeyCheck, g v1alpha1.Generation) bool {
	return kc != nil && kc.KeyURI == g.KeyURI && kc.CertificateDigest == CertificateDigest(g)
}
