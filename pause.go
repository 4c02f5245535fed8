package guardrail

import (
	"errors"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// ErrPaused is the cause of the ErrCircuitOpen Do returns when the
// Policy's Pauses paused the dependency: a process of the fleet, maybe
// this one, was asked to leave it alone for a while.
var ErrPaused = errors.New("guardrail: dependency paused by a fleet hint")

// Pauser shares the pauses dependencies ask for between the calls of a
// process and the processes of a fleet, for Retry.Pauses; fleet.Hints is
// one. Its methods must be safe for concurrent use, must not block, and
// should not allocate: Do calls Paused before every attempt.
type Pauser interface {
	// Paused reports whether calls to dependency are paused at now, and
	// until when.
	Paused(dependency string, now time.Time) (until time.Time, ok bool)
	// RetryAfter reports that an attempt to dependency that ended at now
	// was answered with a request to wait d (a Retry-After).
	RetryAfter(dependency string, d time.Duration, now time.Time)
}

// paused turns a pause into ErrCircuitOpen, as the breaker's refusal.
func (c *call) paused(retryIn time.Duration) error {
	if c.obs != nil {
		e := c.event(event.BreakerReject, time.Time{})
		e.Delay, e.Reason, e.Err = retryIn, event.ReasonPaused, ErrPaused
		c.obs.Observe(c.ctx, e)
	}
	c.outcome = event.OutcomeCircuitOpen
	return &Error{Kind: ErrCircuitOpen, Attempts: c.attempts, RetryIn: retryIn, Err: c.cause(ErrPaused)}
}
