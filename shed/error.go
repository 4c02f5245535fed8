package shed

import (
	"context"
	"errors"

	"github.com/guardrail-go/guardrail/event"
)

// ErrShed is the sentinel of every shed request: the server refused it to
// protect itself, before doing any of its work.
var ErrShed = errors.New("shed: request shed")

// Error is the error Acquire returns when it sheds a request. It Is
// ErrShed and unwraps to its cause (the context's error when the
// caller had already given up, otherwise nil).
//
// The Shedder returns shared, preallocated values so that a rejection
// allocates nothing: compare with errors.Is or read the fields, but never
// modify an Error. Being immutable, an Error is safe for concurrent use.
type Error struct {
	// Reason says why: event.ReasonCapacity, event.ReasonRetryRatio,
	// event.ReasonQueueTime, event.ReasonQueueFull or event.ReasonExpired.
	Reason string
	// Priority is the request's priority.
	Priority Priority
	// Err is the cause, or nil.
	Err error

	msg string
}

// Error returns "shed: request shed: <reason> (priority <p>)".
func (e *Error) Error() string {
	if e.msg != "" {
		return e.msg
	}
	return ErrShed.Error() + ": " + e.Reason + " (priority " + e.Priority.String() + ")"
}

// Is reports whether target is ErrShed.
func (e *Error) Is(target error) bool { return target == ErrShed }

// Unwrap returns the cause, or nil.
func (e *Error) Unwrap() error { return e.Err }

// The reasons, as indexes into the counters and the error table.
type reason uint8

const (
	reasonCapacity reason = iota
	reasonRetry
	reasonQueueTime
	reasonQueueFull
	reasonCanceled // ReasonExpired, cause context.Canceled
	reasonDeadline // ReasonExpired, cause context.DeadlineExceeded
	reasonCohort   // ReasonCohort: below the admission level
	numReasons
)

var reasonNames = [numReasons]string{
	reasonCapacity:  event.ReasonCapacity,
	reasonRetry:     event.ReasonRetryRatio,
	reasonQueueTime: event.ReasonQueueTime,
	reasonQueueFull: event.ReasonQueueFull,
	reasonCanceled:  event.ReasonExpired,
	reasonDeadline:  event.ReasonExpired,
	reasonCohort:    event.ReasonCohort,
}

// errTable holds one immutable *Error per reason and priority, built once.
var errTable = func() (t [numReasons][numPriorities]*Error) {
	for r := range numReasons {
		for p := range Priority(numPriorities) {
			e := &Error{Reason: reasonNames[r], Priority: p.normalize()}
			switch r {
			case reasonCanceled:
				e.Err = context.Canceled
			case reasonDeadline:
				e.Err = context.DeadlineExceeded
			}
			e.msg = e.Error()
			t[r][p] = e
		}
	}
	return t
}()

// expiredReason maps a context error to its reason.
func expiredReason(err error) reason {
	if err == context.DeadlineExceeded {
		return reasonDeadline
	}
	return reasonCanceled
}
