package breaker

import (
	"strconv"
	"time"
)

// Reason says why a transition happened. Its values form a small fixed set,
// safe as a metric label; Transition.Cause carries the numbers. A Reason is
// a plain string, safe for concurrent use.
type Reason string

// The reasons for a transition.
const (
	ReasonFailureRate  Reason = "failure_rate"  // closed -> open
	ReasonSlowRate     Reason = "slow_rate"     // closed -> open
	ReasonOpenElapsed  Reason = "open_elapsed"  // open -> half-open
	ReasonProbeFailed  Reason = "probe_failed"  // half-open -> open
	ReasonProbeSlow    Reason = "probe_slow"    // half-open -> open
	ReasonProbeTimeout Reason = "probe_timeout" // half-open -> open: no probe reported within OpenFor
	ReasonProbesPassed Reason = "probes_passed" // half-open -> closed
	ReasonForcedOpen   Reason = "forced_open"   // ForceOpen
	ReasonForcedClosed Reason = "forced_closed" // ForceClosed
	ReasonReset        Reason = "reset"         // Reset
)

// Transition describes one state change of a breaker, for OnTransition: a
// plain value, owned by the callback.
type Transition struct {
	// Name is the breaker's Config.Name (the key, in a Group).
	Name string
	// From and To are the states before and after.
	From, To State
	// Forced is true when To was forced (ForceOpen, ForceClosed or the
	// MetricsOnly mode): it will not change by itself.
	Forced bool
	// Reason is why, from a small fixed set.
	Reason Reason
	// Cause says why in words with the numbers, for logs: "failure rate
	// 0.55 of 20 calls >= 0.5", "probe failed", "forced open".
	Cause string
	// Calls, Failures and Slow are the window's counts that tripped the
	// breaker (closed -> open), or the probes' (half-open -> closed).
	Calls, Failures, Slow int
	// FailureRate and SlowRate are Failures/Calls and Slow/Calls when the
	// window tripped the breaker (closed -> open), else 0.
	FailureRate, SlowRate float64
	// OpenFor is how long the breaker stays open when To is Open and not
	// forced: the jittered (and possibly grown) open time.
	OpenFor time.Duration
	// Opens counts consecutive openings since the breaker last closed,
	// this one included, when To is Open.
	Opens int
}

func rateCause(what string, n, calls int64, threshold float64) string {
	rate := float64(n) / float64(calls)
	return what + " rate " + strconv.FormatFloat(rate, 'g', 3, 64) +
		" of " + strconv.FormatInt(calls, 10) + " calls >= " +
		strconv.FormatFloat(threshold, 'g', -1, 64)
}
