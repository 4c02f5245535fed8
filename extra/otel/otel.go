// Package otel exports guardrail's events as OpenTelemetry traces and
// metrics.
package otel

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/event"

	gotel "go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/otel/internal/series"
	"github.com/guardrail-go/guardrail/shed"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/guardrail-go/guardrail/extra/otel"

// Span names, as docs/metrics.md lists them.
const (
	callSpanName       = "guardrail.call"
	attemptSpanName    = "guardrail.attempt"
	transitionSpanName = "guardrail.breaker.transition" // also the span event's name
)

// Span attribute keys, as docs/metrics.md lists them.
const (
	attrDependency  = attribute.Key("guardrail.dependency")
	attrOperation   = attribute.Key("guardrail.operation")
	attrOutcome     = attribute.Key("guardrail.outcome")       // call or attempt outcome
	attrAttempts    = attribute.Key("guardrail.attempts")      // attempts a call made
	attrAttempt     = attribute.Key("guardrail.attempt")       // 1-based attempt number
	attrBackoff     = attribute.Key("guardrail.backoff_ms")    // wait before this attempt, or before the retry
	attrRemaining   = attribute.Key("guardrail.remaining_ms")  // time left on the deadline
	attrPhase       = attribute.Key("guardrail.timeout_phase") // phase of a timeout
	attrReason      = attribute.Key("guardrail.reason")
	attrFrom        = attribute.Key("guardrail.breaker.from")
	attrCause       = attribute.Key("guardrail.breaker.cause")       // a transition's cause in words
	attrOpenFor     = attribute.Key("guardrail.breaker.open_for_ms") // how long it stays open
	attrTo          = attribute.Key("guardrail.breaker.to")
	attrTokens      = attribute.Key("guardrail.budget.tokens")
	attrPriority    = attribute.Key("guardrail.priority")
	attrInFlight    = attribute.Key("guardrail.in_flight")
	attrLimit       = attribute.Key("guardrail.limit")
	attrRetryIn     = attribute.Key("guardrail.retry_in_ms")
	attrQueueWaitMS = attribute.Key("guardrail.queue_wait_ms")
)

// ErrInvalidConfig is the error every invalid Config field Is. The error
// New returns names the field, what it held and what is allowed.
var ErrInvalidConfig = errors.New("otel: invalid config")

// Config configures an Observer. The zero Config is valid: it uses the
// global providers (otel.GetTracerProvider, otel.GetMeterProvider) and the
// global propagator. A Config is a plain value: New reads it once, so
// changing it afterwards has no effect; the providers and the propagator it
// holds must be safe for concurrent use, as OpenTelemetry's are.
type Config struct {
	// TracerProvider makes the spans. Nil means otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// MeterProvider makes the instruments. Nil means
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Propagator reads the caller's trace context in Middleware. Nil means
	// otel.GetTextMapPropagator() at the time of each request, so one set
	// after New is used.
	Propagator propagation.TextMapPropagator
	// MaxLabelValues caps the distinct values of each metric attribute
	// (dependency, operation, ...), as in extra/prom: later values are
	// recorded as "other". Span attributes are not capped. Zero means 100;
	// a negative value is invalid.
	MaxLabelValues int
	// DurationBuckets are the explicit bucket boundaries, in seconds, of
	// the duration histograms: finite and strictly increasing. Empty means
	// 1 ms to 30 s.
	DurationBuckets []float64
	// RemainingBuckets are the bucket boundaries, in seconds, of
	// guardrail.deadline.remaining: finite and strictly increasing. Empty
	// means 10 ms to 60 s.
	RemainingBuckets []float64
}

// validate returns one error per invalid field of cfg, joined, or nil.
func (cfg *Config) validate() error {
	return errors.Join(
		series.CheckMaxValues("otel", ErrInvalidConfig, cfg.MaxLabelValues),
		series.CheckBuckets("otel", ErrInvalidConfig, "Config.DurationBuckets", cfg.DurationBuckets),
		series.CheckBuckets("otel", ErrInvalidConfig, "Config.RemainingBuckets", cfg.RemainingBuckets),
	)
}

