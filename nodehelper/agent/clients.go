package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/keyward/keyward/nodehelper/certstore"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// clientSource hands out the client each part of the agent talks to the
// apiserver with. Without bootstrap that is one client from the
// configuration's kubeconfig. With bootstrap it is the node identity (the
// bootstrap kubeconfig's server and CA, the identity pair as client
// certificate), rebuilt after each identity rotation, or the bootstrap
// kubeconfig itself while no valid identity exists.
type clientSource struct {
	clock     clock.Clock
	newClient func(*rest.Config) (kubernetes.Interface, error)
	bootstrap bool
	base      kubernetes.Interface // the kubeconfig's, or the bootstrap kubeconfig's
	baseCfg   *rest.Config

	mu       sync.Mutex
	identity kubernetes.Interface // nil until an identity pair is known
	notAfter time.Time            // the identity leaf's
	changed  chan struct{}        // closed (and replaced) when identity changes
	retired  []kubernetes.Interface
}

// idleCloser is a client whose idle connections can be closed; a replaced
// identity's client is, so that connections authenticated with an old
// certificate do not linger.
type idleCloser interface{ CloseIdleConnections() }

func newClientSource(clk clock.Clock, baseCfg *rest.Config, bootstrap bool, newClient func(*rest.Config) (kubernetes.Interface, error)) (*clientSource, error) {
	base, err := newClient(baseCfg)
	if err != nil {
		return nil, fmt.Errorf("building a client: %w", err)
	}
	return &clientSource{clock: clk, newClient: newClient, bootstrap: bootstrap, base: base, baseCfg: baseCfg, changed: make(chan struct{})}, nil
}

// setIdentity builds the identity client from pair (a new identity or the
// one found at start) and tells the waiters.
func (s *clientSource) setIdentity(pair *certstore.Pair) error {
	cfg := rest.AnonymousClientConfig(s.baseCfg)
	cfg.CertData, cfg.KeyData = pair.ChainPEM, pair.KeyPEM
	c, err := s.newClient(cfg)
	if err != nil {
		return fmt.Errorf("building a client with the node identity: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	// Clients replaced earlier have had a rotation's time to finish their
	// requests (trust projections restart on the change below); the one
	// replaced now may still carry watches, so it waits for the next.
	for _, old := range s.retired {
		if closer, ok := old.(idleCloser); ok {
			closer.CloseIdleConnections()
		}
	}
	s.retired = s.retired[:0]
	if s.identity != nil {
		s.retired = append(s.retired, s.identity)
	}
	s.identity, s.notAfter = c, pair.Chain[0].NotAfter
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

// forIdentity is the client that renews the identity itself: the identity
// while it is valid, else the bootstrap kubeconfig's (KEP-266).
func (s *clientSource) forIdentity() kubernetes.Interface {
	if c, _ := s.current(); c != nil {
		return c
	}
	return s.base
}

// current returns the client for everything but the identity's own
// renewal, or nil while bootstrap has no valid identity yet, and a channel
// closed at the next identity change.
func (s *clientSource) current() (kubernetes.Interface, <-chan struct{}) {
	c, changed, _ := s.currentUntil()
	return c, changed
}

// currentUntil is current and when the client returned stops being valid:
// the identity's notAfter (zero without bootstrap).
func (s *clientSource) currentUntil() (kubernetes.Interface, <-chan struct{}, time.Time) {
	if !s.bootstrap {
		return s.base, nil, time.Time{}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.identity == nil || !s.clock.Now().Before(s.notAfter) {
		return nil, s.changed, time.Time{}
	}
	return s.identity, s.changed, s.notAfter
}

// wait returns the client for a credential, waiting for a valid node
// identity with bootstrap. It returns nil only when ctx ended.
func (s *clientSource) wait(ctx context.Context) kubernetes.Interface {
	for {
		c, changed := s.current()
		if c != nil {
			return c
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}
