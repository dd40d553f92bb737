package awskms

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
	"github.com/keyward/keyward/backends"
)

// transientCode reports whether a KMS error code is worth retrying: the
// request was refused for rate (ThrottlingException), or the service or a
// key store behind it failed or timed out. KeyUnavailableException is here
// deliberately: AWS documents it as "the key was not available; you can
// retry".
func transientCode(code string) bool {
	switch code {
	case "ThrottlingException", "KMSInternalException", "KeyUnavailableException",
		"DependencyTimeoutException", "ServiceUnavailableException", "InternalFailure",
		"RequestTimeoutException":
		return true
	}
	return false
}

// retryableStatus are the HTTP statuses retried whatever the body says
// (the SDK's own set: 500, 502, 503, 504).
func retryableStatus(status int) bool {
	switch status {
	case 500, 502, 503, 504:
		return true
	}
	return false
}

// newRetryer is the SDK standard retryer with the Provider's attempts and
// backoff, retrying — whatever the SDK's defaults — the codes of
// transientCode, 500/502/503/504, attempts that ran out of CallTimeout, and
// (by the SDK's defaults) connection errors. Its retry-token bucket is the
// SDK's: 500 tokens per client (that is, per region), 5 per retry, 10 per
// retry after a timeout, 1 back per success; once it is empty, failures are
// returned at once instead of retried, which keeps a fleet of signers from
// storming a throttling service. Successful calls (the benchmark's) never
// draw on it.
func (p *Provider) newRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		p.standardOptions(o)
		o.Retryables = append([]retry.IsErrorRetryable{retry.IsErrorRetryableFunc(retryable)}, o.Retryables...)
	})
}

// newCreateRetryer retries only ThrottlingException: a refused request made
// nothing, but CreateKey failing otherwise (5xx, a timeout, a lost
// connection) may have made a key, and a retry would make a second.
func (p *Provider) newCreateRetryer() aws.Retryer {
	return retry.NewStandard(func(o *retry.StandardOptions) {
		p.standardOptions(o)
		o.Retryables = []retry.IsErrorRetryable{
			retry.NoRetryCanceledError{},
			retry.RetryableErrorCode{Codes: map[string]struct{}{"ThrottlingException": {}}},
		}
	})
}

func (p *Provider) standardOptions(o *retry.StandardOptions) {
	o.MaxAttempts = p.opts.Retry.MaxAttempts
	o.MaxBackoff = p.opts.Retry.MaxBackoff
	o.Backoff = backoff{policy: p.opts.Retry}
}

