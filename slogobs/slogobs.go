// Package slogobs logs guardrail's events with log/slog: every breaker
// transition, and bursts of rejections as summaries.
package slogobs

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/internal/series"
)

// defaultInterval is the summary interval of rejection bursts of a zero
// Config.Interval.
const defaultInterval = 10 * time.Second

// Messages of the records, one per kind of record, so a log query can
// select them; docs/metrics.md lists them.
const (
	msgBreakerTransition = "guardrail: breaker transition"
	msgShed              = "guardrail: requests shed"
	msgBreakerReject     = "guardrail: calls rejected by breaker"
	msgBulkheadReject    = "guardrail: calls rejected by bulkhead"
	msgBudgetExhausted   = "guardrail: retries refused by budget"
	msgStoreError        = "guardrail: idempotency store failing"
	msgOutcomeUnknown    = "guardrail: idempotency outcome unknown"
	msgRetry             = "guardrail: retry"
	msgRetryRefused      = "guardrail: retry refused"
	msgTimeout           = "guardrail: timeout"
	msgCallFailed        = "guardrail: call failed"
	msgIdempotency       = "guardrail: idempotency"
	msgMetastable        = "guardrail: metastability state"
)

// Burst phases, the value of the "burst" attribute of a summary record:
// "start", "ongoing", "end".
const (
	burstStart   = "start"   // the first rejection after a quiet interval, logged at once
	burstOngoing = "ongoing" // rejections during the last interval
	burstEnd     = "end"     // a whole interval without rejection: the burst is over
)

// ErrInvalidConfig is the error every invalid Config field Is. The error
// New returns names the field, what it held and what is allowed.
var ErrInvalidConfig = errors.New("slogobs: invalid config")

// Config configures an Observer. The zero Config is valid. A Config is a
// plain value: New reads it once, so changing it afterwards has no effect;
// the Logger and BreakerConfig it holds are called from many goroutines and
// must be safe for concurrent use.
type Config struct {
	// Logger receives the records. Nil means slog.Default() at the time
	// of each record.
	Logger *slog.Logger

	// Interval is how often a burst of rejections is summarised: one
	// record at its start, then at most one per Interval per dependency
	// and kind of rejection while it lasts, and one when a whole Interval
	// passed without any. Zero means 10 s; a negative
	// value is invalid (a burst always needs an interval to be summarised
	// over).
	Interval time.Duration

	// BreakerConfig returns the effective configuration of the breaker of
	// a dependency, logged under "config" with each of its transitions.
	// Nil means no configuration is logged. breaker.Config implements
	// slog.LogValuer, so for a policy's breaker this is
	//
	//	func(string) slog.Value { return p.BreakerInUse().Config().LogValue() }
	BreakerConfig func(dependency string) slog.Value
}

// Observer is an event.Observer that logs with log/slog:
//
//   - each breaker transition, with its reason (a fixed set), its cause in
//     words with the numbers that decided it ("failure rate 0.55 of 20
//     calls >= 0.5"), how long it stays open, and the breaker's
//     configuration from Config.BreakerConfig: at Warn when the breaker
//     opens, at Info otherwise;
//   - bursts of rejections (load shed, breaker rejections, full bulkheads,
//     retries refused by the budget, idempotency store errors, and requests
//     whose outcome the idempotency middleware could not know because the
//     handler panicked or took the connection: their keys answer 500 until
//     they expire) summarised
//     per dependency, never one line per rejected request: a record when
//     the burst starts, at most one per Config.Interval with the counts by
//     reason (and priority), and one when it ends;
//   - at Debug, only when the logger has Debug enabled: every retry,
//     refused retry, timeout, failed call and idempotency decision.
//
// Summaries are written by a timer (time.AfterFunc) per active burst:
// there is no goroutine while nothing is being rejected. Call Close when
// done to write the pending summaries and stop the timers.
//
// An Observer is safe for concurrent use.
type Observer struct {
	logger        *slog.Logger
	interval      time.Duration
	breakerConfig func(string) slog.Value
	deps          *series.Folder // bounds the bursts held

	mu      sync.Mutex
	bursts  map[burstKey]*burst
	closed  bool
	writing int        // summaries being written by timers, outside mu
	written *sync.Cond // signalled when writing drops to 0; uses mu
}

