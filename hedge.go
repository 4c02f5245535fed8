package guardrail

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
)

// Defaults of a zero HedgeConfig. The 95th percentile hedges about one call
// in twenty, the slow tail, for about 5 % more requests; 1000 samples are
// enough for a stable p95 and forget a change of latency within a thousand
// calls; 10 s outlasts the Retry-After most overloaded servers ask for.
const (
	DefaultHedgePercentile    = 0.95
	DefaultHedgeWindow        = 1000
	DefaultHedgeOverloadPause = 10 * time.Second
)

// ErrHedgeLost is the cause (context.Cause) of the context of an attempt
// of a hedged call that was cancelled because another attempt answered
// first, or because the call ended. An operation that detaches work from
// its attempt context (an HTTP transport whose response body outlives the
// attempt) ends that work when it sees this cause.
var ErrHedgeLost = errors.New("guardrail: another attempt of the hedged call won")

// hedgeMinSamples is how many latencies an adaptive delay waits for before
// it hedges at all: a percentile of fewer says nothing.
const hedgeMinSamples = 20

// HedgeConfig turns on hedging for a Policy: when an attempt of an
// idempotent call made with DoHedged has not answered after a delay,
// DoHedged sends one more, at
// most MaxHedges, and returns the first success; the other attempts are
// cancelled. Hedging cuts tail latency at the price of load, so it stops
// by itself when load would hurt: a hedge spends a retry budget token and
// is not sent while the budget holds less than half its maximum, while the
// breaker is not closed, or for OverloadPause after the dependency answered
// with an overload signal (a Verdict with RetryAfter, an error whose
// Overload method reports true such as an HTTP 429 or 503).
//
// A hedged call runs each extra attempt on a goroutine of its own (the
// first stays on the caller's), so op must be safe to call concurrently
// with itself and must honour its context: the call returns only once the
// caller's attempt has returned. Calls that are not idempotent are never
// hedged, and neither are calls of a Policy whose Hedge is nil: those start
// no goroutine. Do and DoCall never hedge. (Since the operation may be
// handed to another goroutine, a closure passed to DoHedged is allocated on
// the heap whether the call is hedged or not; one passed to Do or DoCall
// stays on the caller's stack.)
//
// The zero value is valid: hedge after the 95th percentile of the last
// DefaultHedgeWindow successful attempts' latencies, once 20 are known, at
// most one hedge per attempt. A HedgeConfig is a plain value; the Policy
// reads it once, at first use.
type HedgeConfig struct {
	// Delay is how long an attempt runs before a hedge is sent. When
	// Percentile is zero and Delay positive, the delay is fixed. When
	// Percentile is set, Delay is the least adaptive delay (a floor, so a
	// run of quick answers does not make every call a hedged one). Zero
	// with Percentile zero means the DefaultHedgePercentile of recent
	// latency; a negative value is invalid.
	Delay time.Duration
	// Percentile, in (0, 1), makes the delay adaptive: that percentile of
	// the latencies of the last Window successful attempts. Zero means
	// DefaultHedgePercentile when Delay is zero, and a fixed Delay
	// otherwise.
	Percentile float64
	// MaxHedges bounds the extra attempts per attempt: hedge i is sent i
	// delays after the attempt it backs up. Zero means 1; a negative value,
	// or one above MaxHedgeCount, is invalid.
	MaxHedges int
	// Window is how many recent latencies the adaptive delay is computed
	// from. Zero means DefaultHedgeWindow; a value below 20 or negative is
	// invalid (a percentile of fewer is noise), and so is one above
	// MaxHedgeWindow (the window is allocated up front).
	Window int
	// OverloadPause is how long hedging stays off after an overload
	// answer, or as long as its Retry-After asks if that is longer. Zero
	// means DefaultHedgeOverloadPause; a negative value is invalid (hedging
	// that never pauses is what overloads a struggling dependency).
	OverloadPause time.Duration
}

// Validate reports the fields of c that hold invalid values, as Do would
// at first use of a Policy holding it, for callers that build a Policy
// from configuration and want to fail at start-up. The error Is
// ErrInvalidConfig.
// It allocates nothing that the config would need, such as the latency
// window.
func (c HedgeConfig) Validate() error {
	var errs []error
	checkHedge(c, func(field string, v any, want string) {
		errs = append(errs, fmt.Errorf("%w: HedgeConfig.%s is %v; want %s", ErrInvalidConfig, strings.TrimPrefix(field, "Hedge."), v, want))
	})
	return errors.Join(errs...)
}

