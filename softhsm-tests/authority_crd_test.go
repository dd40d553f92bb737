package softhsmtests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/keyward/keyward/deploy"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/testsupport/controlplane"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

// The CRD does not parse PEM (the controller will): any text stands in.
const (
	testCACertPEM  = "-----BEGIN CERTIFICATE-----\nTUlJQg==\n-----END CERTIFICATE-----\n"
	testIssuersPEM = "-----BEGIN CERTIFICATE-----\nTUlJQw==\n-----END CERTIFICATE-----\n"
)

// installAuthorityCRD applies the shipped deploy/crds manifest and waits
// until the apiserver reports the CRD Established, then returns a client for
// Authority objects.
func installAuthorityCRD(t *testing.T, ctx context.Context) dynamic.NamespaceableResourceInterface {
	t.Helper()
	manifest, err := deploy.CRDs.ReadFile("crds/keyward.dev_authorities.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplane.ApplyManifest(ctx, cp.AdminConfig(), manifest); err != nil {
		t.Fatalf("applying deploy/crds: %v", err)
	}
	dyn, err := dynamic.NewForConfig(cp.AdminConfig())
	if err != nil {
		t.Fatal(err)
	}
	crds := dyn.Resource(schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"})
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, "authorities.keyward.dev", metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("waiting for authorities.keyward.dev to be Established: %v", err)
	}
	return dyn.Resource(kwv1alpha1.Resource)
}

func toUnstructured(t *testing.T, a *kwv1alpha1.Authority) *unstructured.Unstructured {
	t.Helper()
	a.TypeMeta = metav1.TypeMeta{APIVersion: kwv1alpha1.SchemeGroupVersion.String(), Kind: "Authority"}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(a)
	if err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

func fromUnstructured(t *testing.T, u *unstructured.Unstructured) *kwv1alpha1.Authority {
	t.Helper()
	var a kwv1alpha1.Authority
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &a); err != nil {
		t.Fatal(err)
	}
	return &a
}

// validAuthority is an Authority the apiserver accepts: an old generation
// Active and a new one Promoted.
func validAuthority(name string) *kwv1alpha1.Authority {
	return &kwv1alpha1.Authority{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: kwv1alpha1.AuthoritySpec{
			SignerName: "keyward.dev/" + name,
			Generations: []kwv1alpha1.Generation{
				{Name: "2026-05", KeyURI: "pkcs11:token=keyward;object=ca-2026-05?pin-source=file:/etc/keyward/pin", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseActive},
				{Name: "2026-11", KeyURI: "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1", CertificatePEM: testCACertPEM, ChainPEM: testIssuersPEM, Phase: kwv1alpha1.PhasePromoted},
			},
		},
	}
}

// wantInvalid fails the test unless err is the apiserver's Invalid error
// with a cause on field whose message contains msg.
func wantInvalid(t *testing.T, err error, field, msg string) {
	t.Helper()
	if err == nil {
		t.Fatalf("the apiserver accepted the object, want it refused on %s", field)
	}
	if !apierrors.IsInvalid(err) {
		t.Fatalf("got %v, want an Invalid error", err)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		t.Fatalf("error %v carries no details", err)
	}
	var seen []string
	for _, c := range status.Status().Details.Causes {
		if c.Field == field && strings.Contains(c.Message, msg) {
			return
		}
		seen = append(seen, fmt.Sprintf("%s: %s", c.Field, c.Message))
	}
	t.Fatalf("no cause on %s containing %q; causes:\n%s", field, msg, strings.Join(seen, "\n"))
}

