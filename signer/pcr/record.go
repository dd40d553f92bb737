package pcr

import (
	"crypto/x509"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// requestRecord is what the controller remembers of one request (by UID) between
// syncs. It lives from the request's first sight until the informer shows
// it terminal or deleted.
type requestRecord struct {
	firstSeen time.Time
	// admitted: the request passed the rate limits; retries take no new
	// token.
	admitted bool
	// cert was signed and not yet written; a retry writes it again rather
	// than signing anew.
	cert *issuedCert
	// written: a terminal status was written (or found). Until the
	// informer shows it, nothing is signed for this UID again.
	written bool
	// lastDelayedEvent coalesces SigningDelayed Events.
	lastDelayedEvent time.Time
	// decided is a Denied or Failed status keyward decided and could not
	// write yet: later passes write only it, never sign.
	decided *decision
}

// decision is a terminal condition keyward decided on.
type decision struct {
	typ, reason, message string
}

type issuedCert struct {
	leaf  *x509.Certificate
	chain string
	// key is the CA key's version id that signed it.
	key string
	// signedAt is when keyward signed it, by its own clock.
	signedAt time.Time
}

// records are the controller's per-request records. Safe for concurrent
// use; a record is only changed under the lock, through update.
type records struct {
	mu sync.Mutex
	m  map[types.UID]*requestRecord
}

func newRecords() *records { return &records{m: map[types.UID]*requestRecord{}} }

// get returns a copy of uid's record, creating it (first seen now) if
// missing. Only the informer's handlers (enqueue) create records.
func (rs *records) get(uid types.UID, now time.Time) requestRecord {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[uid]
	if !ok {
		r = &requestRecord{firstSeen: now}
		rs.m[uid] = r
	}
	return *r
}

// lookup returns a copy of uid's record, if it has one.
func (rs *records) lookup(uid types.UID) (requestRecord, bool) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r, ok := rs.m[uid]
	if !ok {
		return requestRecord{}, false
	}
	return *r, true
}

// update changes uid's record under the lock, if it still has one: a
// record the informer's terminal or delete event dropped is not brought
// back (only get, from enqueue and sync, creates records).
func (rs *records) update(uid types.UID, f func(*requestRecord)) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if r, ok := rs.m[uid]; ok {
		f(r)
	}
}

// markWritten records that uid's terminal status is written: nothing is
// signed for it again.
func (rs *records) markWritten(uid types.UID) {
	rs.update(uid, func(r *requestRecord) { r.written, r.cert = true, nil })
}

// drop forgets uid. Once the last record is gone the map is made anew:
// a Go map keeps the buckets of its largest size, 2 MiB after a burst of
// 10 000 requests.
func (rs *records) drop(uid types.UID) {
	rs.mu.Lock()
	delete(rs.m, uid)
	if len(rs.m) == 0 {
		rs.m = map[types.UID]*requestRecord{}
	}
	rs.mu.Unlock()
}

// pending counts requests seen and not yet written: waiting in the queue,
// for a retry, for a rate-limit token or for a permission.
func (rs *records) pending() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	n := 0
	for _, r := range rs.m {
		if !r.written {
			n++
		}
	}
	return n
}

func (rs *records) len() int {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return len(rs.m)
}
