// Package respond turns the error of a call a server made to a dependency
// into the answer the server gives its own client: a status code, a
// Retry-After and a short body that names the condition.
//
// A handler whose call through guardrail.Do, a guardhttp client, a breaker,
// a bulkhead or a shedder failed answers with
//
//	respond.Error(w, err)
//
// or reads respond.Status(err) to write a body of its own. The package
// lives apart from the HTTP client (guardhttp) because it is a server's
// concern, and apart from the server-side middleware (shed, deadline)
// because it reads the errors of the root package, which they do not
// import.
package respond

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/shed"
)

// StatusClientClosedRequest is the status Status gives a call that ended
// because this server's own client went away (context.Canceled): 499, the
// code nginx logs for it. Nobody reads the answer; the code keeps the
// request out of the 5xx counts that say this server failed.
const StatusClientClosedRequest = 499

// ShedRetryAfter is the Retry-After Status gives a shed request, the one
// shed's middleware sends by default: the server was over capacity at that
// moment, and a second lets its queue drain.
const ShedRetryAfter = time.Second

// Status returns the status code a server should answer with when a call
// it made to a dependency (through guardrail.Do, a guardhttp client or a
// breaker, bulkhead or shedder of its own) failed with err, and the
// Retry-After to send with it (0: none). The first that matches wins:
//
//   - guardrail.ErrOutcomeUnknown: 502 Bad Gateway, no Retry-After. The
//     dependency's answer was lost after it may have acted, so this server
//     can say neither that the operation happened nor that it did not: the
//     failure is upstream's (a 5xx of the gateway class, not 500, which
//     says this server broke), 504 would invite the client to resend as
//     if nothing had happened, and no Retry-After because sending again is
//     safe only with the same Idempotency-Key.
//   - context.Canceled (this server's client went away):
//     StatusClientClosedRequest (499).
//   - guardrail.ErrCircuitOpen, breaker.ErrOpen: 503 Service Unavailable,
//     Retry-After the time to the breaker's next probe
//     (guardrail.Error.RetryIn, breaker.OpenError.RetryIn) when known.
//   - guardrail.ErrBulkheadFull, bulkhead.ErrFull: 503, no Retry-After.
//     Too many calls to the dependency are in flight from this process: an
//     overload of the moment, but nobody knows when a slot frees, so the
//     client's own backoff decides.
//   - shed.ErrShed: 503, Retry-After ShedRetryAfter.
//   - guardrail.ErrBudgetExhausted: 503, with Retry-After only when the
//     dependency sent one (guardrail.Error.RetryIn). Retries ran out of
//     budget because the dependency fails for many callers: it is
//     unavailable, and retrying at once adds to the load the budget is
//     there to cap.
//   - guardrail.ErrDeadline, context.DeadlineExceeded (which every
//     guardhttp.TimeoutError also is): 504 Gateway Timeout: the dependency
//     did not answer within the time the request had.
//   - any other error from the network (a net.Error or *url.Error, such as
//     connection refused after the retries): 502 Bad Gateway.
//   - anything else: 500 Internal Server Error.
//
// A nil err returns 200 and 0.
func Status(err error) (status int, retryAfter time.Duration) {
	var ge *guardrail.Error
	retryIn := time.Duration(0)
	if errors.As(err, &ge) {
		retryIn = ge.RetryIn
	}
	var oe *breaker.OpenError
	switch {
	case err == nil:
		return http.StatusOK, 0
	case errors.Is(err, guardrail.ErrOutcomeUnknown):
		return http.StatusBadGateway, 0
	case errors.Is(err, context.Canceled):
		return StatusClientClosedRequest, 0
	case errors.Is(err, guardrail.ErrCircuitOpen):
		return http.StatusServiceUnavailable, retryIn
	case errors.As(err, &oe):
		return http.StatusServiceUnavailable, oe.RetryIn()
	case errors.Is(err, breaker.ErrOpen):
		return http.StatusServiceUnavailable, 0
	case errors.Is(err, guardrail.ErrBulkheadFull), errors.Is(err, bulkhead.ErrFull):
		return http.StatusServiceUnavailable, 0
	case errors.Is(err, shed.ErrShed):
		return http.StatusServiceUnavailable, ShedRetryAfter
	case errors.Is(err, guardrail.ErrBudgetExhausted):
		return http.StatusServiceUnavailable, retryIn
	case errors.Is(err, guardrail.ErrDeadline), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, 0
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) {
		return http.StatusBadGateway, 0
	}
	return http.StatusInternalServerError, 0
}

// Error answers w as Status(err) says: the status, a Retry-After header in
// whole seconds (rounded up) when there is one, and a one-line plain-text
// body naming the condition ("outcome unknown", "circuit open"), never
// err's message, which may describe internal hosts. Call it before
// anything else is written to w.
func Error(w http.ResponseWriter, err error) {
	status, ra := Status(err)
	h := w.Header()
	if ra > 0 {
		h.Set("Retry-After", strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10))
	}
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(condition(err, status) + "\n"))
}

// condition names what went wrong, for Error's body.
func condition(err error, status int) string {
	switch {
	case errors.Is(err, guardrail.ErrOutcomeUnknown):
		return "outcome unknown: the operation may or may not have taken effect"
	case errors.Is(err, guardrail.ErrCircuitOpen), errors.Is(err, breaker.ErrOpen):
		return "circuit open"
	case errors.Is(err, guardrail.ErrBulkheadFull), errors.Is(err, bulkhead.ErrFull):
		return "bulkhead full"
	case errors.Is(err, shed.ErrShed):
		return "overloaded: request shed"
	case errors.Is(err, guardrail.ErrBudgetExhausted):
		return "dependency unavailable: retry budget exhausted"
	}
	if status == StatusClientClosedRequest {
		return "client closed request"
	}
	return http.StatusText(status)
}
