package softhsmtests

import (
	"os"
	"strings"
	"sync"
	"testing"

	authclient "github.com/keyward/keyward/kubeclient/authority/client"
	kwv1alpha1 "github.com/keyward/keyward/kubeclient/authority/v1alpha1"
	"github.com/keyward/keyward/testsupport/controlplane"
)

// testGeneration is the generation signerConfig makes Active.
const testGeneration = "g1"

var (
	authoritiesOnce   sync.Mutex
	authoritiesClient *authclient.Client
)

// authorities installs the shipped Authority CRD once per run and returns
// an admin client for Authority objects.
func authorities(t testing.TB) *authclient.Client {
	t.Helper()
	authoritiesOnce.Lock()
	defer authoritiesOnce.Unlock()
	if authoritiesClient == nil {
		c, err := controlplane.InstallAuthorityCRD(testContext(t), cp.AdminConfig())
		if err != nil {
			t.Fatal(err)
		}
		authoritiesClient = c
	}
	return authoritiesClient
}

// authorityName is the Authority object tests make for a signer name.
func authorityName(signerName string) string {
	return strings.ReplaceAll(signerName, "/", ".")
}

// activeAuthority creates the Authority of signerName with one generation,
// testGeneration, from keyURI and the certificate in caFile, desired
// Active and observed Active (applied as the trust publisher would).
func activeAuthority(t testing.TB, signerName, keyURI, caFile string) *kwv1alpha1.Authority {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	a, err := controlplane.ActiveAuthority(testContext(t), authorities(t), cp.AdminClient(), authorityName(signerName), signerName, testGeneration, keyURI, string(pem))
	if err != nil {
		t.Fatal(err)
	}
	return a
}
