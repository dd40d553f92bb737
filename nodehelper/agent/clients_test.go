package agent

import (
	"crypto/x509"
	"testing"
	"time"

	"github.com/keyward/keyward/nodehelper/certstore"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"
)

type closable struct {
	kubernetes.Interface
	closed int
}

func (c *closable) CloseIdleConnections() { c.closed++ }

// A replaced identity client has its idle connections closed at the next
// rotation (its watches have moved to the new client by then), not at once.
func TestReplacedIdentityClientsAreClosedOneRotationLater(t *testing.T) {
	var built []*closable
	clk := testingclock.NewFakeClock(start)
	s, err := newClientSource(clk, &rest.Config{Host: "https://127.0.0.1:1"}, true, func(*rest.Config) (kubernetes.Interface, error) {
		c := &closable{Interface: fake.NewClientset()}
		built = append(built, c)
		return c, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pair := &certstore.Pair{Chain: []*x509.Certificate{{NotAfter: start.Add(time.Hour)}}}
	for range 3 {
		if err := s.setIdentity(pair); err != nil {
			t.Fatal(err)
		}
	}
	// built: bootstrap, identity 1, 2, 3.
	if got := [4]int{built[0].closed, built[1].closed, built[2].closed, built[3].closed}; got != [4]int{0, 1, 0, 0} {
		t.Errorf("closed counts (bootstrap, id1, id2, id3) = %v, want [0 1 0 0]", got)
	}
	if c, _ := s.current(); c != built[3] {
		t.Error("the current client is not the newest identity's")
	}
}

// The identity client talks to the bootstrap kubeconfig's server, trusts
// its CA (file or inline) and server name, and authenticates with the
// pair only: the bootstrap token is not carried over (KEP-266).
func TestTheIdentityClientKeepsTheBootstrapServerAndCA(t *testing.T) {
	var last *rest.Config
	base := &rest.Config{Host: "https://10.0.0.1:6443", BearerToken: "abcdef.0123456789abcdef",
		TLSClientConfig: rest.TLSClientConfig{CAData: []byte("ca"), CAFile: "/etc/ca.crt", ServerName: "api.internal"}}
	s, err := newClientSource(testingclock.NewFakeClock(start), base, true, func(c *rest.Config) (kubernetes.Interface, error) {
		last = c
		return fake.NewClientset(), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	pair := &certstore.Pair{KeyPEM: []byte("key"), ChainPEM: []byte("chain"), Chain: []*x509.Certificate{{NotAfter: start.Add(time.Hour)}}}
	if err := s.setIdentity(pair); err != nil {
		t.Fatal(err)
	}
	if last.Host != base.Host || string(last.CAData) != "ca" || last.CAFile != "/etc/ca.crt" || last.ServerName != "api.internal" {
		t.Errorf("identity client: host %s, CA %q %s, server name %s", last.Host, last.CAData, last.CAFile, last.ServerName)
	}
	if last.BearerToken != "" || string(last.CertData) != "chain" || string(last.KeyData) != "key" {
		t.Errorf("identity client credentials: token %q, cert %q, key %q", last.BearerToken, last.CertData, last.KeyData)
	}
}