// Bounds of HedgeConfig, beyond which a configuration is a mistake that
// would cost memory or load up front: every hedged call reserves room for
// MaxHedges copies, and the window is allocated when the Policy is first
// used.
const (
	MaxHedgeCount  = 16
	MaxHedgeWindow = 1 << 20
)

// hedger is a Policy's resolved HedgeConfig and its shared state.
type hedger struct {
	fixed       time.Duration // the fixed delay, or the adaptive floor
	maxHedges   int
	pause       time.Duration
	lat         *latencyRing // nil: fixed delay
	pausedUntil atomic.Int64 // unix nanoseconds
}

// checkHedge reports each invalid field of cfg to bad, and whether there
// was none.
func checkHedge(cfg HedgeConfig, bad func(field string, v any, want string)) bool {
	ok := true
	if cfg.Delay < 0 {
		bad("Hedge.Delay", cfg.Delay, "a positive duration, or zero for an adaptive delay")
		ok = false
	}
	if cfg.Percentile != 0 && !(cfg.Percentile > 0 && cfg.Percentile < 1) {
		bad("Hedge.Percentile", cfg.Percentile, "a value in (0, 1), or zero")
		ok = false
	}
	if cfg.MaxHedges < 0 || cfg.MaxHedges > MaxHedgeCount {
		bad("Hedge.MaxHedges", cfg.MaxHedges, fmt.Sprintf("1 to %d, or zero for 1", MaxHedgeCount))
		ok = false
	}
	if cfg.Window != 0 && (cfg.Window < hedgeMinSamples || cfg.Window > MaxHedgeWindow) {
		bad("Hedge.Window", cfg.Window, fmt.Sprintf("%d to %d, or zero for the default (%d)", hedgeMinSamples, MaxHedgeWindow, DefaultHedgeWindow))
		ok = false
	}
	if cfg.OverloadPause < 0 {
		bad("Hedge.OverloadPause", cfg.OverloadPause, "a positive duration, or zero for the default")
		ok = false
	}
	return ok
}

func newHedger(cfg HedgeConfig, bad func(field string, v any, want string)) *hedger {
	if !checkHedge(cfg, bad) {
		return nil
	}
	h := &hedger{fixed: cfg.Delay, maxHedges: max(cfg.MaxHedges, 1), pause: cfg.OverloadPause}
	if h.pause == 0 {
		h.pause = DefaultHedgeOverloadPause
	}
	pct := cfg.Percentile
	if pct == 0 && cfg.Delay == 0 {
		pct = DefaultHedgePercentile
	}
	if pct > 0 {
		w := cfg.Window
		if w == 0 {
			w = DefaultHedgeWindow
		}
		h.lat = newLatencyRing(w, pct)
	}
	return h
}

// delay returns the hedge delay now, and false when hedging is off (too
// few latencies known yet, or paused after an overload answer).
func (h *hedger) delay(now time.Time) (time.Duration, bool) {
	if now.UnixNano() < h.pausedUntil.Load() {
		return 0, false
	}
	if h.lat == nil {
		return h.fixed, true
	}
	d := h.lat.current()
	if d < 0 {
		return 0, false
	}
	return max(d, h.fixed), true
}

func (h *hedger) paused(now time.Time) bool { return now.UnixNano() < h.pausedUntil.Load() }

