package pcr

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	certv1 "k8s.io/api/certificates/v1"
	certv1beta1 "k8s.io/api/certificates/v1beta1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

// issuedPCR is a request as an informer receives it once issued: the
// kubelet's and the signer's managedFields, an owner reference to the pod,
// the stub request, a two-certificate chain and the Issued condition.
func issuedPCR(t testing.TB) *certv1.PodCertificateRequest {
	t.Helper()
	p := testPCR(t.(*testing.T), "keyward.dev/unit")
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	p.ResourceVersion, p.CreationTimestamp = "12345", now
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "pod", UID: "pod-uid"}}
	p.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "kubelet", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "certificates.k8s.io/v1", Time: &now, FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:metadata":{"f:generateName":{},"f:ownerReferences":{".":{},"k:{\"uid\":\"pod-uid\"}":{}}},"f:spec":{"f:maxExpirationSeconds":{},"f:nodeName":{},"f:nodeUID":{},"f:podName":{},"f:podUID":{},"f:serviceAccountName":{},"f:serviceAccountUID":{},"f:signerName":{},"f:stubPKCS10Request":{}}}`)}},
		{Manager: "keyward", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "certificates.k8s.io/v1", Time: &now, FieldsType: "FieldsV1", Subresource: "status",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{"f:beginRefreshAt":{},"f:certificateChain":{},"f:conditions":{".":{},"k:{\"type\":\"Issued\"}":{".":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{},"f:type":{}}},"f:notAfter":{},"f:notBefore":{}}}`)}},
	}
	var chain strings.Builder
	for range 2 {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "keyward test"},
			NotBefore: now.Time, NotAfter: now.Add(time.Hour), URIs: nil}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			t.Fatal(err)
		}
		chain.Write(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	}
	later := metav1.NewTime(now.Add(30 * time.Minute))
	end := metav1.NewTime(now.Add(time.Hour))
	p.Status = certv1.PodCertificateRequestStatus{
		Conditions: []metav1.Condition{{Type: "Issued", Status: metav1.ConditionTrue, Reason: ReasonIssued,
			Message: "issued by keyward.dev/unit, serial 5f1e0c6a3f0e4f529d7e2f6a1c9b8e11", LastTransitionTime: now}},
		CertificateChain: chain.String(), NotBefore: &now, BeginRefreshAt: &later, NotAfter: &end,
	}
	return p
}

func pendingPCR(t *testing.T) *certv1.PodCertificateRequest {
	p := issuedPCR(t)
	p.Status = certv1.PodCertificateRequestStatus{}
	p.ManagedFields = p.ManagedFields[:1]
	p.Labels = map[string]string{"team": "a"}
	p.Annotations = map[string]string{"note": "set by an admin"}
	return p
}

