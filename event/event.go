// Package event is the vocabulary every guardrail package reports in: the
// Observer interface and the events, outcomes, reasons and phases it receives.
package event

import (
	"context"
	"time"
)

// Observer receives the events of guarded calls and guarded servers: the seam
// for metrics, traces and logs. Adapters live in extra/prom, extra/otel
// and slogobs.
//
// Observe is called synchronously on the caller's goroutine, so it must be
// fast and must not block; it must be safe for concurrent use. For
// CallStart and AttemptStart the returned context replaces ctx for
// the rest of the call or attempt (a tracer puts its span there, and the same
// context comes back with the matching End event); for every other kind the
// result is ignored and ctx should be returned unchanged.
//
// A nil Observer is valid and costs nothing.
type Observer interface {
	Observe(ctx context.Context, e Event) context.Context
}

// ObserverFunc adapts a function to the Observer interface. It is as safe
// for concurrent use as the function is, and must be, like any Observer.
type ObserverFunc func(ctx context.Context, e Event) context.Context

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) context.Context { return f(ctx, e) }

// Kind says what happened. It is a plain value, safe for concurrent use.
type Kind uint8

// The event kinds. Fields of Event not listed for a kind are zero.
const (
	_ Kind = iota
	// CallStart: a guarded call begins. Dependency, Operation, Remaining.
	CallStart
	// CallEnd: the call returned. Outcome (a call outcome such as
	// OutcomeOK or OutcomeCircuitOpen), Attempt (attempts made), Duration, Err.
	CallEnd
	// AttemptStart: attempt number Attempt (1-based) begins. Delay is the
	// backoff waited before it, Remaining the time left on the deadline (-1 when
	// the context has none).
	AttemptStart
	// AttemptEnd: attempt Attempt ended after Duration. Outcome is
	// AttemptSuccess, AttemptFailure or AttemptIgnored (what the breaker saw),
	// Err the attempt's error.
	AttemptEnd
	// Retry: a retry was scheduled after attempt Attempt. Delay is the wait,
	// Reason why (ReasonRetryAfter, ReasonBackoff), Err the error retried.
	Retry
	// RetryRefused: a retryable failure was not retried. Reason says why
	// (ReasonBudget, ReasonDeadline, ReasonAttempts, ReasonNotIdempotent,
	// ReasonAlreadyRetried, ReasonAmplification).
	RetryRefused
	// BudgetExhausted: the retry budget refused a retry; Tokens left.
	BudgetExhausted
	// BreakerTransition: the breaker moved From -> To. Reason is the
	// cause from a fixed set (breaker.Reason: "failure_rate", "probe_failed",
	// "forced_open"...), Detail the same in words ("failure rate 0.55 of 20
	// calls >= 0.5"), Delay how long the breaker stays open when To is
	// "open" and the change was not forced (0 otherwise). It is the only
	// report of a transition: a breaker's Config.Observer receives it.
	BreakerTransition
	// BreakerReject: the breaker refused a call; Delay is the time until
	// the next probe. Reason is ReasonPaused when a fleet hint refused it
	// instead (guardrail.Retry.Pauses), Delay the rest of the pause.
	BreakerReject
	// BreakerProbe: a half-open probe was admitted.
	BreakerProbe
	// BulkheadReject: the bulkhead was full (Reason ReasonBulkheadFull or
	// ReasonDeadline when the wait could not fit the time left).
	BulkheadReject
	// Shed: a server shed a request. Priority, Reason, InFlight, Limit; a
	// rate limiter's refusal (ReasonRateLimit) sets Delay to the Retry-After
	// it answered, and Err when the client could not be identified.
	Shed
	// Admit: a server admitted a request. Priority, InFlight, Limit, and
	// Duration spent queued.
	Admit
	// Idempotency: the idempotency middleware decided. Reason is one of
	// ReasonStored, ReasonReplayed, ReasonConflict, ReasonMismatch,
	// ReasonReleased, ReasonStoreError.
	Idempotency
	// Timeout: a timeout expired in Phase (PhaseAttempt, PhaseConnect,
	// PhaseTLS, PhaseWrite, PhaseResponseHeader, PhaseBodyIdle).
	Timeout
	// Hedge: a hedged attempt, number Attempt, was sent Delay after the
	// attempt it backs up started, which had not answered. AttemptStart
	// and AttemptEnd follow for it as for any attempt.
	Hedge
	// HedgeRefused: a hedge was due but not sent; Reason says why
	// (ReasonOverload, ReasonBudget, ReasonBreakerOpen, ReasonBulkheadFull,
	// ReasonThrottled, ReasonDeadline, ReasonPaused). No more hedges back
	// up that attempt.
	HedgeRefused
	// Throttled: the client-side throttle rejected attempt Attempt locally,
	// without sending it (Reason ReasonThrottled).
	Throttled
	// ConfigReload: a policy file was read again. Outcome is OutcomeOK
	// when its settings were applied, OutcomeError when they were
	// rejected and the settings in force stay; Err says why, Detail names
	// the file. Dependency and Operation are empty: a reload concerns the
	// whole process.
	ConfigReload
	// SharedStore: the store a fleet limit shares (package fleet) stopped
	// answering (Outcome OutcomeError, Err its error) or answered again
	// (OutcomeOK); transitions only. Reason is what the limiter does
	// meanwhile: ReasonFailOpen or ReasonFailClosed.
	SharedStore
	// Amplification: a server received a request of a call chain (package
	// chain). Amplification is the sends of the user's original request it
	// represents (1 for a request that was never retried upstream), Limit
	// the server's cap on what its own calls may add up to.
	Amplification
	// FleetHint: a fleet hint (package fleet) was published, applied or
	// dropped. Reason is ReasonHintPublished, ReasonHintApplied,
	// ReasonHintQueueFull, ReasonHintPublishFailed (Err says why) or
	// ReasonHintRejected; Detail is the hint's kind ("pause",
	// "breaker_open"), Delay the pause it asks for. Dependency is empty
	// for a rejected hint, whose name may be anything a peer sent.
	FleetHint
	// Metastable: a metastability detector (package metastable) changed
	// state. From and To are "normal", "degraded" or "metastable"; Reason
	// is ReasonRelief while its actuator is on after the change, empty
	// otherwise; Detail gives the window's numbers in words.
	Metastable
)