// burstKey is a kind of rejection of one dependency. Idempotency
// decisions of two reasons (store errors, unknown outcomes) are bursts of
// their own.
type burstKey struct {
	kind   event.Kind
	reason string // for event.Idempotency only
	dep    string
}

// burst counts the rejections of one kind for one dependency.
type burst struct {
	start       time.Time      // of the burst
	windowStart time.Time      // of the current interval
	count       int            // in the current interval
	total       int            // since the start
	byReason    map[string]int // in the current interval
	byPriority  map[string]int // in the current interval (shed only)
	maxInFlight int
	limit       int
	tokens      float64
	lastErr     string
	timer       *time.Timer
}

// New returns an Observer configured by cfg, or an error that Is
// ErrInvalidConfig and names the invalid field.
func New(cfg Config) (*Observer, error) {
	iv := cfg.Interval
	switch {
	case iv == 0:
		iv = defaultInterval
	case iv < 0:
		return nil, &series.ConfigError{Pkg: "slogobs", Field: "Config.Interval", Value: iv.String(),
			Want: "0 (the default, 10s) or more", Sentinel: ErrInvalidConfig}
	}
	o := &Observer{
		logger:        cfg.Logger,
		interval:      iv,
		breakerConfig: cfg.BreakerConfig,
		deps:          series.NewFolder(series.DefaultMaxValues),
		bursts:        make(map[burstKey]*burst),
	}
	o.written = sync.NewCond(&o.mu)
	return o, nil
}

func (o *Observer) log() *slog.Logger {
	if o.logger != nil {
		return o.logger
	}
	return slog.Default()
}

// Observe logs e as described on Observer. It implements event.Observer
// and returns ctx unchanged.
func (o *Observer) Observe(ctx context.Context, e event.Event) context.Context {
	switch e.Kind {
	case event.BreakerTransition:
		o.transition(ctx, &e)
	case event.Metastable:
		level := slog.LevelInfo
		if e.To == "metastable" {
			level = slog.LevelWarn
		}
		o.log().LogAttrs(ctx, level, msgMetastable, slog.String("dependency", e.Dependency),
			slog.String("from", e.From), slog.String("to", e.To), slog.Bool("relief", e.Reason == event.ReasonRelief),
			slog.String("cause", e.Detail))
	case event.Shed, event.BreakerReject, event.BulkheadReject, event.BudgetExhausted:
		o.reject(ctx, &e)
	case event.Idempotency:
		if e.Reason == event.ReasonStoreError || e.Reason == event.ReasonOutcomeUnknown {
			o.reject(ctx, &e)
			break
		}
		o.debug(ctx, msgIdempotency, &e, slog.String("outcome", e.Reason))
	case event.Retry:
		o.debug(ctx, msgRetry, &e, slog.Int("attempt", e.Attempt), slog.Duration("delay", e.Delay), slog.String("reason", e.Reason), errAttr(e.Err))
	case event.RetryRefused:
		o.debug(ctx, msgRetryRefused, &e, slog.Int("attempt", e.Attempt), slog.String("reason", e.Reason), errAttr(e.Err))
	case event.Timeout:
		o.debug(ctx, msgTimeout, &e, slog.Int("attempt", e.Attempt), slog.String("phase", e.Phase), errAttr(e.Err))
	case event.CallEnd:
		if e.Outcome != event.OutcomeOK {
			o.debug(ctx, msgCallFailed, &e, slog.String("outcome", e.Outcome), slog.Int("attempts", e.Attempt),
				slog.Duration("duration", e.Duration), errAttr(e.Err))
		}
	}
	return ctx
}

func errAttr(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.String("error", err.Error())
}

func (o *Observer) debug(ctx context.Context, msg string, e *event.Event, attrs ...slog.Attr) {
	l := o.log()
	if !l.Enabled(ctx, slog.LevelDebug) {
		return
	}
	all := append([]slog.Attr{slog.String("dependency", e.Dependency), slog.String("operation", e.Operation)}, attrs...)
	l.LogAttrs(ctx, slog.LevelDebug, msg, all...)
}