// Observer is an event.Observer that traces and measures guarded calls.
//
// Traces: a span per call ("guardrail.call") with a child span per attempt
// ("guardrail.attempt"), so a call that was slow because the dependency was
// slow and one that was slow because it backed off twice look different.
// The attempt span carries the attempt number, the backoff waited before
// it, the time left on the deadline, its outcome and the phase of a
// timeout; retries, refused retries, breaker rejections and transitions,
// shedding and idempotency decisions are span events. The attempt's
// context carries its span, so a client instrumented with OpenTelemetry
// (or Transport) propagates the attempt's trace context downstream.
//
// Metrics: the series of docs/metrics.md through the OpenTelemetry metrics
// API, named so that the Prometheus translation of an OTLP export gives the
// same names as extra/prom.
//
// Servers: Middleware joins each request to its caller's trace, so the
// spans of the guarded calls a handler makes hang under the caller's.
//
// An Observer is safe for concurrent use.
type Observer struct {
	tracer  trace.Tracer
	prop    propagation.TextMapPropagator // nil: the global one, per request
	folders *series.Folders
	gauges  *series.Gauges
	reg     metric.Registration

	calls, attempts, retries, refused, hedges, retryOK, retryFailed, timeouts,
	transitions, rejections, probes, bulkhead, shed, admitted, idempotency, reloads, sharedStore, hints, metastable metric.Int64Counter
	reloadOK, reloadErr                       metric.AddOption
	callDur, attemptDur, remaining, queueWait metric.Float64Histogram
	amp                                       metric.Int64Histogram

	callC        *series.Cache[*callAttrs]
	attemptC     *series.Cache[*attrs]
	pairC        *series.Cache[*attrs] // dependency, operation
	retriesC     *series.Cache[*attrs]
	refusedC     *series.Cache[*attrs]
	hedgesC      *series.Cache[*attrs]
	timeoutsC    *series.Cache[*attrs]
	transC       *series.Cache[*attrs]
	bulkheadC    *series.Cache[*attrs]
	shedC        *series.Cache[*attrs]
	admitC       *series.Cache[*attrs]
	queueC       *series.Cache[*attrs]
	ampC         *series.Cache[*attrs]
	sharedStoreC *series.Cache[*attrs]
	idempotentC  *series.Cache[*attrs]
	hintsC       *series.Cache[*attrs]
	metastableC  *series.Cache[*attrs]
}

// attrs is a precomputed attribute set, as options that allocate nothing
// when passed to Add and Record.
type attrs struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

func newAttrs(d *series.Def, lv []string) *attrs {
	kv := make([]attribute.KeyValue, len(lv))
	for i, v := range lv {
		kv[i] = attribute.String(d.Labels[i], v)
	}
	o := metric.WithAttributeSet(attribute.NewSet(kv...))
	return &attrs{add: []metric.AddOption{o}, rec: []metric.RecordOption{o}}
}

type callAttrs struct {
	call    *attrs // dependency, operation, outcome
	pair    *attrs // dependency, operation
	retried *attrs // retry success (outcome ok) or retry exhausted
}

// New returns an Observer configured by cfg. It fails with an error that
// Is ErrInvalidConfig and names the field when a field of cfg is invalid,
// and with the meter's error when the meter refuses an instrument.
func New(cfg Config) (*Observer, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	tp, mp := cfg.TracerProvider, cfg.MeterProvider
	if tp == nil {
		tp = gotel.GetTracerProvider()
	}
	if mp == nil {
		mp = gotel.GetMeterProvider()
	}
	durBuckets, remBuckets := cfg.DurationBuckets, cfg.RemainingBuckets
	if len(durBuckets) == 0 {
		durBuckets = series.DurationBuckets
	}
	if len(remBuckets) == 0 {
		remBuckets = series.RemainingBuckets
	}
	meter := mp.Meter(ScopeName)
	fs := series.NewFolders(cfg.MaxLabelValues)
	o := &Observer{
		tracer:  tp.Tracer(ScopeName),
		prop:    cfg.Propagator,
		folders: fs,
		gauges:  series.NewGauges(fs),
	}
	if err := o.instruments(meter, durBuckets, remBuckets); err != nil {
		return nil, err
	}
	if err := o.registerGauges(meter); err != nil {
		return nil, err
	}
	o.caches(fs)
	return o, nil
}

