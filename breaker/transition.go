package breaker

import (
	"strconv"
	"time"
)

// Reason says why a transition happened. Its values form a small fixed set,
// safe as a metric label, and it is the Reason of the
// event.BreakerTransition an Observer receives; its Detail carries the
// numbers. A Reason is
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

// transition describes one state change of a breaker, queued for the
// Observer, which receives it as an event.BreakerTransition.
type transition struct {
	Name     string // the breaker's Config.Name (the key, in a Group)
	From, To State
	Reason   Reason
	Cause    string        // why in words with the numbers: "failure rate 0.55 of 20 calls >= 0.5"
	OpenFor  time.Duration // the jittered (and possibly grown) open time, when To is Open and not forced
}

func rateCause(what string, n, calls int64, threshold float64) string {
	rate := float64(n) / float64(calls)
	return what + " rate " + strconv.FormatFloat(rate, 'g', 3, 64) +
		" of " + strconv.FormatInt(calls, 10) + " calls >= " +
		strconv.FormatFloat(threshold, 'g', -1, 64)
}