func (o *Observer) transition(ctx context.Context, e *event.Event) {
	level := slog.LevelInfo
	if e.To == "open" {
		level = slog.LevelWarn
	}
	cause := e.Detail
	if cause == "" {
		cause = e.Reason
	}
	attrs := []slog.Attr{
		slog.String("dependency", e.Dependency),
		slog.String("from", e.From),
		slog.String("to", e.To),
		slog.String("reason", e.Reason),
		slog.String("cause", cause),
	}
	if e.To == "open" && e.Delay > 0 {
		attrs = append(attrs, slog.Duration("open_for", e.Delay))
	}
	if o.breakerConfig != nil {
		attrs = append(attrs, slog.Attr{Key: "config", Value: o.breakerConfig(e.Dependency)})
	}
	o.log().LogAttrs(ctx, level, msgBreakerTransition, attrs...)
}

func (o *Observer) reject(ctx context.Context, e *event.Event) {
	k := burstKey{kind: e.Kind, dep: o.deps.Fold(e.Dependency)}
	if e.Kind == event.Idempotency {
		k.reason = e.Reason
	}
	now := time.Now()
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	b := o.bursts[k]
	if b == nil {
		b = &burst{start: now, windowStart: now, total: 1}
		o.bursts[k] = b
		b.timer = time.AfterFunc(o.interval, func() { o.tick(k) })
		o.mu.Unlock()
		o.logStart(ctx, k, e)
		return
	}
	b.add(e)
	o.mu.Unlock()
}

// add counts e; the caller holds Observer.mu.
func (b *burst) add(e *event.Event) {
	b.count++
	b.total++
	if e.Reason != "" {
		if b.byReason == nil {
			b.byReason = make(map[string]int)
		}
		if len(b.byReason) < series.DefaultMaxValues || b.byReason[e.Reason] > 0 {
			b.byReason[e.Reason]++
		} else {
			b.byReason[series.Other]++
		}
	}
	if e.Priority != "" {
		if b.byPriority == nil {
			b.byPriority = make(map[string]int)
		}
		if len(b.byPriority) < series.DefaultMaxValues || b.byPriority[e.Priority] > 0 {
			b.byPriority[e.Priority]++
		} else {
			b.byPriority[series.Other]++
		}
	}
	b.maxInFlight = max(b.maxInFlight, e.InFlight)
	b.limit = e.Limit
	b.tokens = e.Tokens
	if e.Err != nil {
		b.lastErr = e.Err.Error()
	}
}

// summary is what one record of a burst says.
type summary struct {
	key                  burstKey
	phase                string
	count, total         int
	window, length       time.Duration
	byReason, byPriority map[string]int
	maxInFlight, limit   int
	tokens               float64
	lastErr              string
}

// take returns the current interval's summary and starts the next one; the
// caller holds Observer.mu.
func (b *burst) take(k burstKey, phase string, now time.Time) summary {
	s := summary{
		key: k, phase: phase, count: b.count, total: b.total,
		window: now.Sub(b.windowStart), length: now.Sub(b.start),
		byReason: b.byReason, byPriority: b.byPriority,
		maxInFlight: b.maxInFlight, limit: b.limit, tokens: b.tokens, lastErr: b.lastErr,
	}
	b.count, b.byReason, b.byPriority, b.maxInFlight, b.windowStart = 0, nil, nil, 0, now
	return s
}

// tick ends an interval of burst k: a summary if there were rejections,
// else the end of the burst.
func (o *Observer) tick(k burstKey) {
	now := time.Now()
	o.mu.Lock()
	b := o.bursts[k]
	if o.closed || b == nil {
		o.mu.Unlock()
		return
	}
	phase := burstOngoing
	if b.count == 0 {
		phase = burstEnd
		delete(o.bursts, k)
	} else {
		b.timer.Reset(o.interval)
	}
	s := b.take(k, phase, now)
	if phase == burstEnd && s.total == 1 {
		o.mu.Unlock()
		return // a lone rejection: its start record said it all
	}
	// Write without holding mu, so a slow handler does not hold up the
	// requests being rejected; Close waits for it.
	o.writing++
	o.mu.Unlock()
	o.logSummary(context.Background(), s)
	o.mu.Lock()
	if o.writing--; o.writing == 0 {
		o.written.Broadcast()
	}
	o.mu.Unlock()
}