// instruments creates the counters and histograms of o.
func (o *Observer) instruments(meter metric.Meter, durBuckets, remBuckets []float64) error {
	var errs []error
	counter := func(d *series.Def) metric.Int64Counter {
		c, err := meter.Int64Counter(d.OTel, metric.WithDescription(d.Help), metric.WithUnit(d.Unit))
		errs = append(errs, err)
		return c
	}
	histogram := func(d *series.Def, buckets []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(d.OTel, metric.WithDescription(d.Help), metric.WithUnit(d.Unit),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	o.calls = counter(series.Calls)
	o.callDur = histogram(series.CallDuration, durBuckets)
	o.attempts = counter(series.Attempts)
	o.attemptDur = histogram(series.AttemptDuration, durBuckets)
	o.remaining = histogram(series.DeadlineRemaining, remBuckets)
	o.retries = counter(series.Retries)
	o.refused = counter(series.RetriesRefused)
	o.hedges = counter(series.Hedges)
	o.retryOK = counter(series.RetrySuccess)
	o.retryFailed = counter(series.RetryExhausted)
	o.timeouts = counter(series.Timeouts)
	o.transitions = counter(series.BreakerTransitions)
	o.rejections = counter(series.BreakerRejections)
	o.probes = counter(series.BreakerProbes)
	o.bulkhead = counter(series.BulkheadRejections)
	o.shed = counter(series.Shed)
	o.admitted = counter(series.Admitted)
	o.queueWait = histogram(series.QueueWait, durBuckets)
	amp, err := meter.Int64Histogram(series.Amplification.OTel, metric.WithDescription(series.Amplification.Help),
		metric.WithUnit(series.Amplification.Unit), metric.WithExplicitBucketBoundaries(series.AmplificationBuckets...))
	o.amp = amp
	errs = append(errs, err)
	o.idempotency = counter(series.Idempotency)
	o.reloads = counter(series.ConfigReloads)
	o.sharedStore = counter(series.SharedStore)
	o.hints = counter(series.FleetHints)
	o.metastable = counter(series.MetastableTransitions)
	o.reloadOK = metric.WithAttributes(attribute.String(series.LOutcome, event.OutcomeOK))
	o.reloadErr = metric.WithAttributes(attribute.String(series.LOutcome, event.OutcomeError))
	return errors.Join(errs...)
}

// registerGauges creates the observable gauges of o and registers the
// callback that reports them.
func (o *Observer) registerGauges(meter metric.Meter) error {
	var errs []error
	state, err := meter.Int64ObservableGauge(series.BreakerState.OTel, metric.WithDescription(series.BreakerState.Help))
	errs = append(errs, err)
	tokens, err := meter.Float64ObservableGauge(series.BudgetTokens.OTel, metric.WithDescription(series.BudgetTokens.Help), metric.WithUnit(series.BudgetTokens.Unit))
	errs = append(errs, err)
	inFlight, err := meter.Int64ObservableGauge(series.InFlight.OTel, metric.WithDescription(series.InFlight.Help), metric.WithUnit(series.InFlight.Unit))
	errs = append(errs, err)
	limit, err := meter.Int64ObservableGauge(series.Limit.OTel, metric.WithDescription(series.Limit.Help), metric.WithUnit(series.Limit.Unit))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	o.reg, err = meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		dep := func(d string) attribute.KeyValue { return attribute.String(series.LDependency, d) }
		o.gauges.Collect(
			func(d, k, s string, n float64) {
				if k == "" { // as an empty Prometheus label: absent
					ob.ObserveInt64(state, int64(n), metric.WithAttributes(dep(d), attribute.String(series.LState, s)))
					return
				}
				ob.ObserveInt64(state, int64(n), metric.WithAttributes(dep(d), attribute.String(series.LKey, k), attribute.String(series.LState, s)))
			},
			func(d string, n float64) { ob.ObserveFloat64(tokens, n, metric.WithAttributes(dep(d))) },
			func(d string, in, lim float64) {
				ob.ObserveInt64(inFlight, int64(in), metric.WithAttributes(dep(d)))
				ob.ObserveInt64(limit, int64(lim), metric.WithAttributes(dep(d)))
			},
		)
		return nil
	}, state, tokens, inFlight, limit)
	return err
}