func TestTransform(t *testing.T) {
	api := v1API{}

	t.Run("a terminal request is reduced to a stub of its identity", func(t *testing.T) {
		p := issuedPCR(t)
		got, err := api.transform(p.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		want := &stub{namespace: p.Namespace, name: p.Name, uid: p.UID, resourceVersion: p.ResourceVersion,
			created: p.CreationTimestamp, signerName: p.Spec.SignerName}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("stub\n%+v\nwant\n%+v", got, want)
		}
		key, err := cache.MetaNamespaceKeyFunc(got)
		if err != nil || key != p.Namespace+"/"+p.Name {
			t.Fatalf("store key %q, %v", key, err)
		}
		r, err := api.toRequest(got)
		if err != nil || !r.terminal || r.uid != p.UID || r.signerName != p.Spec.SignerName {
			t.Fatalf("stub reads as %+v, %v; want terminal request %s", r, err, p.UID)
		}
		wantObj := &certv1.PodCertificateRequest{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion, CreationTimestamp: p.CreationTimestamp},
			Spec:       certv1.PodCertificateRequestSpec{SignerName: p.Spec.SignerName},
		}
		if !equality.Semantic.DeepEqual(r.obj, wantObj) {
			t.Fatalf("stub's request names\n%+v\nwant\n%+v", r.obj, wantObj)
		}
	})

	t.Run("a pending request keeps spec but its parsed key, identity and resourceVersion, and drops managedFields, labels, annotations and owners", func(t *testing.T) {
		p := pendingPCR(t)
		got, err := api.transform(p.DeepCopy())
		if err != nil {
			t.Fatal(err)
		}
		d, ok := got.(*decoded)
		if !ok {
			t.Fatalf("stored %T, want *decoded", got)
		}
		obj := d.r.obj.(*certv1.PodCertificateRequest)
		spec := *p.Spec.DeepCopy()
		spec.StubPKCS10Request = nil
		want := &certv1.PodCertificateRequest{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, UID: p.UID, ResourceVersion: p.ResourceVersion, CreationTimestamp: p.CreationTimestamp},
			Spec:       spec,
		}
		if d.r.publicKey == nil || d.r.keyErr != nil {
			t.Fatalf("the stub's key was not parsed before it was dropped: %v", d.r.keyErr)
		}
		if !equality.Semantic.DeepEqual(obj, want) {
			t.Fatalf("trimmed\n%+v\nwant\n%+v", obj, want)
		}
		key, err := cache.MetaNamespaceKeyFunc(got)
		if err != nil || key != p.Namespace+"/"+p.Name {
			t.Fatalf("store key %q, %v", key, err)
		}
	})

	t.Run("the transform is idempotent", func(t *testing.T) {
		for _, p := range []*certv1.PodCertificateRequest{issuedPCR(t), pendingPCR(t)} {
			once, _ := api.transform(p)
			twice, _ := api.transform(once)
			if !reflect.DeepEqual(once, twice) {
				t.Fatalf("transforming again changed %T", once)
			}
		}
	})

	t.Run("a stored pending request is decoded once, not on every read", func(t *testing.T) {
		stored, _ := api.transform(pendingPCR(t))
		var err error
		allocs := testing.AllocsPerRun(100, func() { _, err = api.toRequest(stored) })
		if err != nil {
			t.Fatal(err)
		}
		// One allocation: the copy the caller may change. Parsing the
		// stub request costs dozens.
		if allocs > 1 {
			t.Fatalf("toRequest of a stored request allocates %.0f times: it decodes again", allocs)
		}
	})

	t.Run("a read returns a copy the controller may change", func(t *testing.T) {
		stored, _ := api.transform(pendingPCR(t))
		r1, _ := api.toRequest(stored)
		r1.seen = time.Now()
		r2, _ := api.toRequest(stored)
		if !r2.seen.IsZero() {
			t.Fatal("changing one read's request changed the stored one")
		}
	})

	t.Run("DeepCopyObject copies the trimmed object", func(t *testing.T) {
		stored, _ := api.transform(pendingPCR(t))
		cp := stored.(*decoded).DeepCopyObject().(*decoded)
		cp.r.obj.(*certv1.PodCertificateRequest).Name = "changed"
		if stored.(*decoded).GetName() == "changed" {
			t.Fatal("the copy shares the object")
		}
	})

	t.Run("v1beta1 stubs and trims the same way", func(t *testing.T) {
		b := v1beta1API{}
		p := v1beta1PKIX(t, mustKey(t).Public(), nil)
		p.ManagedFields = []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
		got, _ := b.transform(p.DeepCopy())
		spec := *p.Spec.DeepCopy()
		spec.PKIXPublicKey, spec.ProofOfPossession = nil, nil
		if d := got.(*decoded); d.r.obj.(*certv1beta1.PodCertificateRequest).ManagedFields != nil ||
			!reflect.DeepEqual(d.r.obj.(*certv1beta1.PodCertificateRequest).Spec, spec) || d.r.keyErr == nil {
			// The fixture's proof is empty: the key was looked at (and
			// refused) before the key material was dropped.
			t.Fatalf("trimmed v1beta1 request %+v (key error %v)", d.r.obj, d.r.keyErr)
		}
		p.Status.Conditions = []metav1.Condition{{Type: "Denied", Status: metav1.ConditionTrue, Reason: "InvalidProofOfPossession", Message: strings.Repeat("m", 1000)}}
		got, _ = b.transform(p.DeepCopy())
		if s, ok := got.(*stub); !ok || s.uid != p.UID {
			t.Fatalf("v1beta1 stub %+v", got)
		}
		r, err := b.toRequest(got)
		if err != nil || !r.terminal {
			t.Fatalf("v1beta1 stub reads as %+v, %v", r, err)
		}
		if _, ok := r.obj.(*certv1beta1.PodCertificateRequest); !ok {
			t.Fatalf("v1beta1 stub's request names a %T", r.obj)
		}
	})
}

func mustKey(t *testing.T) *ecdsa.PrivateKey {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The informer stores transformed objects: the transform is wired into it.
func TestInformerStoresTransformedRequests(t *testing.T) {
	issued, pending := issuedPCR(t), pendingPCR(t)
	pending.Name, pending.UID = "pcr-2", "pcr-uid-2"
	inf := v1API{fake.NewClientset(issued, pending)}.newInformer("keyward.dev/unit")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	for _, tc := range []struct {
		p    *certv1.PodCertificateRequest
		want string
	}{{issued, "*pcr.stub"}, {pending, "*pcr.decoded"}} {
		obj, ok, err := inf.GetIndexer().GetByKey(tc.p.Namespace + "/" + tc.p.Name)
		if err != nil || !ok {
			t.Fatalf("%s not stored: %v", tc.p.Name, err)
		}
		if got := reflect.TypeOf(obj).String(); got != tc.want {
			t.Fatalf("%s stored as %s, want %s", tc.p.Name, got, tc.want)
		}
		m, err := meta.Accessor(obj)
		if err != nil {
			t.Fatal(err)
		}
		if len(m.GetManagedFields()) != 0 {
			t.Fatalf("%s stored with managedFields", tc.p.Name)
		}
	}
}

// 10 000 terminal requests, as the informer receives them from the
// apiserver (each decoded on its own, so nothing is shared), must cost a
// small fraction of 100 MB once stored.
func TestTerminalRequestsStaySmallInTheCache(t *testing.T) {
	const n = 10000
	api := v1API{}
	raw, err := issuedPCR(t).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	retained := func(transform bool) uint64 {
		kept := make([]any, n)
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for i := range kept {
			p := &certv1.PodCertificateRequest{}
			if err := p.Unmarshal(raw); err != nil {
				t.Fatal(err)
			}
			kept[i] = p
			if transform {
				kept[i], _ = api.transform(p)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(kept)
		return (after.HeapAlloc - before.HeapAlloc) / n
	}
	whole, stub := retained(false), retained(true)
	t.Logf("bytes per cached terminal request: whole %d, stub %d (10 000: %.1f MB → %.1f MB)", whole, stub, float64(whole*n)/1e6, float64(stub*n)/1e6)
	// A stub is its struct and a few short strings; the budget leaves room
	// for allocator rounding.
	if stub > 400 {
		t.Fatalf("a stored terminal request costs %d bytes, want ≤ 400", stub)
	}
}