// overloaded pauses hedging after an overload answer.
func (h *hedger) overloaded(now time.Time, retryAfter time.Duration) {
	// Saturate: the end of a pause of centuries is past what a Unix time
	// in nanoseconds holds, and wrapping would end the pause at once.
	until := now.UnixNano()
	if d := max(h.pause, retryAfter).Nanoseconds(); d > math.MaxInt64-until {
		until = math.MaxInt64
	} else {
		until += d
	}
	for {
		cur := h.pausedUntil.Load()
		if cur >= until || h.pausedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// observe learns from an attempt that ended at now after d: its latency
// if it succeeded, a pause if it said the dependency is overloaded.
func (h *hedger) observe(classify Classifier, err error, d time.Duration, now time.Time) {
	if err == nil {
		if h.lat != nil {
			h.lat.add(d)
		}
		return
	}
	if v := classify(err); isOverload(err, v) {
		h.overloaded(now, v.RetryAfter)
	}
}

// latencyRing keeps the last len(ring) latencies and a percentile of them,
// recomputed every len(ring)/8 additions by the adder that crosses the
// mark. Adding is two atomic operations; the recomputation sorts a scratch
// copy allocated once, under a mutex that an adder skips when another
// holds it.
type latencyRing struct {
	ring    []atomic.Int64
	next    atomic.Uint64
	pct     float64
	every   uint64
	cur     atomic.Int64 // the percentile, or -1 before hedgeMinSamples
	mu      sync.Mutex
	scratch []int64
}

func newLatencyRing(n int, pct float64) *latencyRing {
	r := &latencyRing{ring: make([]atomic.Int64, n), pct: pct, every: uint64(max(n/8, 1)), scratch: make([]int64, 0, n)}
	r.cur.Store(-1)
	return r
}

func (r *latencyRing) current() time.Duration { return time.Duration(r.cur.Load()) }

func (r *latencyRing) add(d time.Duration) {
	i := r.next.Add(1)
	r.ring[(i-1)%uint64(len(r.ring))].Store(int64(max(d, 1)))
	filling := i < uint64(len(r.ring)) && i%hedgeMinSamples == 0 // early estimates move: recompute often
	if i < hedgeMinSamples || !(i == hedgeMinSamples || filling || i%r.every == 0) {
		return
	}
	if !r.mu.TryLock() {
		return
	}
	defer r.mu.Unlock()
	s := r.scratch[:0]
	for j := range r.ring {
		if v := r.ring[j].Load(); v > 0 {
			s = append(s, v)
		}
	}
	if len(s) < hedgeMinSamples {
		return
	}
	slices.Sort(s)
	k := int(math.Ceil(r.pct*float64(len(s)))) - 1
	r.cur.Store(s[min(max(k, 0), len(s)-1)])
	r.scratch = s
}

// hedgeResult is what one hedge attempt produced.
type hedgeResult[T any] struct {
	v       T
	permit  breaker.Permit
	slot    *bulkhead.Slot // held for Call.Hold; nil: none
	start   time.Time
	end     time.Time
	actx    context.Context
	attempt int
}

// round is one attempt of a hedged call and the hedges sent after it. It
// is shared by the caller and the hedges' goroutines, under mu.
type round[T any] struct {
	c       settled // the call's, copied: the call itself stays on Do's stack, and no goroutine reads what the caller writes
	op      func(context.Context) (T, error)
	delay   time.Duration
	base    int // the attempt number of the caller's attempt
	timer   *time.Timer
	wake    chan struct{}
	mu      sync.Mutex
	over    bool // a winner is chosen or the caller gave up: no more hedges
	primary bool // the caller's attempt returned
	won     *hedgeResult[T]
	sent    int                       // hedges sent
	running int                       // hedges in flight
	cancels []context.CancelCauseFunc // the caller's attempt's first
}

// hedgedAttempt is attempt for a call whose Policy hedges: it runs op on
// the caller's goroutine and, while it has not answered, sends hedges after
// the delay. It returns the first success, or the caller's attempt's
// failure once every hedge in flight has failed too.
func hedgedAttempt[T any](c *call, op func(context.Context) (T, error), actx context.Context, cancel context.CancelFunc) (T, error, bool) {
	h := c.s.hedge
	// The attempt's latency is measured from its start, read by
	// beforeAttempt if it needed the time, and to its end.
	start := c.astart
	if start.IsZero() {
		start = c.clock()
	}
	d, ok := h.delay(start)
	if !ok {
		v, err, timedOut := attempt(c, op, actx, cancel)
		end := c.ended()
		h.observe(c.s.classify, err, end.Sub(start), end)
		return v, err, timedOut
	}
	// A hedge that wins must be able to end the caller's attempt, and say
	// why (ErrHedgeLost), for operations that detach from the context.
	actx, cancelCause := context.WithCancelCause(actx)
	if inner := cancel; inner != nil {
		cancel = func() { cancelCause(nil); inner() }
	} else {
		cancel = func() { cancelCause(nil) }
	}
	r := &round[T]{c: c.settled, op: op, delay: d, base: c.attempts, wake: make(chan struct{}, 1)}
	r.cancels = append(make([]context.CancelCauseFunc, 0, h.maxHedges+1), cancelCause)
	r.mu.Lock()
	r.timer = time.AfterFunc(d, r.launch)
	r.mu.Unlock()

	v, err, timedOut := attempt(c, op, actx, cancel)
	end := c.ended()
	elapsed := end.Sub(start)

	r.mu.Lock()
	r.primary = true
	if r.won == nil && err == nil {
		r.over = true
	}
	if r.won == nil && err != nil {
		if v := c.s.classify(err); isOverload(err, v) {
			h.overloaded(end, v.RetryAfter)
		}
		// No hedge starts after the caller's attempt failed: what follows
		// is the retry decision's to make.
		r.timer.Stop()
		for r.running > 0 && r.won == nil {
			r.mu.Unlock()
			select {
			case <-r.wake:
			case <-c.ctx.Done():
				r.mu.Lock()
				r.over = true
				r.cancelAll()
				r.mu.Unlock()
				r.finish(c)
				return v, err, timedOut
			}
			r.mu.Lock()
		}
	}
	r.over = true
	r.timer.Stop()
	r.cancelAll()
	w := r.won
	r.mu.Unlock()
	r.finish(c)

	if w == nil {
		if err == nil {
			h.observe(c.s.classify, nil, elapsed, end)
		}
		return v, err, timedOut
	}
	// A hedge won. The caller's attempt was cancelled by the round, so the
	// breaker does not count it; its value, if it had one, is released.
	if c.discard != nil {
		// The caller's attempt lost: what it produced is thrown away.
		if err == nil {
			c.discard(v)
		} else {
			c.discard(unmarked(err))
		}
	}
	c.releaseSlot()
	c.permit.Done(breaker.Ignored, 0)
	if c.throttle != nil {
		c.throttle.Record(end, true) // cancelled by us: says nothing against the dependency
	}
	// The winner's attempt is the call's: it is recorded with its own
	// start and end, and its slot is the one the call holds.
	c.permit, c.astart, c.endAt = w.permit, w.start, w.end
	c.held = w.slot
	if c.obs != nil {
		c.actx = w.actx
	}
	return w.v, nil, false
}

// finish adds the hedges sent to the call's attempts.
func (r *round[T]) finish(c *call) {
	r.mu.Lock()
	sent := r.sent
	r.mu.Unlock()
	c.attempts += sent
	c.hedges += sent
}

// cancelAll ends every attempt of the round still running with the cause
// ErrHedgeLost (an attempt that ended already keeps its own cause); the
// caller holds mu.
func (r *round[T]) cancelAll() {
	for _, cancel := range r.cancels {
		cancel(ErrHedgeLost)
	}
}

// signal wakes the caller waiting for the hedges.
func (r *round[T]) signal() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// launch runs on the timer's goroutine: it sends a hedge, if every gate
// lets it, and runs it there.
func (r *round[T]) launch() {
	c, h := &r.c, r.c.s.hedge
	r.mu.Lock()
	if r.over || r.primary {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	n := r.base + r.sent + 1
	reason, permit, slot := r.gate(now)
	if reason != "" {
		r.over = true // gates stay shut for this attempt
		r.mu.Unlock()
		if c.obs != nil {
			e := r.event(event.HedgeRefused, n)
			e.Reason = reason
			c.obs.Observe(c.ctx, e)
		}
		return
	}
	r.sent++
	r.running++
	actx, cancel := context.WithCancelCause(c.ctx)
	if at := c.attemptTimeout; at > 0 {
		var stop context.CancelFunc
		actx, stop = context.WithTimeout(actx, at)
		context.AfterFunc(actx, stop) // frees the timer when the attempt ends
	}
	r.cancels = append(r.cancels, cancel)
	if r.sent < h.maxHedges {
		r.timer.Reset(r.delay)
	}
	r.mu.Unlock()

	if c.obs != nil {
		e := r.event(event.Hedge, n)
		e.Delay = time.Duration(r.sent) * r.delay
		c.obs.Observe(c.ctx, e)
		e = r.event(event.AttemptStart, n)
		actx = c.obs.Observe(actx, e)
	}
	r.run(actx, cancel, permit, slot, n, now)
}

// gate decides whether a hedge may be sent; the caller holds mu. It
// returns the reason it may not, or the breaker permit and the bulkhead
// slot (the zero Slot without a bulkhead) for the hedge.
func (r *round[T]) gate(now time.Time) (string, breaker.Permit, *bulkhead.Slot) {
	c, h := &r.c, r.c.s.hedge
	var none *bulkhead.Slot
	if h.paused(now) {
		return event.ReasonOverload, breaker.Permit{}, none
	}
	if dl, ok := c.ctx.Deadline(); ok && dl.Sub(now) < c.s.minAttempt {
		return event.ReasonDeadline, breaker.Permit{}, none
	}
	if c.pauses != nil {
		if _, ok := c.pauses.Paused(c.dependency, now); ok {
			return event.ReasonPaused, breaker.Permit{}, none
		}
	}
	if b := c.s.budget; b.Tokens() < b.Max()/2 {
		return event.ReasonBudget, breaker.Permit{}, none
	}
	var permit breaker.Permit
	if c.breaker != nil {
		if c.breaker.State() != breaker.Closed {
			return event.ReasonBreakerOpen, breaker.Permit{}, none
		}
		var err error
		if permit, err = c.breaker.AllowAt(now); err != nil {
			return event.ReasonBreakerOpen, breaker.Permit{}, none
		}
	}
	var slot *bulkhead.Slot
	if c.bulkhead != nil {
		// A hedge never queues: a full bulkhead is load enough.
		slot = new(bulkhead.Slot)
		var err error
		if *slot, err = c.bulkhead.AcquireBy(c.ctx, now.Add(-1)); err != nil {
			permit.Done(breaker.Ignored, 0)
			return event.ReasonBulkheadFull, breaker.Permit{}, none
		}
	}
	if c.throttle != nil && !c.throttle.Admit(now, c.s.rand()) {
		release(slot)
		permit.Done(breaker.Ignored, 0)
		return event.ReasonThrottled, breaker.Permit{}, none
	}
	if !c.s.budget.TryRetry() {
		release(slot)
		permit.Done(breaker.Ignored, 0)
		return event.ReasonBudget, breaker.Permit{}, none
	}
	return "", permit, slot
}

// release frees a hedge's slot, if it has one.
func release(slot *bulkhead.Slot) {
	if slot != nil {
		slot.Release()
	}
}

// run runs hedge n and hands its result to the round: a success that
// comes first wins, anything else is recorded here.
func (r *round[T]) run(actx context.Context, cancel context.CancelCauseFunc, permit breaker.Permit, slot *bulkhead.Slot, n int, start time.Time) {
	c := &r.c
	done, kept := false, false
	defer func() {
		if !kept {
			release(slot)
		}
		if !done {
			// The panic goes on up this goroutine's stack, which ends the
			// program as any goroutine's panic does; record it first.
			permit.Done(breaker.Failure, time.Since(start))
			if c.throttle != nil {
				c.throttle.Record(time.Now(), true)
			}
			cancel(nil)
			r.mu.Lock()
			r.running--
			r.mu.Unlock()
			r.signal()
		}
	}()
	v, err := r.op(actx)
	done = true
	now := time.Now()
	d := now.Sub(start)

	r.mu.Lock()
	r.running--
	win := err == nil && r.won == nil && !(r.over && r.primary)
	if win {
		r.won = &hedgeResult[T]{v: v, permit: permit, start: start, end: now, actx: actx, attempt: n}
		if c.hold != nil {
			r.won.slot, kept = slot, true
		}
		r.over = true
		r.timer.Stop()
		cancel(nil) // this attempt has ended, and won: not a loser's cause
		r.cancelAll()
	}
	r.mu.Unlock()
	r.signal()
	if win {
		c.s.hedge.observe(c.s.classify, nil, d, now)
		return // the caller records the winner as its attempt
	}
	cancel(nil)
	o, outcome := breaker.Success, event.AttemptSuccess
	switch {
	case err == nil:
		// It lost the race: its answer is released unread.
		if c.discard != nil {
			c.discard(v)
		}
		if c.throttle != nil {
			c.throttle.Record(now, true)
		}
	case errors.Is(context.Cause(actx), ErrHedgeLost) || c.ctx.Err() != nil:
		// Cancelled because another attempt won, or the caller gave up.
		o, outcome = breaker.Ignored, event.AttemptIgnored
		if c.throttle != nil {
			c.throttle.Record(now, true)
		}
	default:
		v := c.s.classify(err)
		o = v.Outcome
		outcome = o.String()
		over := isOverload(err, v)
		if over {
			c.s.hedge.overloaded(now, v.RetryAfter)
		}
		if c.throttle != nil {
			c.throttle.Record(now, !over && !v.Timeout)
		}
	}
	permit.DoneAt(o, d, now)
	if err != nil && c.discard != nil {
		c.discard(unmarked(err)) // a hedge's failure is never the call's result
	}
	if c.obs != nil {
		e := r.event(event.AttemptEnd, n)
		e.Outcome, e.Duration, e.Err = outcome, d, err
		c.obs.Observe(actx, e)
	}
}

// event builds an event of hedge n from the call's fields that do not
// change during the call, so that a hedge's goroutine reads nothing the
// caller writes.
func (r *round[T]) event(kind event.Kind, n int) event.Event {
	return event.Event{Kind: kind, Dependency: r.c.dependency, Operation: r.c.operation, Attempt: n, Remaining: -1}
}