// caches creates the caches of attribute sets of o's series.
func (o *Observer) caches(fs *series.Folders) {
	cache := func(d *series.Def) *series.Cache[*attrs] {
		return series.NewCache(d, fs, func(lv []string) *attrs { return newAttrs(d, lv) })
	}
	o.callC = series.NewCache(series.Calls, fs, func(lv []string) *callAttrs {
		a := &callAttrs{call: newAttrs(series.Calls, lv), pair: newAttrs(series.CallDuration, lv[:2])}
		if lv[2] == event.OutcomeOK {
			a.retried = newAttrs(series.RetrySuccess, lv[:2])
		} else {
			a.retried = newAttrs(series.RetryExhausted, lv)
		}
		return a
	})
	o.attemptC = cache(series.Attempts)
	o.pairC = cache(series.DeadlineRemaining)
	o.retriesC = cache(series.Retries)
	o.refusedC = cache(series.RetriesRefused)
	o.hedgesC = cache(series.Hedges)
	o.timeoutsC = cache(series.Timeouts)
	o.transC = cache(series.BreakerTransitions)
	o.bulkheadC = cache(series.BulkheadRejections)
	o.shedC = cache(series.Shed)
	o.admitC = cache(series.Admitted)
	o.queueC = cache(series.QueueWait)
	o.ampC = cache(series.Amplification)
	o.sharedStoreC = cache(series.SharedStore)
	o.idempotentC = cache(series.Idempotency)
	o.hintsC = cache(series.FleetHints)
	o.metastableC = cache(series.MetastableTransitions)
}

// Close stops reporting the observable gauges. Spans and counters keep
// working.
func (o *Observer) Close() error { return o.reg.Unregister() }

// WatchBudget reports the tokens of b, a retry budget of dependency, at
// every collection.
func (o *Observer) WatchBudget(dependency string, b *budget.Budget) {
	o.gauges.WatchBudget(dependency, b)
}

// WatchPolicy watches what p uses, under p.Name: its retry budget and
// its breaker (Policy.Breaker, or the one the policy made), so both are
// exported from the first collection, before any call.
func (o *Observer) WatchPolicy(p *guardrail.Policy) {
	o.gauges.WatchPolicy(p)
}