var kindNames = [...]string{
	CallStart:         "call_start",
	CallEnd:           "call_end",
	AttemptStart:      "attempt_start",
	AttemptEnd:        "attempt_end",
	Retry:             "retry",
	RetryRefused:      "retry_refused",
	BudgetExhausted:   "budget_exhausted",
	BreakerTransition: "breaker_transition",
	BreakerReject:     "breaker_reject",
	BreakerProbe:      "breaker_probe",
	BulkheadReject:    "bulkhead_reject",
	Shed:              "shed",
	Admit:             "admit",
	Idempotency:       "idempotency",
	Timeout:           "timeout",
	Hedge:             "hedge",
	HedgeRefused:      "hedge_refused",
	Throttled:         "throttled",
	ConfigReload:      "config_reload",
	SharedStore:       "shared_store",
	Amplification:     "amplification",
	FleetHint:         "fleet_hint",
	Metastable:        "metastable",
}

// String returns the kind's snake_case name.
func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return "unknown"
}

// Event describes one thing that happened to a guarded call. It is passed by
// value so that observing allocates nothing. String fields hold values from a
// small fixed set (the constants below, a Policy's Name) and are safe as
// metric labels, except Operation, which is whatever the caller set. An
// Event is a plain value owned by the Observer that receives it.
type Event struct {
	Kind          Kind          // what happened; says which other fields are set
	Dependency    string        // Policy.Name, a host, a breaker group key
	Operation     string        // set by the caller with WithOperation; may be empty
	Attempt       int           // 1-based attempt number
	Outcome       string        // a call outcome (Outcome*) or an attempt outcome (Attempt*)
	Reason        string        // Reason* constants or a breaker cause
	Phase         string        // Phase* constants
	From, To      string        // breaker states
	Priority      string        // shed priority name
	Err           error         // the error involved, if any
	Duration      time.Duration // attempt or call duration, queueing time
	Delay         time.Duration // backoff before an attempt, retry delay, time to next probe
	Remaining     time.Duration // time left on the deadline; -1 when there is none
	Detail        string        // free text for logs (a breaker transition's cause); never a label
	Tokens        float64       // retry budget tokens after the event
	InFlight      int           // shedder or bulkhead in-flight count
	Limit         int           // shedder or bulkhead limit; a chain server's amplification cap
	Amplification int           // sends of the user's original request a request represents
}

// Call outcomes (CallEnd) and attempt outcomes (AttemptEnd).
const (
	OutcomeOK              = "ok"
	OutcomeError           = "error"
	OutcomeCircuitOpen     = "circuit_open"
	OutcomeBudgetExhausted = "budget_exhausted"
	OutcomeDeadline        = "deadline"
	OutcomeBulkheadFull    = "bulkhead_full"
	OutcomeUnknown         = "unknown"
	OutcomeCanceled        = "canceled"
	// OutcomeThrottled: the client-side throttle rejected the call's attempt locally.
	OutcomeThrottled = "throttled"
)

// Attempt outcomes: how the breaker counted one attempt (AttemptEnd).
const (
	AttemptSuccess = "success"
	AttemptFailure = "failure"
	AttemptIgnored = "ignored"
)

