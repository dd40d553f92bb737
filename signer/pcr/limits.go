package pcr

import (
	"sync"
	"time"

	"github.com/keyward/keyward/signer/config"
	"golang.org/x/time/rate"
)

// limiters are token buckets per node and per namespace.
type limiters struct {
	perNode, perNamespace *config.Rate
	mu                    sync.Mutex
	nodes, namespaces     map[string]*rate.Limiter
}

func newLimiters(perNode, perNamespace *config.Rate) *limiters {
	return &limiters{perNode: perNode, perNamespace: perNamespace,
		nodes: map[string]*rate.Limiter{}, namespaces: map[string]*rate.Limiter{}}
}

// reserve takes a token from both buckets if both have one now; otherwise it
// takes none and returns how long until they would.
func (l *limiters) reserve(node, namespace string, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var rs []*rate.Reservation
	if l.perNode != nil {
		rs = append(rs, bucket(l.nodes, node, l.perNode, now).ReserveN(now, 1))
	}
	if l.perNamespace != nil {
		rs = append(rs, bucket(l.namespaces, namespace, l.perNamespace, now).ReserveN(now, 1))
	}
	var wait time.Duration
	for _, r := range rs {
		wait = max(wait, r.DelayFrom(now))
	}
	if wait > 0 {
		for _, r := range rs {
			r.CancelAt(now)
		}
	}
	return wait
}

// maxBuckets bounds each bucket map: beyond it, buckets that are full again
// (their node or namespace has been quiet) are dropped; a new bucket starts
// full, so dropping one changes nothing for its key.
const maxBuckets = 4096

func bucket(m map[string]*rate.Limiter, key string, r *config.Rate, now time.Time) *rate.Limiter {
	l, ok := m[key]
	if !ok {
		if len(m) >= maxBuckets {
			for k, old := range m {
				if old.TokensAt(now) >= float64(old.Burst()) {
					delete(m, k)
				}
			}
		}
		l = rate.NewLimiter(rate.Limit(r.QPS), r.Burst)
		m[key] = l
	}
	return l
}
