package guardrail

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/chain"
)

// Verdict is what a classifier says about one failed attempt: a plain
// value, safe to copy and to share between goroutines.
type Verdict struct {
	// Outcome is what the breaker records: Failure for errors that say the
	// dependency is unhealthy (timeouts, connection failures, 5xx, 429),
	// Ignored for errors that say the request was wrong (4xx-like) or that the
	// caller gave up.
	Outcome breaker.Outcome
	// Retryable reports a transient failure: another attempt may succeed.
	// Do retries it only if the operation is idempotent or Unsent is set.
	Retryable bool
	// Unsent reports that the request never reached the dependency (the
	// connection was refused, DNS failed), so repeating it is safe even for an
	// operation that is not idempotent.
	Unsent bool
	// Timeout reports that the attempt timed out after the request may have
	// reached the dependency. For an operation that is not idempotent the
	// outcome is unknown and Do ends with ErrOutcomeUnknown.
	Timeout bool
	// Unanswered reports that the attempt got no answer after the request
	// may have reached the dependency (a connection reset, a lost
	// response), without a timeout: as for Timeout, the outcome of an
	// operation that is not idempotent is unknown.
	Unanswered bool
	// RetryAfter is the server's hint of when to retry (Retry-After), or 0.
	// When set it replaces the backoff delay; it is never shortened.
	RetryAfter time.Duration
	// InFlight reports that the dependency is still running an earlier
	// attempt of this same call under the same idempotency key, and said
	// when to come back (an HTTP 409 with Retry-After, a gRPC ABORTED with
	// a pushback, from guardrail's idempotency servers): the call is
	// retried, with its key, after RetryAfter, while attempts, the
	// deadline, MaxRetryAfter and the budget allow, when it is idempotent;
	// otherwise the answer is final. The answer says nothing against the
	// dependency's health or load: the breaker ignores it, whatever
	// Outcome says, and it is no overload. Set it only for a call that
	// carried a key: without one, the answer is someone else's.
	InFlight bool
	// Retried reports that the answer said the server behind had already
	// retried (or was refused for budget, an open breaker or the throttle)
	// before it gave up: it carried chain.HeaderRetried or its gRPC twin.
	// Do does not retry it, whatever Retryable says: retrying here would
	// multiply the load on a failing chain. When the call ends with it,
	// the request being served is marked so that its own error answer
	// carries the marker on to the tier above (see package chain). The
	// breaker records Outcome as for any answer.
	Retried bool
}

// Classifier decides what an attempt's non-nil error means. It must be safe
// for concurrent use. Do handles the caller's own cancellation before asking
// the classifier.
type Classifier func(err error) Verdict

// markedError carries a caller's verdict on an error.
type markedError struct {
	err     error
	verdict Verdict
}

func (e *markedError) Error() string { return e.err.Error() }
func (e *markedError) Unwrap() error { return e.err }

// Permanent marks err as the request's own fault (a validation error, a
// 4xx-like answer): DefaultClassify never retries it and the breaker ignores
// it. A nil err stays nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err, Verdict{Outcome: breaker.Ignored}}
}

// Transient marks err as a failure of the dependency that another attempt
// may cure. It counts against the breaker. A nil err stays nil.
func Transient(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err, Verdict{Outcome: breaker.Failure, Retryable: true}}
}

// RetryAfterError marks err as transient with the server's hint d of when to
// retry (an HTTP Retry-After): Do waits exactly d, or gives up when d does
// not fit in the time left or exceeds Policy.MaxRetryAfter. A nil err stays nil.
func RetryAfterError(err error, d time.Duration) error {
	if err == nil {
		return nil
	}
	return &markedError{err, Verdict{Outcome: breaker.Failure, Retryable: true, RetryAfter: max(d, 0)}}
}

// Unsent marks err as a failure that happened before the request left (the
// connection was refused): retrying it is safe for any operation. A nil err
// stays nil.
func Unsent(err error) error {
	if err == nil {
		return nil
	}
	return &markedError{err, Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true}}
}

// WithVerdict marks err with an explicit verdict, for classifications the
// helpers above do not cover. A nil err stays nil.
func WithVerdict(err error, v Verdict) error {
	if err == nil {
		return nil
	}
	return &markedError{err, v}
}

