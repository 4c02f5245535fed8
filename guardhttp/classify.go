package guardhttp

import (
	"errors"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
)

// Classifier decides what one attempt's result means: exactly one of resp
// and err is non-nil. A response whose verdict has Outcome breaker.Success
// is a success; any other verdict makes the attempt a failure that the
// retry engine may retry, and the caller still receives the response if it
// is the last one. Whether a retryable verdict is retried also depends on
// the request: see Transport. A Classifier must be safe for concurrent use
// and must not read or close resp.Body.
type Classifier func(resp *http.Response, err error) guardrail.Verdict

// DefaultClassify is the Classifier used when Config.Classify is nil.
//
// Responses:
//   - 1xx, 2xx, 3xx: success.
//   - 502, 503, 504: failure, retryable; a 503's Retry-After is honoured.
//   - 429: failure; retryable only when it carries a valid Retry-After, as
//     the server then said when to come back (a 429 is retried on
//     the server's schedule, never on our own).
//   - 500: failure, retryable. The retry engine retries it only for an
//     idempotent request, since a 500 may come after the side effect ran.
//   - other 5xx: failure, not retryable.
//   - other 4xx: ignored by the breaker (the request was wrong, not the
//     dependency), not retryable.
//
// Errors:
//   - a connect or TLS *TimeoutError: failure, retryable, unsent (safe to
//     retry for any method), timeout;
//   - any other *TimeoutError: failure, retryable, timeout: for a request
//     that is not idempotent the outcome is unknown;
//   - anything else: guardrail.DefaultClassify (connection refused and DNS
//     failures are unsent, resets are retryable, cancellation is ignored).
func DefaultClassify(resp *http.Response, err error) guardrail.Verdict {
	if err != nil {
		var te *TimeoutError
		if errors.As(err, &te) {
			return guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Timeout: true, Unsent: te.unsent()}
		}
		return guardrail.DefaultClassify(err)
	}
	code := resp.StatusCode
	switch {
	case code < 400:
		return guardrail.Verdict{Outcome: breaker.Success}
	case code == http.StatusTooManyRequests:
		d, ok := retryAfter(resp)
		return guardrail.Verdict{Outcome: breaker.Failure, Retryable: ok, RetryAfter: d}
	case code == http.StatusServiceUnavailable:
		d, _ := retryAfter(resp)
		return guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, RetryAfter: d}
	case code == http.StatusBadGateway, code == http.StatusGatewayTimeout, code == http.StatusInternalServerError:
		return guardrail.Verdict{Outcome: breaker.Failure, Retryable: true}
	case code >= 500:
		return guardrail.Verdict{Outcome: breaker.Failure}
	}
	return guardrail.Verdict{Outcome: breaker.Ignored}
}

// retryAfter reads the response's Retry-After (RFC 9110: seconds or an
// HTTP-date). Garbage, negative and fractional values are ignored.
func retryAfter(resp *http.Response) (time.Duration, bool) {
	return backoff.ParseRetryAfterValues(resp.Header.Values("Retry-After"), time.Now())
}

// idempotent reports whether repeating req is harmless: its method is
// idempotent in RFC 9110 terms, or it carries an idempotency key (the
// X-Idempotency-Key spelling too, as net/http's own transport accepts).
func idempotent(req *http.Request) bool {
	return idempotentMethod(req.Method) || hasKey(req.Header)
}

// idempotentMethod reports whether RFC 9110 makes method idempotent.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodPut, http.MethodDelete, http.MethodTrace:
		return true
	}
	return false
}

func hasKey(h http.Header) bool {
	return h.Get(headerIdempotencyKey) != "" || h.Get("X-Idempotency-Key") != ""
}

// headerIdempotencyKey is the header that makes a POST or PATCH safe to
// retry: idempotency.HeaderKey, which the server's middleware reads.
const headerIdempotencyKey = "Idempotency-Key"

// netHTTPResends reports whether net/http's Transport may send r again by
// itself after a reused connection failed before any answer, as its
// documentation says: an idempotent method, or an idempotency key.
func netHTTPResends(r *http.Request) bool {
	switch r.Method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return hasKey(r.Header)
}

// inFlight turns the verdict v on resp, a 409 answering the request r
// that carried an idempotency key, into the engine's verdict for "the same
// key is still being processed" (guardrail.Verdict.InFlight) when the
// server said when to come back (Retry-After), as idempotency.Server
// does: the request is retried with its key after that delay. A 409 to a
// request without a key, or without a valid Retry-After, is left as v
// says: final.
func inFlight(r *http.Request, resp *http.Response, v *guardrail.Verdict) {
	if !hasKey(r.Header) {
		return
	}
	d, ok := retryAfter(resp)
	if !ok {
		return
	}
	*v = guardrail.Verdict{Outcome: breaker.Ignored, InFlight: true, RetryAfter: d}
}
