package gcpkms

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/kms/apiv1/kmspb"
	"github.com/googleapis/gax-go/v2"
	"github.com/keyward/keyward/backends"
	"github.com/keyward/keyward/internal/crc32c"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// noClientRetry turns off the client library's own retries (UNAVAILABLE and
// DEADLINE_EXCEEDED, up to 60s), so that the Provider's policy is the only
// one and the attempts it counts are the attempts made.
func noClientRetry() gax.CallOption { return gax.WithRetry(nil) }

// call says what an operation is doing, for errors.
type call struct {
	op   string // "open", "sign", "create-key"
	uri  string
	part string // the URI part NOT_FOUND and FAILED_PRECONDITION blame
}

// attempt makes one RPC under actx. It returns nil, or an error built by
// failed or invalid and whether another attempt may succeed.
type attempt func(actx context.Context) (retry bool, err error)

// retry runs fn until it succeeds, fails for good, has been tried
// maxAttempts times, or ctx ends. Each attempt gets CallTimeout within ctx;
// between attempts it waits a jittered, doubling backoff. When ctx ends
// first, the error wraps ctx.Err(); when the next wait would outlast ctx's
// deadline, it returns the last error at once.
func (p *Provider) retry(ctx context.Context, c call, maxAttempts int, fn attempt) error {
	for n := 1; ; n++ {
		actx, cancel := context.WithTimeout(ctx, p.opts.CallTimeout)
		again, err := fn(actx)
		cancel()
		if err == nil || !again || n >= maxAttempts {
			return err
		}
		wait := p.opts.Retry.Backoff(n)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return err
		}
		if werr := sleep(ctx, wait); werr != nil {
			// %v: the result is about ctx; the last attempt's error is context.
			return backends.Wrap(backends.ErrTransient, c.op, c.uri, "", fmt.Errorf("waiting to retry: %w (last attempt: %v)", werr, err))
		}
	}
}

// sleep waits d or until ctx ends, and then returns ctx.Err().
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// failed classifies the error of RPC method made under actx within ctx:
//
//   - ctx ended: transient, not retried, wraps ctx.Err();
//   - the attempt's CallTimeout ran out: transient, retried, wraps
//     context.DeadlineExceeded;
//   - RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ABORTED:
//     transient, retried;
//   - CANCELLED, UNKNOWN: transient, not retried;
//   - NOT_FOUND: ErrNotFound; every other code: ErrPermanent.
func (p *Provider) failed(ctx, actx context.Context, c call, method string, err error) (retry bool, _ error) {
	if cerr := ctx.Err(); cerr != nil {
		return false, backends.Wrap(backends.ErrTransient, c.op, c.uri, "", fmt.Errorf("calling %s: %w", method, cerr))
	}
	if status.Code(err) == codes.DeadlineExceeded && timedOut(actx) {
		return true, backends.Wrap(backends.ErrTransient, c.op, c.uri, "", fmt.Errorf("calling %s: no answer within the %v call timeout: %w", method, p.opts.CallTimeout, context.DeadlineExceeded))
	}
	wrapped := fmt.Errorf("calling %s: %w", method, err)
	switch code := status.Code(err); code {
	case codes.ResourceExhausted, codes.Unavailable, codes.DeadlineExceeded, codes.Internal, codes.Aborted:
		return true, backends.Wrap(backends.ErrTransient, c.op, c.uri, "", wrapped)
	case codes.Canceled, codes.Unknown:
		return false, backends.Wrap(backends.ErrTransient, c.op, c.uri, "", wrapped)
	case codes.NotFound:
		return false, backends.Wrap(backends.ErrNotFound, c.op, c.uri, c.part, wrapped)
	case codes.FailedPrecondition:
		return false, backends.Wrap(backends.ErrPermanent, c.op, c.uri, c.part, wrapped)
	default: // PERMISSION_DENIED, UNAUTHENTICATED, INVALID_ARGUMENT, …
		return false, backends.Wrap(backends.ErrPermanent, c.op, c.uri, "", wrapped)
	}
}

// checksumAttempts bounds the calls made for one request that Cloud KMS
// refuses because what it received does not match the request's CRC32C:
// the API asks for "a limited number of retries", since a mismatch that
// persists points at the client's checksum, not at the network.
const checksumAttempts = 3

// isChecksumRefusal reports whether err is Cloud KMS refusing a request
// because a field did not match its CRC32C: INVALID_ARGUMENT with a
// message such as "The checksum in field digest_crc32c did not match the
// data in field digest." Any other INVALID_ARGUMENT is permanent.
func isChecksumRefusal(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.InvalidArgument {
		return false
	}
	msg := strings.ToLower(st.Message())
	return strings.Contains(msg, "checksum") && strings.Contains(msg, "crc32c")
}

// checksumRefusal classifies the refused-checksum error of AsymmetricSign
// request req, the nth such refusal: retried, as the API asks, when the
// request's CRC32C is right (so the data was corrupted on the way) and fewer
// than checksumAttempts calls were refused; permanent once it persists or
// when the request's own checksum is wrong.
func (p *Provider) checksumRefusal(ctx, actx context.Context, c call, method string, err error, req *kmspb.AsymmetricSignRequest, n int) (retry bool, _ error) {
	if cerr := ctx.Err(); cerr != nil {
		return p.failed(ctx, actx, c, method, err)
	}
	if !requestChecksumsMatch(req) {
		return false, backends.Wrap(backends.ErrPermanent, c.op, c.uri, "", fmt.Errorf("calling %s: the request's own CRC32C is wrong: %w", method, err))
	}
	wrapped := fmt.Errorf("calling %s: the service received data that does not match its CRC32C (%d of at most %d calls): %w", method, n, checksumAttempts, err)
	return n < checksumAttempts, backends.Wrap(backends.ErrPermanent, c.op, c.uri, "", wrapped)
}

// requestChecksumsMatch checks the CRC32C fields of req against its data.
func requestChecksumsMatch(req *kmspb.AsymmetricSignRequest) bool {
	if c := req.GetDataCrc32C(); c != nil && c.GetValue() != crc32c.Checksum(req.GetData()) {
		return false
	}
	if c := req.GetDigestCrc32C(); c != nil {
		d := req.GetDigest()
		var b []byte
		switch {
		case d.GetSha256() != nil:
			b = d.GetSha256()
		case d.GetSha384() != nil:
			b = d.GetSha384()
		default:
			b = d.GetSha512()
		}
		return c.GetValue() == crc32c.Checksum(b)
	}
	return true
}

// invalid is a response that failed an integrity check (checksum, name):
// transient and retried, since the next answer may be sound.
func invalid(c call, method, format string, args ...any) (retry bool, _ error) {
	return true, backends.Errorf(backends.ErrTransient, c.op, c.uri, "", "checking %s response: %s", method, fmt.Sprintf(format, args...))
}

// deadlineSlack is how close to its deadline an attempt that failed with
// DEADLINE_EXCEEDED counts as timed out. The server enforces the deadline
// the client sent (grpc-timeout) with its own clock, and the client's
// context is cancelled by a timer that may run late on a busy machine, so
// the error can arrive a moment before actx.Err() is set.
const deadlineSlack = 5 * time.Millisecond

// timedOut reports whether the attempt under actx ran out of its time.
func timedOut(actx context.Context) bool {
	if errors.Is(actx.Err(), context.DeadlineExceeded) {
		return true
	}
	deadline, ok := actx.Deadline()
	return ok && time.Until(deadline) < deadlineSlack
}
