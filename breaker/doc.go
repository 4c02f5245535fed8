// Package breaker implements a circuit breaker with a sliding window and
// exact half-open probing.
//
// # Failure rate or consecutive failures
//
// A breaker trips on the failure rate of its window (FailureRate, once the
// window holds MinRequests calls) and, when Config.ConsecutiveFailures is
// set, also on a run of that many failures with no success between them.
//
// The rate is the right signal for a dependency called often: it tolerates
// scattered failures, and trips on a real share of them over a window of
// time. But a dependency called a few times a minute never fills the 20
// calls of the default MinRequests within the 10 s window, so its breaker
// never trips, however dead the dependency is. Lowering MinRequests to 1
// or 2 makes one unlucky failure enough. For such a dependency set
// ConsecutiveFailures (5 is a common choice): a run of failures is the
// evidence a quiet dependency gives, and a single success ends it.
//
// Both can be set on one breaker, for a dependency whose traffic comes and
// goes: the rate decides when the window is full, the run when it is not.
// Whichever trips the breaker names itself in the transition's Reason
// (ReasonFailureRate, ReasonConsecutiveFailures). Open and half-open work
// the same either way.
package breaker