// DefaultClassify is the classifier Do uses when a Policy names none:
//
//   - an error marked with Permanent, Transient, RetryAfterError, Unsent or
//     WithVerdict: that verdict;
//   - context.Canceled: ignored, not retried (someone gave up);
//   - connection refused, DNS failures and other dial errors: failure,
//     retryable, unsent;
//   - timeouts (context.DeadlineExceeded, os.ErrDeadlineExceeded, a net.Error
//     whose Timeout is true): failure, retryable, timeout;
//   - connection reset, broken pipe, unexpected EOF: failure, retryable,
//     unanswered;
//   - anything else: failure, retryable. Whether it is retried still
//     depends on Policy.Idempotent, which is false unless set.
//
// It allocates nothing for the errors of the standard library and those
// wrapped with fmt.Errorf or errors.Join: it runs on every failed attempt,
// and failed attempts are the hot path during an outage.
func DefaultClassify(err error) Verdict {
	if m, ok := as[*markedError](err); ok {
		return m.verdict
	}
	return classifyPlain(err)
}

// as is errors.As for a target of type T, without the allocation errors.As
// costs (its target escapes): it walks err's tree in the same order, and
// hands a subtree to errors.As only at an error with an As method, whose
// target it must pass.
func as[T error](err error) (T, bool) {
	var zero T
	for err != nil {
		if t, ok := err.(T); ok {
			return t, true
		}
		if _, ok := err.(interface{ As(any) bool }); ok {
			var t T
			if errors.As(err, &t) {
				return t, true
			}
			return zero, false
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if t, ok := as[T](e); ok {
					return t, true
				}
			}
			return zero, false
		default:
			return zero, false
		}
	}
	return zero, false
}

func classifyPlain(err error) Verdict {
	switch {
	case errors.Is(err, context.Canceled):
		return Verdict{Outcome: breaker.Ignored}
	case errors.Is(err, syscall.ECONNREFUSED):
		return Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true}
	}
	if dnsErr, ok := as[*net.DNSError](err); ok {
		return Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true, Timeout: dnsErr.IsTimeout}
	}
	if opErr, ok := as[*net.OpError](err); ok && opErr.Op == "dial" {
		return Verdict{Outcome: breaker.Failure, Retryable: true, Unsent: true, Timeout: opErr.Timeout()}
	}
	timeout, lost := failureOf(err)
	return Verdict{Outcome: breaker.Failure, Retryable: true, Timeout: timeout, Unanswered: lost}
}

func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return true
	}
	ne, ok := as[net.Error](err)
	return ok && ne.Timeout()
}

// failureOf walks err's tree once and reports whether it holds a timeout
// (context.DeadlineExceeded, os.ErrDeadlineExceeded, a net.Error whose
// Timeout is true) and whether it holds a connection that failed under a
// request that may have been received (a reset, a broken pipe, an
// unexpected EOF). Where errors.Is and errors.As would walk it once per
// target; a subtree with an Is or As method of its own is left to them.
func failureOf(err error) (timeout, lost bool) {
	for err != nil {
		switch err {
		case context.DeadlineExceeded, os.ErrDeadlineExceeded:
			return true, false
		case syscall.ECONNRESET, syscall.EPIPE, io.ErrUnexpectedEOF:
			return false, true
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return true, false
		}
		_, is := err.(interface{ Is(error) bool })
		_, as := err.(interface{ As(any) bool })
		if is || as {
			if isTimeout(err) {
				return true, false
			}
			return false, errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF)
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if t, l := failureOf(e); t || l {
					return t, l
				}
			}
			return false, false
		default:
			return false, false
		}
	}
	return false, false
}

// Marked returns v with what an answer's chain markers say, whatever the
// classifier said, for the client transports (guardhttp, guardgrpc): an
// answer marked already retried is not retried (Retried), one marked not
// processed is safe to retry for any operation (Unsent), since its
// handler never ran.
func (v Verdict) Marked(m chain.Marks) Verdict {
	v.Retried = v.Retried || m.Retried
	v.Unsent = v.Unsent || m.NotProcessed
	return v
}