// retryable says yes to the errors newRetryer must retry and leaves the
// rest to the SDK's checks.
func retryable(err error) aws.Ternary {
	var te *attemptTimeoutError
	if errors.As(err, &te) {
		return aws.TrueTernary
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && transientCode(apiErr.ErrorCode()) {
		return aws.TrueTernary
	}
	if retryableStatus(httpStatus(err)) {
		return aws.TrueTernary
	}
	return aws.UnknownTernary
}

// backoff is the wait after failed attempt n (1-based): base doubled n-1
// times, at most max, then drawn uniformly from its upper half.
// backoff is the policy's jittered exponential backoff as the SDK's
// BackoffDelayer.
type backoff struct{ policy backends.RetryPolicy }

func (b backoff) BackoffDelay(attempt int, _ error) (time.Duration, error) {
	return b.policy.Backoff(attempt), nil
}

// attemptTimeout gives each attempt of an operation — each HTTP request,
// credential retrieval and signing included — at most d, within the
// caller's context. It sits inside the SDK's retry loop, so an attempt that
// runs out of time is retried like a lost connection.
type attemptTimeout struct{ d time.Duration }

func (attemptTimeout) ID() string { return "keyward.AttemptTimeout" }

func (m attemptTimeout) HandleFinalize(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (
	middleware.FinalizeOutput, middleware.Metadata, error,
) {
	actx, cancel := context.WithTimeout(ctx, m.d)
	defer cancel()
	out, md, err := next.HandleFinalize(actx, in)
	if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
		err = &attemptTimeoutError{timeout: m.d, err: err}
	}
	return out, md, err
}

// addAttemptTimeout puts attemptTimeout right inside the SDK's "Retry"
// middleware.
func addAttemptTimeout(d time.Duration) func(*middleware.Stack) error {
	return func(s *middleware.Stack) error {
		return s.Finalize.Insert(attemptTimeout{d: d}, "Retry", middleware.After)
	}
}

// attemptTimeoutError is an attempt that ran out of CallTimeout while the
// caller's context was live. It matches context.DeadlineExceeded.
type attemptTimeoutError struct {
	timeout time.Duration
	err     error
}

func (e *attemptTimeoutError) Error() string {
	return fmt.Sprintf("no answer within the %v call timeout: %v", e.timeout, e.err)
}

func (e *attemptTimeoutError) Unwrap() []error { return []error{context.DeadlineExceeded, e.err} }

// Timeout tells the SDK's retryer this was a timeout.
func (e *attemptTimeoutError) Timeout() bool { return true }

// call says what an SDK call was for, for errors.
type call struct {
	op     string // "open", "sign", "create-key"
	uri    string
	action string // the KMS action: "Sign", "DescribeKey", …
}

// failed turns the error of an SDK call (after the SDK's retries) into a
// backends error:
//
//   - the caller's context ended: ErrTransient wrapping ctx.Err();
//   - the last attempt ran out of CallTimeout: ErrTransient wrapping
//     context.DeadlineExceeded;
//   - NotFoundException: ErrNotFound, blaming key-id;
//   - the codes of transientCode, and any 5xx: ErrTransient;
//   - ExpiredTokenException: ErrTransient, not retried at once — the
//     credential cache fetches fresh credentials for a later call;
//   - DisabledException, KMSInvalidStateException (disabled, pending
//     deletion or import, …): ErrPermanent, blaming key-id — the key must
//     be enabled by someone;
//   - InvalidKeyUsageException, UnsupportedOperationException:
//     ErrUnsupportedAlgorithm, blaming signing-algorithm for Sign and
//     key-id otherwise;
//   - InvalidArnException: ErrInvalidURI, blaming key-id;
//   - AccessDeniedException and every other 4xx (authentication,
//     validation, LimitExceededException): ErrPermanent — they need a
//     policy, a credential or a quota changed;
//   - errors without an answer: lost connections and credential sources
//     that failed to answer are ErrTransient, invalid parameters
//     ErrPermanent.
func (p *Provider) failed(ctx context.Context, c call, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return backends.Wrap(backends.ErrTransient, c.op, c.uri, "", fmt.Errorf("calling KMS %s: %w", c.action, cerr))
	}
	wrapped := fmt.Errorf("calling KMS %s: %w", c.action, err)
	var te *attemptTimeoutError
	if errors.As(err, &te) {
		return backends.Wrap(backends.ErrTransient, c.op, c.uri, "", wrapped)
	}
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code := apiErr.ErrorCode()
		switch {
		case code == "NotFoundException":
			return backends.Wrap(backends.ErrNotFound, c.op, c.uri, attrKeyID, wrapped)
		case transientCode(code) || code == "ExpiredTokenException":
			return backends.Wrap(backends.ErrTransient, c.op, c.uri, "", wrapped)
		case code == "DisabledException" || code == "KMSInvalidStateException":
			return backends.Wrap(backends.ErrPermanent, c.op, c.uri, attrKeyID, wrapped)
		case code == "InvalidKeyUsageException" || code == "UnsupportedOperationException":
			part := attrKeyID
			if c.action == "Sign" {
				part = attrSigning
			}
			return backends.Wrap(backends.ErrUnsupportedAlgorithm, c.op, c.uri, part, wrapped)
		case code == "InvalidArnException":
			return backends.Wrap(backends.ErrInvalidURI, c.op, c.uri, attrKeyID, wrapped)
		}
	}
	if status := httpStatus(err); status >= 500 {
		return backends.Wrap(backends.ErrTransient, c.op, c.uri, "", wrapped)
	} else if status != 0 {
		return backends.Wrap(backends.ErrPermanent, c.op, c.uri, "", wrapped)
	}
	var invalid smithy.InvalidParamsError
	if errors.As(err, &invalid) {
		return backends.Wrap(backends.ErrPermanent, c.op, c.uri, "", wrapped)
	}
	return backends.Wrap(backends.ErrTransient, c.op, c.uri, "", wrapped)
}

// httpStatus is the HTTP status of the answer err came from, or 0.
func httpStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}