// Reasons carried by retry, budget, bulkhead, shed and idempotency events.
const (
	ReasonBackoff       = "backoff"
	ReasonRetryAfter    = "retry_after"
	ReasonBudget        = "budget"
	ReasonDeadline      = "deadline"
	ReasonAttempts      = "attempts"
	ReasonNotIdempotent = "not_idempotent"
	ReasonBreakerOpen   = "breaker_open"
	ReasonBulkheadFull  = "bulkhead_full"

	ReasonCapacity   = "capacity"    // shed: in-flight at the limit for this priority
	ReasonRetryRatio = "retry_ratio" // shed: a retry refused to keep retries under their ratio
	ReasonQueueTime  = "queue_time"  // shed: waited in the queue past the target
	ReasonQueueFull  = "queue_full"  // shed: the queue was full
	ReasonExpired    = "expired"     // shed: the caller's deadline had already passed
	ReasonRateLimit  = "rate_limit"  // shed: the client's rate limit was spent (or the client could not be identified)
	ReasonCohort     = "cohort"      // shed: the request's cohort is below the admission level (package chain)
	ReasonStored     = "stored"      // idempotency: a response was stored
	ReasonReplayed   = "replayed"    // idempotency: a stored response was replayed
	ReasonConflict   = "conflict"    // idempotency: same key in flight (409)
	ReasonMismatch   = "mismatch"    // idempotency: same key, other payload (422)
	ReasonReleased   = "released"    // idempotency: 5xx or panic, key released
	ReasonStoreError = "store_error" // idempotency: the store failed
	// ReasonOverload: hedge refused: the dependency answered with an overload signal (429, 503, Retry-After) lately.
	ReasonOverload = "overload"
	// ReasonThrottled: the client-side throttle rejected the attempt or the hedge.
	ReasonThrottled = "throttled"
	// ReasonOutcomeUnknown: idempotency: the handler panicked or hijacked the connection; its key answers 500 until it expires.
	ReasonOutcomeUnknown = "outcome_unknown"
	// ReasonAlreadyRetried: a failure was not retried because the answer
	// said the server behind had already retried it (package chain).
	ReasonAlreadyRetried = "already_retried"
	// ReasonAmplification: a retry was refused because it would take the
	// request's chain amplification past the server's cap (package chain).
	ReasonAmplification = "amplification"
	// ReasonFailOpen: a fleet limiter admits this process's share of the
	// limit while its shared store fails.
	ReasonFailOpen = "fail_open"
	// ReasonFailClosed: a fleet limiter refuses while its shared store
	// fails.
	ReasonFailClosed = "fail_closed"
	// ReasonPaused: a call was refused before it was sent because a fleet
	// hint paused its dependency (BreakerReject; package fleet).
	ReasonPaused = "paused"
	// ReasonRelief: a metastability detector's actuator is on (Metastable;
	// package metastable).
	ReasonRelief = "relief"
)

// Reasons carried by FleetHint events.
const (
	ReasonHintPublished     = "published"      // handed to the bus
	ReasonHintApplied       = "applied"        // a peer's hint now pauses the dependency here
	ReasonHintQueueFull     = "queue_full"     // dropped: the publish queue was full
	ReasonHintPublishFailed = "publish_failed" // dropped: the bus returned an error
	ReasonHintRejected      = "rejected"       // a received hint was ignored: unknown dependency, invalid or expired
)

// Timeout phases (Timeout and typed timeout errors).
const (
	PhaseAttempt        = "attempt"
	PhaseConnect        = "connect"
	PhaseTLS            = "tls"
	PhaseWrite          = "write"
	PhaseResponseHeader = "response_header"
	PhaseBodyIdle       = "body_idle"
)

// Join returns an Observer that passes every event to each of obs in
// order, threading the context through them. Nil entries are skipped; with
// no non-nil entry it returns nil, so the result costs nothing.
func Join(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		switch o := o.(type) {
		case nil:
		case multiObserver:
			list = append(list, o...)
		default:
			list = append(list, o)
		}
	}
	switch len(list) {
	case 0:
		return nil
	case 1:
		return list[0]
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) context.Context {
	for _, o := range m {
		ctx = o.Observe(ctx, e)
	}
	return ctx
}

type operationKey struct{}

// WithOperation returns a context that labels the guarded calls made with it
// as operation op (for example a route template "GET /orders/{id}"). Use a
// value from a small fixed set: observers may turn it into a metric label.
func WithOperation(ctx context.Context, op string) context.Context {
	return context.WithValue(ctx, operationKey{}, op)
}

// Operation returns the operation set by WithOperation, or "".
func Operation(ctx context.Context) string {
	op, _ := ctx.Value(operationKey{}).(string)
	return op
}
