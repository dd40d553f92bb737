package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"

	"github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	vfield "k8s.io/apimachinery/pkg/util/validation/field"
)

// A created key is destroyed only when the generation was provably not
// written: a refusal by ca init's own checks or a 4xx refusal by the
// apiserver. A timeout, a throttle, a 5xx, a dropped connection or the
// deadline may still land, so the key is kept.
func TestNotWrittenOnlyForRefusals(t *testing.T) {
	gr := v1alpha1.Resource.GroupResource()
	wrap := func(err error) error { return fmt.Errorf("adding generation g1 to Authority a: %w", err) }
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"an admission refusal (422)", apierrors.NewInvalid(v1alpha1.SchemeGroupVersion.WithKind("Authority").GroupKind(), "a", vfield.ErrorList{vfield.Forbidden(vfield.NewPath("spec"), "frozen")}), true},
		{"forbidden (403)", apierrors.NewForbidden(gr, "a", errors.New("no")), true},
		{"a conflict left after the retries (409)", apierrors.NewConflict(gr, "a", errors.New("changed")), true},
		{"ca init's own check", refusedLocally{errors.New("Authority a already has a generation g1")}, true},
		{"a server timeout (504)", apierrors.NewTimeoutError("slow etcd", 1), false},
		{"a request timeout (408)", apierrors.NewGenericServerResponse(408, "PUT", gr, "a", "", 0, false), false},
		{"throttled (429)", apierrors.NewTooManyRequests("later", 1), false},
		{"an internal error (500)", apierrors.NewInternalError(errors.New("etcd")), false},
		{"the deadline", context.DeadlineExceeded, false},
		{"a dropped connection", &net.OpError{Op: "read", Err: errors.New("connection reset by peer")}, false},
	} {
		if got := notWritten(wrap(c.err)); got != c.want {
			t.Errorf("%s: notWritten = %v, want %v", c.name, got, c.want)
		}
	}
}

// The PKCS#11 module --key-uri names is allowed, in the URI's path part
// or its query, on top of the given modules or SoftHSM2's defaults.
func TestCAAllowsTheKeyURIsModule(t *testing.T) {
	for _, c := range []struct {
		name, uri string
		given     []string
		want      string
	}{
		{"query", "pkcs11:token=t;object=o?module-path=/opt/hsm/lib/v.so&pin-source=file:/p", nil, "/opt/hsm/lib/v.so"},
		{"path part", "pkcs11:token=t;object=o;module-path=/opt/hsm/lib/w.so?pin-source=file:/p", nil, "/opt/hsm/lib/w.so"},
		{"added to the given ones", "pkcs11:token=t;object=o?module-path=/opt/x.so", []string{"/opt/y.so"}, "/opt/x.so"},
	} {
		o := caOptions{keyURI: c.uri, backends: backendFlags{modules: slices.Clone(c.given)}}
		o.allowKeyURIModule()
		if !slices.Contains(o.backends.modules, c.want) {
			t.Errorf("%s: allowed %v, want %s among them", c.name, o.backends.modules, c.want)
		}
		for _, g := range c.given {
			if !slices.Contains(o.backends.modules, g) {
				t.Errorf("%s: lost the given module %s", c.name, g)
			}
		}
	}
	o := caOptions{keyURI: "gcpkms:projects/p/locations/l/keyRings/r/cryptoKeys/k/cryptoKeyVersions/1"}
	if o.allowKeyURIModule(); len(o.backends.modules) != 0 {
		t.Errorf("a KMS URI allowed modules %v", o.backends.modules)
	}
}