// Close writes the summary of every burst in progress and stops their
// timers; when it returns, every summary has been written. Rejections
// observed after Close are no longer logged; breaker transitions and Debug
// records still are.
func (o *Observer) Close() error {
	now := time.Now()
	o.mu.Lock()
	o.closed = true
	for o.writing > 0 {
		o.written.Wait()
	}
	var pending []summary
	for k, b := range o.bursts {
		b.timer.Stop()
		if b.count > 0 {
			pending = append(pending, b.take(k, burstOngoing, now))
		}
	}
	clear(o.bursts)
	o.mu.Unlock()
	sort.Slice(pending, func(i, j int) bool {
		a, b := pending[i].key, pending[j].key
		if a.kind != b.kind {
			return a.kind < b.kind
		}
		if a.reason != b.reason {
			return a.reason < b.reason
		}
		return a.dep < b.dep
	})
	for _, s := range pending {
		o.logSummary(context.Background(), s)
	}
	return nil
}

func kindMessage(k burstKey) (string, slog.Level) {
	switch k.kind {
	case event.Shed:
		return msgShed, slog.LevelWarn
	case event.BreakerReject:
		return msgBreakerReject, slog.LevelWarn
	case event.BulkheadReject:
		return msgBulkheadReject, slog.LevelWarn
	case event.BudgetExhausted:
		return msgBudgetExhausted, slog.LevelWarn
	}
	if k.reason == event.ReasonOutcomeUnknown {
		return msgOutcomeUnknown, slog.LevelWarn
	}
	return msgStoreError, slog.LevelError
}

func (o *Observer) logStart(ctx context.Context, k burstKey, e *event.Event) {
	msg, level := kindMessage(k)
	attrs := []slog.Attr{
		slog.String("dependency", e.Dependency),
		slog.String("burst", burstStart),
		slog.String("operation", e.Operation),
	}
	switch k.kind {
	case event.Shed:
		attrs = append(attrs, slog.String("priority", e.Priority), slog.String("reason", e.Reason),
			slog.Int("in_flight", e.InFlight), slog.Int("limit", e.Limit))
	case event.BreakerReject:
		attrs = append(attrs, slog.Duration("retry_in", e.Delay))
	case event.BulkheadReject:
		attrs = append(attrs, slog.String("reason", e.Reason), slog.Int("in_flight", e.InFlight), slog.Int("limit", e.Limit))
	case event.BudgetExhausted:
		attrs = append(attrs, slog.Float64("tokens", e.Tokens))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error", e.Err.Error()))
	}
	attrs = append(attrs, slog.Duration("summary_every", o.interval))
	o.log().LogAttrs(ctx, level, msg, attrs...)
}

func (o *Observer) logSummary(ctx context.Context, s summary) {
	msg, level := kindMessage(s.key)
	if s.phase == burstEnd {
		level = slog.LevelInfo
	}
	attrs := []slog.Attr{
		slog.String("dependency", s.key.dep),
		slog.String("burst", s.phase),
		slog.Int("count", s.count),
		slog.Duration("window", s.window),
		slog.Int("total", s.total),
		slog.Duration("burst_duration", s.length),
	}
	if s.phase != burstEnd {
		if len(s.byReason) > 0 {
			attrs = append(attrs, countsGroup("by_reason", s.byReason))
		}
		if len(s.byPriority) > 0 {
			attrs = append(attrs, countsGroup("by_priority", s.byPriority))
		}
		switch s.key.kind {
		case event.Shed, event.BulkheadReject:
			attrs = append(attrs, slog.Int("max_in_flight", s.maxInFlight), slog.Int("limit", s.limit))
		case event.BudgetExhausted:
			attrs = append(attrs, slog.Float64("tokens", s.tokens))
		}
		if s.lastErr != "" {
			attrs = append(attrs, slog.String("last_error", s.lastErr))
		}
	}
	o.log().LogAttrs(ctx, level, msg, attrs...)
}

func countsGroup(key string, m map[string]int) slog.Attr {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]any, 0, len(keys))
	for _, k := range keys {
		attrs = append(attrs, slog.Int(k, m[k]))
	}
	return slog.Group(key, attrs...)
}