// Observe records e. It implements event.Observer: for event.CallStart
// it returns a context carrying the call's span, for event.AttemptStart one
// carrying the attempt's span.
func (o *Observer) Observe(ctx context.Context, e event.Event) context.Context {
	dep, op := e.Dependency, e.Operation
	switch e.Kind {
	case event.CallStart:
		return o.startCall(ctx, &e)
	case event.AttemptStart:
		if e.Remaining >= 0 {
			o.remaining.Record(ctx, e.Remaining.Seconds(), o.pairC.Get(dep, op, "", "").rec...)
		}
		return o.startAttempt(ctx, &e)
	case event.AttemptEnd:
		a := o.attemptC.Get(dep, op, e.Outcome, "")
		o.attempts.Add(ctx, 1, a.add...)
		o.attemptDur.Record(ctx, e.Duration.Seconds(), a.rec...)
		if st := stateOf(ctx); st != nil {
			st.endAttempt(&e)
		}
	case event.CallEnd:
		a := o.callC.Get(dep, op, e.Outcome, "")
		o.calls.Add(ctx, 1, a.call.add...)
		o.callDur.Record(ctx, e.Duration.Seconds(), a.pair.rec...)
		if e.Attempt > 1 {
			if e.Outcome == event.OutcomeOK {
				o.retryOK.Add(ctx, 1, a.retried.add...)
			} else {
				o.retryFailed.Add(ctx, 1, a.retried.add...)
			}
		}
		if st := stateOf(ctx); st != nil {
			st.end(&e)
		}
	case event.Retry:
		o.retries.Add(ctx, 1, o.retriesC.Get(dep, op, e.Reason, "").add...)
		o.callEvent(ctx, "guardrail.retry", attrAttempt.Int(e.Attempt), attrBackoff.Float64(ms(e.Delay)), attrReason.String(e.Reason))
	case event.RetryRefused:
		o.refused.Add(ctx, 1, o.refusedC.Get(dep, op, e.Reason, "").add...)
		o.callEvent(ctx, "guardrail.retry_refused", attrAttempt.Int(e.Attempt), attrReason.String(e.Reason))
	case event.Hedge:
		o.hedges.Add(ctx, 1, o.hedgesC.Get(dep, op, "sent", "").add...)
	case event.HedgeRefused:
		o.hedges.Add(ctx, 1, o.hedgesC.Get(dep, op, e.Reason, "").add...)
	case event.ConfigReload:
		if e.Outcome == event.OutcomeOK {
			o.reloads.Add(ctx, 1, o.reloadOK)
		} else {
			o.reloads.Add(ctx, 1, o.reloadErr)
		}
	case event.BudgetExhausted:
		o.gauges.Observe(&e)
		o.callEvent(ctx, "guardrail.budget_exhausted", attrTokens.Float64(e.Tokens))
	case event.Timeout:
		o.timeouts.Add(ctx, 1, o.timeoutsC.Get(dep, op, e.Phase, "").add...)
		if st := stateOf(ctx); st != nil && st.timeout(e.Phase) {
			break
		}
		trace.SpanFromContext(ctx).SetAttributes(attrPhase.String(e.Phase))
	case event.BreakerTransition:
		o.transitions.Add(ctx, 1, o.transC.Get(dep, e.From, e.To, e.Reason).add...)
		o.gauges.Observe(&e)
		o.transition(ctx, &e)
	case event.BreakerReject:
		o.rejections.Add(ctx, 1, o.pairC.Get(dep, op, "", "").add...)
		o.callEvent(ctx, "guardrail.breaker.reject", attrRetryIn.Float64(ms(e.Delay)))
	case event.BreakerProbe:
		o.probes.Add(ctx, 1, o.pairC.Get(dep, op, "", "").add...)
		o.callEvent(ctx, "guardrail.breaker.probe")
	case event.BulkheadReject:
		o.bulkhead.Add(ctx, 1, o.bulkheadC.Get(dep, op, e.Reason, "").add...)
		o.callEvent(ctx, "guardrail.bulkhead.reject", attrReason.String(e.Reason))
	case event.Shed:
		o.shed.Add(ctx, 1, o.shedC.Get(dep, op, e.Priority, e.Reason).add...)
		o.gauges.Observe(&e)
		spanEvent(ctx, "guardrail.shed", attrPriority.String(e.Priority),
			attrReason.String(e.Reason), attrInFlight.Int(e.InFlight), attrLimit.Int(e.Limit))
	case event.Admit:
		o.admitted.Add(ctx, 1, o.admitC.Get(dep, op, e.Priority, "").add...)
		o.queueWait.Record(ctx, e.Duration.Seconds(), o.queueC.Get(dep, e.Priority, "", "").rec...)
		o.gauges.Observe(&e)
		if e.Duration > 0 {
			spanEvent(ctx, "guardrail.admit", attrPriority.String(e.Priority), attrQueueWaitMS.Float64(ms(e.Duration)))
		}
	case event.Idempotency:
		o.idempotency.Add(ctx, 1, o.idempotentC.Get(dep, op, e.Reason, "").add...)
		spanEvent(ctx, "guardrail.idempotency", attrOutcome.String(e.Reason))
	case event.Amplification:
		o.amp.Record(ctx, int64(e.Amplification), o.ampC.Get(dep, "", "", "").rec...)
	case event.SharedStore:
		o.sharedStore.Add(ctx, 1, o.sharedStoreC.Get(dep, e.Reason, e.Outcome, "").add...)
	case event.FleetHint:
		o.hints.Add(ctx, 1, o.hintsC.Get(dep, e.Reason, "", "").add...)
	case event.Metastable:
		o.metastable.Add(ctx, 1, o.metastableC.Get(dep, e.From, e.To, e.Reason).add...)
	}
	return ctx
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// callEvent adds a span event to the call's span, or to the span of ctx
// for events outside a call, if that span records.
func (o *Observer) callEvent(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	if st := stateOf(ctx); st != nil {
		st.mu.Lock()
		defer st.mu.Unlock()
		st.flushLocked()
		if st.call.IsRecording() {
			st.call.AddEvent(name, trace.WithAttributes(attrs...))
		}
		return
	}
	spanEvent(ctx, name, attrs...)
}

// transition records a breaker transition as an event of the current span,
// or, when it comes outside any trace (a policy's breaker reports its
// transitions from the breaker's own hook, with no call's context), as a
// span of its own, so that it still shows next to the traces it affects.
// Inside a trace that is not sampled it records nothing.
func (o *Observer) transition(ctx context.Context, e *event.Event) {
	attrs := []attribute.KeyValue{
		attrDependency.String(e.Dependency), attrFrom.String(e.From), attrTo.String(e.To),
		attrReason.String(e.Reason), attrCause.String(e.Detail),
	}
	if e.To == "open" && e.Delay > 0 {
		attrs = append(attrs, attrOpenFor.Float64(ms(e.Delay)))
	}
	span := trace.SpanFromContext(ctx)
	switch {
	case span.IsRecording():
		span.AddEvent(transitionSpanName, trace.WithAttributes(attrs...))
	case !span.SpanContext().IsValid():
		_, span = o.tracer.Start(ctx, transitionSpanName, trace.WithAttributes(attrs...))
		span.End()
	}
}

// spanEvent adds a span event to the span of ctx, if it records.
func spanEvent(ctx context.Context, name string, attrs ...attribute.KeyValue) {
	if span := trace.SpanFromContext(ctx); span.IsRecording() {
		span.AddEvent(name, trace.WithAttributes(attrs...))
	}
}

// Span attributes are set after the span starts, and only on a span that
// records, so an unsampled call allocates little; samplers see the span
// name and parent, not the attributes.
func (o *Observer) startCall(ctx context.Context, e *event.Event) context.Context {
	cc := &callCtx{}
	ctx, cc.call = o.tracer.Start(ctx, callSpanName)
	cc.Context = ctx
	if cc.call.IsRecording() {
		cc.call.SetAttributes(attrDependency.String(e.Dependency))
		if e.Operation != "" {
			cc.call.SetAttributes(attrOperation.String(e.Operation))
		}
		if e.Remaining >= 0 {
			cc.call.SetAttributes(attrRemaining.Float64(ms(e.Remaining)))
		}
	}
	return cc
}

func (o *Observer) startAttempt(ctx context.Context, e *event.Event) context.Context {
	st := stateOf(ctx)
	if st == nil {
		return ctx // the call started before this observer saw it
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.flushLocked()
	ctx, st.attempt = o.tracer.Start(ctx, attemptSpanName)
	st.ended = false
	if st.attempt.IsRecording() {
		st.attempt.SetAttributes(attrAttempt.Int(e.Attempt), attrBackoff.Float64(ms(e.Delay)))
		if e.Remaining >= 0 {
			st.attempt.SetAttributes(attrRemaining.Float64(ms(e.Remaining)))
		}
	}
	return ctx
}

type stateKey struct{}

// callCtx is the context of a call: its parent with the call's span, and
// the call's state, in one allocation.
type callCtx struct {
	context.Context
	callState
}

// Value returns the call's state for stateKey, else the parent's value.
func (c *callCtx) Value(key any) any {
	if key == (stateKey{}) {
		return &c.callState
	}
	return c.Context.Value(key)
}

func stateOf(ctx context.Context) *callState {
	st, _ := ctx.Value(stateKey{}).(*callState)
	return st
}

// callState is the spans of one call. Do reports a timeout of its own
// attempt timer after the attempt's end, so the attempt span is ended
// lazily, at the attempt's end time, when the next event of the call
// arrives: the timeout's phase still lands on the attempt it belongs to.
type callState struct {
	mu      sync.Mutex // events of one call may come from a timer's goroutine
	call    trace.Span
	attempt trace.Span // nil when no attempt is open
	ended   bool       // the attempt ended at endTime; its span is not ended yet
	endTime time.Time
}

func (st *callState) endAttempt(e *event.Event) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.attempt == nil {
		return
	}
	st.ended, st.endTime = true, time.Now()
	if !st.attempt.IsRecording() {
		return
	}
	st.attempt.SetAttributes(attrOutcome.String(e.Outcome))
	if e.Err != nil {
		st.attempt.RecordError(e.Err)
		st.attempt.SetStatus(codes.Error, e.Err.Error())
	}
}

// timeout puts the phase on the current or just ended attempt and reports
// whether there was one.
func (st *callState) timeout(phase string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.attempt == nil {
		return false
	}
	st.attempt.SetAttributes(attrPhase.String(phase))
	return true
}

func (st *callState) flushLocked() {
	if st.attempt != nil && st.ended {
		if st.attempt.IsRecording() {
			st.attempt.End(trace.WithTimestamp(st.endTime))
		} else {
			st.attempt.End()
		}
		st.attempt, st.ended = nil, false
	}
}

func (st *callState) end(e *event.Event) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.attempt != nil && !st.ended {
		st.ended, st.endTime = true, time.Now()
	}
	st.flushLocked()
	if !st.call.IsRecording() {
		st.call.End()
		return
	}
	st.call.SetAttributes(attrOutcome.String(e.Outcome), attrAttempts.Int(e.Attempt))
	if e.Outcome != event.OutcomeOK {
		if e.Err != nil {
			st.call.RecordError(e.Err)
		}
		st.call.SetStatus(codes.Error, e.Outcome)
	}
	st.call.End()
}

