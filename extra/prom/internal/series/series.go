// Package series defines guardrail's metric series once, for every metrics
// adapter, and bounds the values their labels may take.
package series

// Kind is a series' metric type, a plain value.
type Kind uint8

// The metric types.
const (
	Counter Kind = iota
	Gauge
	Histogram
)

// String returns the kind's name in Prometheus' exposition format.
func (k Kind) String() string {
	switch k {
	case Counter:
		return "counter"
	case Gauge:
		return "gauge"
	default:
		return "histogram"
	}
}

// Def describes one series. The OpenTelemetry instrument name is chosen so
// that the OpenTelemetry Prometheus translation (dots to underscores,
// "_seconds" for unit "s", "_total" for counters) gives back the Prometheus
// name, and a dashboard works with either adapter. A Def is never modified:
// it is safe for concurrent use.
type Def struct {
	Name   string   // the Prometheus name
	OTel   string   // the OpenTelemetry instrument name
	Kind   Kind     // the metric type
	Unit   string   // UCUM unit for OpenTelemetry; "s" for durations
	Labels []string // label names, in the order adapters pass values
	Help   string   // the help text, listing the values of its labels
}

// Label names. Values come from a small fixed set (the Outcome*, Attempt*,
// Reason* and Phase* constants of package event, breaker states, shed
// priorities) except dependency, key and operation, which are folded past a
// cap.
//
// One rule names a dependency everywhere: dependency is the name its calls
// report (Policy.Name, an HTTP client's Config.Name, or the request's key
// when that is empty), so every series of one dependency joins on it. Key is
// the breaker group key (a host, a route) where a group splits one named
// dependency into several breakers, and empty otherwise.
const (
	LDependency = "dependency"
	LKey        = "key"
	LOperation  = "operation"
	LOutcome    = "outcome"
	LReason     = "reason"
	LPhase      = "phase"
	LPriority   = "priority"
	LState      = "state"
	LFrom       = "from"
	LTo         = "to"
)

