package agent

import (
	"crypto/x509"
	"time"
)

// Renewal window: like kubelet's certificate manager, a certificate is
// renewed at a random point between 70 % and 90 % of its lifetime, so that
// the nodes of a cluster do not all ask at once.
const (
	renewFrom  = 0.7
	renewUntil = 0.9
)

// renewAt is when leaf should be renewed: NotBefore plus a fraction of its
// lifetime drawn from [renewFrom, renewUntil) by rnd, which returns values in
// [0, 1).
func renewAt(leaf *x509.Certificate, rnd func() float64) time.Time {
	lifetime := leaf.NotAfter.Sub(leaf.NotBefore)
	fraction := renewFrom + (renewUntil-renewFrom)*rnd()
	return leaf.NotBefore.Add(time.Duration(float64(lifetime) * fraction))
}

// backoff is exponential backoff with jitter: the n-th consecutive failure
// waits a random time in [d/2, d] with d = min(initial·2ⁿ, max).
type backoff struct {
	initial, max time.Duration
	rnd          func() float64
	failures     int
}

// next returns the wait after one more failure.
func (b *backoff) next() time.Duration {
	d := b.initial
	for i := 0; i < b.failures && d < b.max; i++ {
		d *= 2
	}
	d = min(d, b.max)
	b.failures++
	return d/2 + time.Duration(float64(d/2)*b.rnd())
}

// reset starts again from initial after a success.
func (b *backoff) reset() { b.failures = 0 }
