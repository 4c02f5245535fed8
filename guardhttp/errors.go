package guardhttp

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// ErrTimeout is the sentinel every *TimeoutError Is: one phase of one
// attempt ran out of time.
var ErrTimeout = errors.New("guardhttp: timeout")

// TimeoutError says which phase of an attempt ran out of time and against
// which dependency. It is what the Transport recorded when its own limit
// ran out, before it cancelled the attempt, never read from the error the
// base transport returned. Connect and TLS timeouts point at the network (the
// request was not sent); write, response-header and body timeouts point at
// a slow server, and for a request that is not idempotent they
// leave its outcome unknown.
//
// It Is ErrTimeout and, like the timeouts of http.Client, also
// context.DeadlineExceeded, so code that tests for a deadline keeps working;
// use errors.As to tell a phase timeout from the caller's own deadline,
// which surfaces as context.DeadlineExceeded itself. Timeout reports true,
// as for net.Error.
//
// A TimeoutError is not modified after it is returned and is safe for
// concurrent use.
type TimeoutError struct {
	// Phase is one of event.PhaseConnect, PhaseTLS, PhaseWrite,
	// PhaseResponseHeader, PhaseBodyIdle, or PhaseAttempt when
	// Config.AttemptTimeout expired first.
	Phase string
	// Dependency is the request's dependency label: Config.Name, or its
	// key (the URL's host by default).
	Dependency string
	// After is the configured limit that expired.
	After time.Duration

	notSent bool // the request had not left: retrying it is safe
}

// Error describes the phase, the limit and the dependency.
func (e *TimeoutError) Error() string {
	return fmt.Sprintf("guardhttp: %s timeout after %v (%s)", e.Phase, e.After, e.Dependency)
}

// Timeout reports true.
func (e *TimeoutError) Timeout() bool { return true }

// Is reports whether target is ErrTimeout or context.DeadlineExceeded.
func (e *TimeoutError) Is(target error) bool {
	return target == ErrTimeout || target == context.DeadlineExceeded
}

// unsent reports that the request had not left when the attempt timed out.
func (e *TimeoutError) unsent() bool { return e.notSent }

// StatusError is how a response that is not a success reaches the retry
// engine: an attempt that got it fails with a StatusError, which Observer
// events carry. It never reaches the caller of RoundTrip, who gets the
// response itself.
//
// A StatusError is safe for concurrent use.
type StatusError struct {
	// StatusCode is the response's status code.
	StatusCode int

	resp *http.Response // the response, returned to the caller if it is the last
}

// Error returns the status, such as "guardhttp: status 503 Service Unavailable".
func (e *StatusError) Error() string {
	return fmt.Sprintf("guardhttp: status %d %s", e.StatusCode, http.StatusText(e.StatusCode))
}

// IdempotencyKeyError is the error of a request that failed after the
// Transport gave it an Idempotency-Key (Config.IdempotencyKeys). Key is
// that key: to send the same intent again later, set it on the new
// request's Idempotency-Key header, and a server that deduplicates by key
// answers with the outcome of the first instead of running it twice.
// errors.As finds it through the *url.Error of http.Client; it unwraps to
// the request's error, so errors.Is(err, guardrail.ErrOutcomeUnknown) and
// the others still hold.
//
// A key generated per request dies with the process that made it: for an
// intent the caller may send again later (after a restart, from a queue),
// derive the key from a business ID (the order's ID, say) and set the
// header yourself; the Transport then keeps it.
//
// An IdempotencyKeyError is not modified after it is returned and is safe
// for concurrent use.
type IdempotencyKeyError struct {
	// Key is the Idempotency-Key every attempt of the request carried.
	Key string
	// Err is the request's error.
	Err error
}

// Error returns Err's message and the key.
func (e *IdempotencyKeyError) Error() string {
	return e.Err.Error() + " (Idempotency-Key " + e.Key + ")"
}

// Unwrap returns Err.
func (e *IdempotencyKeyError) Unwrap() error { return e.Err }