// The series. The order is the order of docs/metrics.md.
var (
	Calls = &Def{
		Name: "guardrail_calls_total", OTel: "guardrail.calls", Kind: Counter,
		Labels: []string{LDependency, LOperation, LOutcome},
		Help:   "Guarded calls (original requests, not attempts) by how they ended: ok, error, circuit_open, budget_exhausted, deadline, bulkhead_full, unknown, canceled, throttled.",
	}
	CallDuration = &Def{
		Name: "guardrail_call_duration_seconds", OTel: "guardrail.call.duration", Kind: Histogram, Unit: "s",
		Labels: []string{LDependency, LOperation},
		Help:   "Time from the start of a guarded call to its return, attempts and backoff included.",
	}
	Attempts = &Def{
		Name: "guardrail_attempts_total", OTel: "guardrail.attempts", Kind: Counter,
		Labels: []string{LDependency, LOperation, LOutcome},
		Help:   "Attempts (first tries and retries) by what the breaker saw: success, failure, ignored.",
	}
	AttemptDuration = &Def{
		Name: "guardrail_attempt_duration_seconds", OTel: "guardrail.attempt.duration", Kind: Histogram, Unit: "s",
		Labels: []string{LDependency, LOperation, LOutcome},
		Help:   "Duration of each attempt, by outcome.",
	}
	DeadlineRemaining = &Def{
		Name: "guardrail_deadline_remaining_seconds", OTel: "guardrail.deadline.remaining", Kind: Histogram, Unit: "s",
		Labels: []string{LDependency, LOperation},
		Help:   "Time left on the caller's deadline when an attempt starts; attempts without a deadline are not observed.",
	}
	Retries = &Def{
		Name: "guardrail_retries_total", OTel: "guardrail.retries", Kind: Counter,
		Labels: []string{LDependency, LOperation, LReason},
		Help:   "Retries scheduled, by where the delay came from: backoff or retry_after.",
	}
	RetriesRefused = &Def{
		Name: "guardrail_retries_refused_total", OTel: "guardrail.retries.refused", Kind: Counter,
		Labels: []string{LDependency, LOperation, LReason},
		Help:   "Retryable failures that were not retried, by reason: attempts, budget, deadline, not_idempotent, retry_after, breaker_open, already_retried (the server behind had already retried), amplification (the request's chain amplification reached its cap).",
	}
	Hedges = &Def{
		Name: "guardrail_hedges_total", OTel: "guardrail.hedges", Kind: Counter,
		Labels: []string{LDependency, LOperation, LReason},
		Help:   "Hedged attempts: sent, or not sent and why: overload, budget, breaker_open, bulkhead_full, throttled, deadline, paused (a fleet hint paused the dependency).",
	}
	RetrySuccess = &Def{
		Name: "guardrail_retry_success_total", OTel: "guardrail.retry.success", Kind: Counter,
		Labels: []string{LDependency, LOperation},
		Help:   "Calls that succeeded after at least one retry.",
	}
	RetryExhausted = &Def{
		Name: "guardrail_retry_exhausted_total", OTel: "guardrail.retry.exhausted", Kind: Counter,
		Labels: []string{LDependency, LOperation, LOutcome},
		Help:   "Calls that failed after at least one retry, by the call's outcome.",
	}
	Timeouts = &Def{
		Name: "guardrail_timeouts_total", OTel: "guardrail.timeouts", Kind: Counter,
		Labels: []string{LDependency, LOperation, LPhase},
		Help:   "Timeouts by phase: attempt, connect, tls, write, response_header, body_idle.",
	}
	BudgetTokens = &Def{
		Name: "guardrail_retry_budget_tokens", OTel: "guardrail.retry_budget.tokens", Kind: Gauge, Unit: "{token}",
		Labels: []string{LDependency},
		Help:   "Tokens left in the retry budget; a retry spends one.",
	}
	BreakerState = &Def{
		Name: "guardrail_breaker_state", OTel: "guardrail.breaker.state", Kind: Gauge,
		Labels: []string{LDependency, LKey, LState},
		Help:   "1 for the breaker's current state (closed, open, half_open), 0 for the others; key is the breaker group key where a group splits the dependency.",
	}
	BreakerTransitions = &Def{
		Name: "guardrail_breaker_transitions_total", OTel: "guardrail.breaker.transitions", Kind: Counter,
		Labels: []string{LDependency, LFrom, LTo, LReason},
		Help:   "Breaker state changes, by cause: failure_rate, slow_rate, consecutive_failures, open_elapsed, probe_failed, probe_slow, probe_timeout, probes_passed, forced_open, forced_closed, reset.",
	}
	BreakerRejections = &Def{
		Name: "guardrail_breaker_rejections_total", OTel: "guardrail.breaker.rejections", Kind: Counter,
		Labels: []string{LDependency, LOperation},
		Help:   "Calls the breaker refused without running them, or a fleet hint's pause refused (reason paused in the events).",
	}
	BreakerProbes = &Def{
		Name: "guardrail_breaker_probes_total", OTel: "guardrail.breaker.probes", Kind: Counter,
		Labels: []string{LDependency, LOperation},
		Help:   "Half-open probes admitted.",
	}
	BulkheadRejections = &Def{
		Name: "guardrail_bulkhead_rejections_total", OTel: "guardrail.bulkhead.rejections", Kind: Counter,
		Labels: []string{LDependency, LOperation, LReason},
		Help:   "Calls refused by a full bulkhead: bulkhead_full, or deadline when the wait could not fit.",
	}
	Shed = &Def{
		Name: "guardrail_shed_total", OTel: "guardrail.shed", Kind: Counter,
		Labels: []string{LDependency, LOperation, LPriority, LReason},
		Help:   "Requests a server shed, by priority and reason: capacity, retry_ratio, queue_time, queue_full, expired, rate_limit (a client over its rate limit, or one that could not be identified), cohort (below the admission level of consistent shedding).",
	}
	Admitted = &Def{
		Name: "guardrail_admitted_total", OTel: "guardrail.admitted", Kind: Counter,
		Labels: []string{LDependency, LOperation, LPriority},
		Help:   "Requests a server's load shedder admitted, by priority.",
	}
	QueueWait = &Def{
		Name: "guardrail_queue_wait_seconds", OTel: "guardrail.queue.wait", Kind: Histogram, Unit: "s",
		Labels: []string{LDependency, LPriority},
		Help:   "Time an admitted request waited in the shedder's queue.",
	}
	InFlight = &Def{
		Name: "guardrail_shed_in_flight", OTel: "guardrail.shed.in_flight", Kind: Gauge, Unit: "{request}",
		Labels: []string{LDependency},
		Help:   "Requests in flight in the load shedder.",
	}
	Limit = &Def{
		Name: "guardrail_shed_limit", OTel: "guardrail.shed.limit", Kind: Gauge, Unit: "{request}",
		Labels: []string{LDependency},
		Help:   "The load shedder's current in-flight limit (adaptive limits move).",
	}
	Idempotency = &Def{
		Name: "guardrail_idempotency_total", OTel: "guardrail.idempotency", Kind: Counter,
		Labels: []string{LDependency, LOperation, LOutcome},
		Help:   "Idempotency-Key decisions: stored, replayed, conflict, mismatch, released, store_error, outcome_unknown.",
	}
	Amplification = &Def{
		Name: "guardrail_request_amplification", OTel: "guardrail.request.amplification", Kind: Histogram, Unit: "{request}",
		Labels: []string{LDependency},
		Help:   "Sends of the user's original request that each request a server received represents: the product of the attempt numbers along the call chain (1: never retried upstream).",
	}
	SharedStore = &Def{
		Name: "guardrail_shared_store_transitions_total", OTel: "guardrail.shared_store.transitions", Kind: Counter,
		Labels: []string{LDependency, LReason, LOutcome},
		Help:   "A fleet limit's shared store stopped answering (outcome error) or answered again (ok), by what the limiter does meanwhile: fail_open (this process's share of the limit) or fail_closed (refuse).",
	}
	FleetHints = &Def{
		Name: "guardrail_fleet_hints_total", OTel: "guardrail.fleet.hints", Kind: Counter,
		Labels: []string{LDependency, LReason},
		Help:   "Fleet hints (package fleet) by what became of them: published, applied (a peer's hint paused the dependency here), queue_full, publish_failed, rejected (dependency empty: a peer may name anything).",
	}
	MetastableTransitions = &Def{
		Name: "guardrail_metastable_transitions_total", OTel: "guardrail.metastable.transitions", Kind: Counter,
		Labels: []string{LDependency, LFrom, LTo, LReason},
		Help:   "State changes of a metastability detector (package metastable) between normal, degraded (goodput low while the dependency is down or without the symptoms) and metastable (the dependency is up, goodput stays low, retries, queueing or wasted work stay high); reason relief while its actuator is on after the change. A dependency is metastable now while its transitions to metastable outnumber those from it.",
	}
	// ConfigReloads is the one series without a dependency: a policy file
	// configures the whole process, and the file's name would be a label
	// of unbounded values.
	ConfigReloads = &Def{
		Name: "guardrail_config_reloads_total", OTel: "guardrail.config.reloads", Kind: Counter,
		Labels: []string{LOutcome},
		Help:   "Policy file reloads: ok (applied) or error (rejected; the settings in force stay).",
	}
)

// All lists every series.
var All = []*Def{
	Calls, CallDuration, Attempts, AttemptDuration, DeadlineRemaining,
	Retries, RetriesRefused, Hedges, RetrySuccess, RetryExhausted, Timeouts,
	BudgetTokens, BreakerState, BreakerTransitions, BreakerRejections,
	BreakerProbes, BulkheadRejections, Shed, Admitted, QueueWait, InFlight,
	Limit, Idempotency, Amplification, SharedStore, FleetHints,
	MetastableTransitions, ConfigReloads,
}

// States are the breaker states exported by BreakerState, each present
// (at 0 or 1) from the moment a breaker is known.
var States = []string{"closed", "open", "half_open"}

// Default histogram buckets, in seconds.
var (
	// DurationBuckets span a fast cache hit to a slow failover.
	DurationBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
	// RemainingBuckets span "too late for another attempt" (the 50 ms
	// default least time worth starting an attempt with) to generous
	// end-to-end budgets.
	RemainingBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	// AmplificationBuckets span one send to a chain whose every tier
	// retried: three attempts at two, three and four tiers are 9, 27 and
	// 81 sends.
	AmplificationBuckets = []float64{1, 2, 3, 4, 6, 9, 16, 27, 81}
)
