package guardgrpc

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/chain"
)

// Result is what one failed attempt left behind, for a Classifier. It is a
// plain value, safe to copy; its Trailer is shared and must not be
// modified.
type Result struct {
	// Method is the full method name, "/package.Service/Method".
	Method string
	// Err is the attempt's error, not nil.
	Err error
	// Trailer is the trailer metadata the server sent, nil when none (a
	// stream that failed before it opened has none).
	Trailer metadata.MD
	// Sent reports that the attempt may have reached the server: it got a
	// transport stream. False means grpc-go never picked a connection for
	// it (no address was ready, the balancer dropped it), so repeating it
	// is safe even for a method that is not idempotent. grpc-go retries an
	// attempt that got a stream the server never processed by itself, once
	// (its transparent retry), even with its own retries disabled.
	Sent bool
}

// Classifier decides what a failed attempt means. It must be safe for
// concurrent use. The caller's own cancellation and deadline are handled
// before it is asked, and whether a retryable verdict is retried also
// depends on the method being idempotent (see ClientConfig). Whether an
// answer says the server is overloaded, which pauses hedging and is not
// an accept for the throttle, is read from its code and trailer whatever
// the Classifier says (RESOURCE_EXHAUSTED, a grpc-retry-pushback-ms
// trailer), and from a verdict with a RetryAfter.
type Classifier func(r Result) guardrail.Verdict

// DefaultClassify is the Classifier used when ClientConfig.Classify is nil.
// By status code:
//
//   - UNAVAILABLE: failure, retryable; unsent when the attempt got no
//     transport stream; the server's pushback is honoured, and a negative
//     or malformed one means not retryable. Sent without a pushback, it
//     may be an answer lost after the server ran the call (grpc-go
//     reports a reset connection so): for a method that is not
//     idempotent the outcome is unknown (guardrail.ErrOutcomeUnknown),
//     unless the server marked it not processed (chain.MDNotProcessed).
//   - RESOURCE_EXHAUSTED: failure; retryable only when the server sent a
//     valid pushback (it said when to come back): the overload is then the
//     server's, not a quota of ours.
//   - DEADLINE_EXCEEDED: failure, retryable, timeout: for a method that is
//     not idempotent the outcome is unknown (guardrail.ErrOutcomeUnknown);
//     an idempotent one is retried while time is left.
//   - INTERNAL, UNKNOWN, DATA_LOSS: failure, not retryable (the server may
//     have acted; a bug does not go away on retry).
//   - CANCELLED (from the server), INVALID_ARGUMENT, NOT_FOUND,
//     ALREADY_EXISTS, PERMISSION_DENIED, UNAUTHENTICATED,
//     FAILED_PRECONDITION, ABORTED, OUT_OF_RANGE, UNIMPLEMENTED: ignored by
//     the breaker (the call was wrong, not the server), never retried.
//   - an error that is not a gRPC status (from another interceptor):
//     guardrail.DefaultClassify.
func DefaultClassify(r Result) guardrail.Verdict {
	st, ok := status.FromError(r.Err)
	if !ok {
		return guardrail.DefaultClassify(r.Err)
	}
	switch st.Code() {
	case codes.Unavailable:
		d, present, retry := pushback(r.Trailer)
		// Sent, and no pushback: the transport may have lost the answer
		// after the server ran the call (a reset, a closed connection), and
		// grpc-go reports that as UNAVAILABLE too.
		lost := r.Sent && !present
		return guardrail.Verdict{Outcome: breaker.Failure, Retryable: retry, Unsent: !r.Sent, Unanswered: lost, RetryAfter: d}
	case codes.ResourceExhausted:
		d, present, retry := pushback(r.Trailer)
		return guardrail.Verdict{Outcome: breaker.Failure, Retryable: present && retry, RetryAfter: d}
	case codes.DeadlineExceeded:
		return guardrail.Verdict{Outcome: breaker.Failure, Retryable: true, Timeout: true}
	case codes.Internal, codes.Unknown, codes.DataLoss:
		return guardrail.Verdict{Outcome: breaker.Failure}
	}
	return guardrail.Verdict{Outcome: breaker.Ignored}
}

// attemptError carries a failed attempt's verdict through the engine to
// the Policy's classifier, which reads it back, and whether the answer
// said the server is overloaded, which the engine reads through its
// Overload method (guardrail.Overloader) to pause hedging and to count
// the answer as not accepted by the throttle. It never reaches the
// caller: the interceptor unwraps it.
type attemptError struct {
	err      error
	v        guardrail.Verdict
	overload bool
	hedge    *hedgeAttempt // the attempt of a hedged call that failed; nil otherwise
}

