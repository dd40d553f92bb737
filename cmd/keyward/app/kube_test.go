package app

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	"k8s.io/client-go/rest"
)

// An apiserver without the Authority CRD answers 404 to every request for
// the resource; the commands say the CRD is missing instead of "no
// Authority" or a bare "could not find the requested resource".
func TestFindAuthorityNamesAMissingCRD(t *testing.T) {
	served := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/apis/keyward.dev/v1alpha1/authorities" {
			_, _ = w.Write([]byte(`{"apiVersion":"keyward.dev/v1alpha1","kind":"AuthorityList","metadata":{},"items":[]}`))
			return
		}
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"apiVersion":"v1","kind":"Status","status":"Failure","reason":"NotFound","code":404,"message":"authorities.keyward.dev \"demo\" not found","details":{"name":"demo","group":"keyward.dev","kind":"authorities"}}`))
	}
	notServed := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte("404 page not found\n"))
	}
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		ref     string
		want    error
	}{
		{"a signer name on a cluster without the CRD names the CRD", notServed, "example.com/workload", ErrNoAuthorityCRD},
		{"an Authority name on a cluster without the CRD names the CRD", notServed, "demo", ErrNoAuthorityCRD},
		{"an Authority name that does not exist is no Authority", served, "demo", ErrNoAuthority},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			ac, err := authclient.New(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			_, err = findAuthority(context.Background(), ac, tc.ref)
			if !errors.Is(err, tc.want) {
				t.Fatalf("findAuthority(%q) = %v, want %v", tc.ref, err, tc.want)
			}
			if tc.want == ErrNoAuthorityCRD && errors.Is(err, ErrNoAuthority) {
				t.Errorf("a missing CRD also reads as a missing Authority: %v", err)
			}
		})
	}
}