// The shipped Authority CRD, served by the real apiserver, accepts a valid
// Authority and refuses what must never happen, with the field named.
func TestAuthorityCRD(t *testing.T) {
	ctx := testContext(t)
	authorities := installAuthorityCRD(t, ctx)

	t.Run("a valid Authority is accepted and reads back as written, defaults filled in", func(t *testing.T) {
		a := validAuthority("crd-valid")
		a.Spec.Generations = append(a.Spec.Generations, kwv1alpha1.Generation{Name: "2027-05", KeyURI: "awskms:key-id=abc", CertificatePEM: testCACertPEM})
		if _, err := authorities.Create(ctx, toUnstructured(t, a), metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating a valid Authority: %v", err)
		}
		got, err := authorities.Get(ctx, a.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want := a.Spec
		want.TrustBundleLabelDomain = "keyward.dev"
		want.Generations[2].Phase = kwv1alpha1.PhaseStaged
		want.Gates = kwv1alpha1.Gates{CanarySoak: &metav1.Duration{Duration: time.Hour}, PropagationWindow: &metav1.Duration{Duration: 5 * time.Minute}}
		if gotSpec := fromUnstructured(t, got).Spec; !apiequality.Semantic.DeepEqual(gotSpec, want) {
			t.Errorf("read back spec\n%+v\nwant\n%+v", gotSpec, want)
		}
	})

	refused := []struct {
		name   string
		mutate func(*kwv1alpha1.Authority)
		field  string
		msg    string
	}{
		{
			name:   "two generations Active are refused",
			mutate: func(a *kwv1alpha1.Authority) { a.Spec.Generations[1].Phase = kwv1alpha1.PhaseActive },
			field:  "spec.generations",
			msg:    "two generations active",
		},
		{
			name:   "two generations with the same name are refused",
			mutate: func(a *kwv1alpha1.Authority) { a.Spec.Generations[1].Name = a.Spec.Generations[0].Name },
			field:  "spec.generations[1]",
			msg:    "Duplicate value",
		},
		{
			name: "a key URI carrying a PIN, in any case, is refused",
			mutate: func(a *kwv1alpha1.Authority) {
				a.Spec.Generations[0].KeyURI = "pkcs11:token=keyward;object=ca?PIN-VALUE=1234"
			},
			field: "spec.generations[0].keyURI",
			msg:   "use pin-source=file:<path> or pin-source=env:<name>",
		},
		{
			name:   "a key URI carrying a password is refused",
			mutate: func(a *kwv1alpha1.Authority) { a.Spec.Generations[1].KeyURI = "pkcs11:token=keyward;password=x" },
			field:  "spec.generations[1].keyURI",
			msg:    "must not carry a pin-value or password",
		},
		{
			name:   "an unknown phase is refused",
			mutate: func(a *kwv1alpha1.Authority) { a.Spec.Generations[0].Phase = "Canary" },
			field:  "spec.generations[0].phase",
			msg:    "Unsupported value",
		},
		{
			name:   "a signer name without a path is refused",
			mutate: func(a *kwv1alpha1.Authority) { a.Spec.SignerName = "keyward.dev" },
			field:  "spec.signerName",
			msg:    "should match",
		},
		{
			name:   "a certificatePEM over 16 KiB is refused (docs/rotation.md)",
			mutate: func(a *kwv1alpha1.Authority) { a.Spec.Generations[0].CertificatePEM = strings.Repeat("A", 16<<10+1) },
			field:  "spec.generations[0].certificatePEM",
			msg:    "may not be more than 16384 bytes",
		},
		{
			name:   "more than eight generations are refused",
			mutate: addGenerations(9),
			field:  "spec.generations",
			msg:    "must have at most 8 items",
		},
	}
	for i, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			a := validAuthority(fmt.Sprintf("crd-refused-%d", i))
			tc.mutate(a)
			_, err := authorities.Create(ctx, toUnstructured(t, a), metav1.CreateOptions{})
			wantInvalid(t, err, tc.field, tc.msg)
		})
	}

	t.Run("changing the signer name is refused", func(t *testing.T) {
		created, err := authorities.Create(ctx, toUnstructured(t, validAuthority("crd-immutable")), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a := fromUnstructured(t, created)
		a.Spec.SignerName = "keyward.dev/another"
		_, err = authorities.Update(ctx, toUnstructured(t, a), metav1.UpdateOptions{})
		wantInvalid(t, err, "spec.signerName", "signerName is immutable")
	})

	t.Run("a generation is removed only after its phase is Retired", func(t *testing.T) {
		created, err := authorities.Create(ctx, toUnstructured(t, validAuthority("crd-remove")), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a := fromUnstructured(t, created)
		removed := a.DeepCopy()
		removed.Spec.Generations = removed.Spec.Generations[:1]
		_, err = authorities.Update(ctx, toUnstructured(t, removed), metav1.UpdateOptions{})
		wantInvalid(t, err, "spec.generations", "removed only after its phase is Retired")

		a.Spec.Generations[1].Phase = kwv1alpha1.PhaseRetired
		retired, err := authorities.Update(ctx, toUnstructured(t, a), metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		a = fromUnstructured(t, retired)
		a.Spec.Generations = a.Spec.Generations[:1]
		if _, err := authorities.Update(ctx, toUnstructured(t, a), metav1.UpdateOptions{}); err != nil {
			t.Fatalf("removing a Retired generation: %v", err)
		}
	})

	t.Run("status is written only through the status subresource", func(t *testing.T) {
		status := kwv1alpha1.AuthorityStatus{
			ObservedGeneration: 1,
			Generations: []kwv1alpha1.GenerationStatus{{
				Name:               "2026-05",
				Phase:              kwv1alpha1.PhaseActive,
				Since:              &metav1.Time{Time: time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC)},
				LastIssuedNotAfter: &metav1.Time{Time: time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)},
			}, {
				Name:        "2026-11",
				Phase:       kwv1alpha1.PhasePromoted,
				Since:       &metav1.Time{Time: time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)},
				Gate:        "propagation window",
				GateOpensAt: &metav1.Time{Time: time.Date(2026, 11, 23, 0, 5, 0, 0, time.UTC)},
			}},
			Conditions: []metav1.Condition{{
				Type: "Progressing", Status: metav1.ConditionTrue, Reason: "PropagationWindow",
				Message: "2026-11 waits for the propagation window", LastTransitionTime: metav1.NewTime(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)),
			}},
		}
		a := validAuthority("crd-status")
		a.Status = status
		created, err := authorities.Create(ctx, toUnstructured(t, a), metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := fromUnstructured(t, created).Status; !apiequality.Semantic.DeepEqual(got, kwv1alpha1.AuthorityStatus{}) {
			t.Errorf("create kept status %+v, want it dropped", got)
		}

		a = fromUnstructured(t, created)
		a.Status = status
		updated, err := authorities.Update(ctx, toUnstructured(t, a), metav1.UpdateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := fromUnstructured(t, updated).Status; !apiequality.Semantic.DeepEqual(got, kwv1alpha1.AuthorityStatus{}) {
			t.Errorf("an update of the main resource wrote status %+v, want it ignored", got)
		}

		a = fromUnstructured(t, updated)
		a.Status = status
		written, err := authorities.UpdateStatus(ctx, toUnstructured(t, a), metav1.UpdateOptions{})
		if err != nil {
			t.Fatalf("writing status through the subresource: %v", err)
		}
		got := fromUnstructured(t, written)
		if !apiequality.Semantic.DeepEqual(got.Status, status) {
			t.Errorf("status read back\n%+v\nwant\n%+v", got.Status, status)
		}
		if got.Generation != created.GetGeneration() {
			t.Errorf("metadata.generation went from %d to %d on status writes, want unchanged", created.GetGeneration(), got.Generation)
		}
	})
}

// addGenerations returns a mutation that gives an Authority n Staged
// generations.
func addGenerations(n int) func(*kwv1alpha1.Authority) {
	return func(a *kwv1alpha1.Authority) {
		a.Spec.Generations = nil
		for i := range n {
			a.Spec.Generations = append(a.Spec.Generations, kwv1alpha1.Generation{
				Name: fmt.Sprintf("g%d", i), KeyURI: "file:/ca.key", CertificatePEM: testCACertPEM, Phase: kwv1alpha1.PhaseStaged,
			})
		}
	}
}