func (e *attemptError) Error() string  { return e.err.Error() }
func (e *attemptError) Unwrap() error  { return e.err }
func (e *attemptError) Overload() bool { return e.overload }

// failedAttempt classifies a failed attempt for the engine.
func (c *Client) failedAttempt(r Result) *attemptError {
	ae := &attemptError{err: r.Err, v: c.classify(r), overload: overloaded(r)}
	ae.v = ae.v.Marked(chain.MarksOf(r.Trailer[chain.MDRetried], r.Trailer[chain.MDNotProcessed]))
	return ae
}

// overloaded reports whether a failed attempt's answer says the server is
// overloaded: RESOURCE_EXHAUSTED, with or without a pushback, or any
// answer with a grpc-retry-pushback-ms trailer (UNAVAILABLE with a
// pushback is how a guardgrpc server sheds). It is the gRPC form of
// guardhttp's 429 and 503. UNAVAILABLE alone is not: grpc-go answers it
// for a connection refused or reset too, which says nothing of load. The
// engine also treats a verdict with a RetryAfter as overload, whatever
// the Classifier.
func overloaded(r Result) bool {
	if len(r.Trailer[MDPushback]) > 0 {
		return true
	}
	return status.Code(r.Err) == codes.ResourceExhausted
}

// classifyMarked is the classifier of the Policies the client builds.
func classifyMarked(err error) guardrail.Verdict {
	var ae *attemptError
	if errors.As(err, &ae) {
		return ae.v
	}
	return guardrail.DefaultClassify(err)
}

// Error is the error a client interceptor returns when the engine gave up
// early (the breaker was open, the deadline too close, the budget empty,
// the bulkhead full, the throttle refused, or the outcome is unknown). It
// unwraps to the *guardrail.Error, so errors.Is(err,
// guardrail.ErrCircuitOpen) holds, and it carries a gRPC status, so
// status.Code works and a server that returns it answers with a
// meaningful code: the last attempt's code when an attempt got one, else
// UNAVAILABLE for an open breaker, RESOURCE_EXHAUSTED for a full bulkhead,
// DEADLINE_EXCEEDED for a deadline too close or an unknown outcome. A call the throttle rejected (guardrail.ErrThrottled)
// is RESOURCE_EXHAUSTED, whatever an earlier attempt got: the code of
// overload, which guardgrpc clients upstream do not retry without a
// pushback and count as overload in their own throttles, where
// UNAVAILABLE would be retried. An Error is immutable and safe for
// concurrent use.
type Error struct {
	err *guardrail.Error
	st  *status.Status
}

// Error returns the engine's message.
func (e *Error) Error() string { return e.err.Error() }

// Unwrap returns the *guardrail.Error.
func (e *Error) Unwrap() error { return e.err }

// GRPCStatus returns the status the error maps to.
func (e *Error) GRPCStatus() *status.Status { return e.st }

// finish turns what DoCall returned into what the interceptor returns: the
// attempt's own error unwrapped, or an *Error with a status.
func finish(err error) error {
	if err == nil {
		return nil
	}
	var ae *attemptError
	if a, ok := err.(*attemptError); ok {
		return a.err
	}
	var ge *guardrail.Error
	if !errors.As(err, &ge) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return status.FromContextError(err).Err()
		}
		return err
	}
	if errors.As(ge.Err, &ae) {
		// The verdict was for the engine: the caller gets the attempt's
		// error, in a copy, as the engine's error is never edited.
		unmarked := *ge
		unmarked.Err = ae.err
		ge = &unmarked
	}
	if errors.Is(ge, guardrail.ErrThrottled) {
		// Whatever an earlier attempt got: the call ends because the
		// client refused to add load, which the callers of a server that
		// passes it on must read as overload too, not as a failure to
		// retry (UNAVAILABLE).
		return &Error{err: ge, st: status.New(codes.ResourceExhausted, "rejected by client-side throttling, not sent: the server has lately refused too many calls: "+ge.Error())}
	}
	code := codes.Unavailable
	if st, ok := status.FromError(ge.Err); ok && ge.Err != nil && st.Code() != codes.Unknown {
		code = st.Code()
	} else {
		switch {
		case errors.Is(ge, guardrail.ErrBulkheadFull):
			code = codes.ResourceExhausted
		case errors.Is(ge, guardrail.ErrDeadline), errors.Is(ge, guardrail.ErrOutcomeUnknown):
			code = codes.DeadlineExceeded
		}
	}
	return &Error{err: ge, st: status.New(code, ge.Error())}
}