// Source is a set of breakers and retry budgets that changes while the
// program runs, read at every collection: *config.Registry is one, whose
// reloads replace the breakers and budgets of the dependencies a policy
// file configures. RangeBreakers calls yield for each breaker in use with
// the dependency its calls name and its key (empty for a dependency's
// only breaker), and RangeBudgets for each dependency's retry budget,
// both until yield returns false. Both must be safe for concurrent use.
// It is extra/prom's Source.
type Source interface {
	RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool)
	RangeBudgets(yield func(dependency string, b *budget.Budget) bool)
}

// WatchSource reads the breakers and budgets of s at every collection,
// from the first one on: a breaker is reported with its dependency and
// key from the moment s holds it, before any transition, and a budget's
// tokens before any refusal. What s no longer holds disappears from the
// next collection. A dependency s reports takes its breaker state and
// budget tokens from s alone, not from events or the other Watch methods.
// Watching s again is a no-op. For a policy file: obs.WatchSource(reg).
func (o *Observer) WatchSource(s Source) { o.gauges.WatchSource(s) }

// WatchShedder reports the in-flight count and limit of s, a load shedder
// whose events name dependency (its Config.Name), at every collection, so
// the gauges are right from the first one and fall back to zero when the
// traffic stops (events report the load only when a request arrives).
func (o *Observer) WatchShedder(dependency string, s *shed.Shedder) {
	o.gauges.WatchShedder(dependency, s)
}

// WatchBreaker reports the state of b under dependency at every
// collection, from the first one on.
func (o *Observer) WatchBreaker(dependency string, b *breaker.Breaker) {
	o.gauges.WatchBreaker(dependency, b)
}

// WatchBreakerGroup reports the state of every breaker g holds at every
// collection, under dependency with the breaker's group key as the key
// attribute; pass "" for a client without a name, whose calls name each key
// as a dependency of its own. See extra/prom's
// Collector.WatchBreakerGroup.
func (o *Observer) WatchBreakerGroup(dependency string, g *breaker.Group) {
	o.gauges.WatchBreakerGroup(dependency, g)
}
