package backends

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// RetryPolicy bounds the retries of one call to a remote backend (Cloud
// KMS, AWS KMS). The zero value gives the defaults.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included
	// (default 5; 1 turns retries off).
	MaxAttempts int
	// BaseBackoff is the wait before the first retry (default 100ms). Each
	// later wait doubles, up to MaxBackoff; each is drawn uniformly from
	// the upper half of that value.
	BaseBackoff time.Duration
	// MaxBackoff caps the wait between two attempts (default 5s, or
	// BaseBackoff if that is longer).
	MaxBackoff time.Duration
}

// Defaults of RetryPolicy.
const (
	DefaultMaxAttempts = 5
	DefaultBaseBackoff = 100 * time.Millisecond
	DefaultMaxBackoff  = 5 * time.Second
)

// WithDefaults checks p and fills in its unset fields. A value that cannot
// work is an *OptionError naming the field ("Retry.MaxBackoff").
func (p RetryPolicy) WithDefaults() (RetryPolicy, error) {
	switch {
	case p.MaxAttempts < 0:
		return p, &OptionError{Option: "Retry.MaxAttempts", Reason: fmt.Sprintf("%d is negative", p.MaxAttempts)}
	case p.BaseBackoff < 0:
		return p, &OptionError{Option: "Retry.BaseBackoff", Reason: fmt.Sprintf("%v is negative", p.BaseBackoff)}
	case p.MaxBackoff < 0:
		return p, &OptionError{Option: "Retry.MaxBackoff", Reason: fmt.Sprintf("%v is negative", p.MaxBackoff)}
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.BaseBackoff == 0 {
		p.BaseBackoff = DefaultBaseBackoff
	}
	if p.MaxBackoff == 0 {
		p.MaxBackoff = max(DefaultMaxBackoff, p.BaseBackoff)
	}
	if p.MaxBackoff < p.BaseBackoff {
		return p, &OptionError{Option: "Retry.MaxBackoff", Reason: fmt.Sprintf("%v is shorter than BaseBackoff (%v)", p.MaxBackoff, p.BaseBackoff)}
	}
	return p, nil
}

// Backoff is the wait after attempt n (1-based) of a policy WithDefaults
// returned: BaseBackoff doubled n-1 times, at most MaxBackoff, then drawn
// uniformly from its upper half. The doubling cannot overflow.
func (p RetryPolicy) Backoff(n int) time.Duration {
	d, ceiling := p.BaseBackoff, p.MaxBackoff
	for i := 1; i < n && d < ceiling; i++ {
		if d > ceiling/2 {
			d = ceiling
			break
		}
		d *= 2
	}
	d = min(d, ceiling)
	half := d / 2
	return half + rand.N(d-half+1)
}
