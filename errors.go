package guardrail

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Errors returned by Do wrap one of these and the last cause,
// so errors.Is works for both; errors.As to *Error gives the details.
var (
	// ErrCircuitOpen: the breaker refused the call without running it.
	ErrCircuitOpen = errors.New("guardrail: circuit open")
	// ErrBudgetExhausted: a retryable failure was not retried because the retry
	// budget had no token left, or because another attempt would take the
	// request being served past its chain's amplification cap (package
	// chain).
	ErrBudgetExhausted = errors.New("guardrail: retry budget exhausted")
	// ErrDeadline: the time left on the context was too short for another
	// attempt (or the next retry's delay would not fit).
	ErrDeadline = errors.New("guardrail: deadline too close for another attempt")
	// ErrBulkheadFull: the bulkhead had no free slot within the allowed wait.
	ErrBulkheadFull = errors.New("guardrail: bulkhead full")
	// ErrOutcomeUnknown: the last attempt of an operation that is not
	// idempotent timed out or lost its connection after it may have reached
	// the dependency; it may or may not have taken effect, so it was not
	// retried. Query the state before trying again, or make the operation
	// idempotent (an idempotency key). A call made IdempotentWithKey is
	// retried instead, and ends with ErrOutcomeUnknown around whatever else
	// ended it when its last attempt was lost so: send it again with the
	// same key to learn the outcome.
	ErrOutcomeUnknown = errors.New("guardrail: outcome unknown")
)

// Error is the error Do returns when it gives up. It Is its Kind sentinel
// (ErrDeadline, ErrCircuitOpen, ...) and unwraps to the last attempt's error.
// Exhausted retries of an ordinary failure return the last error itself,
// unwrapped, so callers see the dependency's error as they would without
// guardrail. Do never changes an Error after returning it: it is safe to
// read from any goroutine.
type Error struct {
	// Kind is one of the sentinel errors of this package.
	Kind error
	// Attempts is the number of attempts made (0 when none ran).
	Attempts int
	// RetryIn is how long the caller should wait before trying again, when
	// known: time until the breaker's next probe, or the server's Retry-After.
	RetryIn time.Duration
	// Err is the last attempt's error, or the rejecting component's error
	// (the breaker's, the bulkhead's) when no attempt ran. May be nil.
	Err error
}

// Error describes the failure, its attempt count and its cause.
func (e *Error) Error() string {
	msg := e.Kind.Error()
	if e.Attempts > 0 {
		msg = fmt.Sprintf("%s after %d attempt(s)", msg, e.Attempts)
	}
	if e.RetryIn > 0 {
		msg = fmt.Sprintf("%s (retry in %v)", msg, e.RetryIn)
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports whether target is e's Kind.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap returns the last cause.
func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the last cause was a timeout, so code that asks
// net.Error-style (url.Error.Timeout) still sees a timed-out attempt behind
// ErrOutcomeUnknown or ErrDeadline.
func (e *Error) Timeout() bool { return e.Err != nil && isTimeout(e.Err) }
