package guardrail

import (
	"context"
	"errors"
	"math"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
)

// Do runs op under p and returns its result. p may be nil (see Policy).
//
// Before every attempt Do checks the time left on ctx: below
// Policy.MinAttemptTime it stops with ErrDeadline. It then asks the breaker
// (an open one stops the call with ErrCircuitOpen, without running op) and
// takes a bulkhead slot if the Policy has a bulkhead (ErrBulkheadFull when
// none frees up before the deadline minus MinAttemptTime). It runs the
// attempt under min(AttemptTimeout, time left); op's context is done when
// the attempt ends, so whatever op started is cancelled, not abandoned. A
// failed attempt is classified; Do retries only a retryable failure of an
// idempotent operation (or one that was never sent), while attempts remain,
// the delay before the retry plus MinAttemptTime fits in the time left, and
// the retry budget grants a token. The delay is the server's Retry-After
// when it gave one, else the backoff's. Cancelling ctx ends a wait at once.
//
// Do returns exactly one of:
//
//   - op's value and a nil error, on success;
//   - the zero T and the last attempt's error as op returned it, for a
//     failure that is not retried (permanent, or the operation is not
//     idempotent) or when attempts are exhausted;
//   - the zero T and an *Error that Is ErrDeadline, ErrBudgetExhausted,
//     ErrOutcomeUnknown, ErrCircuitOpen or ErrBulkheadFull and wraps the
//     last attempt's error (or, when no attempt ran, the context's, the
//     breaker's or the bulkhead's error). A breaker that opens between
//     attempts ends the retries at once with ErrCircuitOpen;
//   - the zero T and op's error or ctx.Err() when the caller cancelled ctx
//     (context.Canceled; a passed deadline is ErrDeadline);
//   - the zero T and an *Error that Is ErrThrottled, without sending the
//     attempt, when the Policy's Throttler rejected it;
//   - the zero T and an error wrapping ErrInvalidConfig, without running op,
//     when a Policy field holds an invalid value.
//
// Do starts no goroutine and never hedges, so op stays on the caller's
// stack: passing a closure costs no allocation. DoHedged is Do with
// hedging. A panic in op is recorded (the attempt counts as a failure) and
// then continues up the caller's stack.
func Do[T any](ctx context.Context, p *Policy, op func(context.Context) (T, error)) (T, error) {
	return DoCall(ctx, p, Call{}, op)
}

// Idempotence says whether one call may be repeated, for Call.Idempotent.
// Its zero value defers to the Policy. It is a plain value, safe for
// concurrent use.
type Idempotence uint8

// The values of Idempotence.
const (
	// IdempotenceOfPolicy, the zero value, means as Policy.Idempotent says.
	IdempotenceOfPolicy Idempotence = iota
	// Idempotent marks this call as safe to repeat, whatever the Policy
	// says (a GET through a policy for writes).
	Idempotent
	// NotIdempotent marks this call as unsafe to repeat, whatever the
	// Policy says (a POST without an idempotency key through a policy for
	// reads).
	NotIdempotent
)

// Call refines a Policy for one call, for callers such as an HTTP transport
// that decide per request what Do otherwise reads from the Policy. The zero
// Call changes nothing: every field's zero value means "as the Policy
// says". A Call is a plain value that DoCall copies; the Breaker and
// Bulkhead it points to are safe for concurrent use.
type Call struct {
	// Idempotent, when not IdempotenceOfPolicy, replaces
	// Policy.Idempotent for this call.
	Idempotent Idempotence
	// Dependency, when not empty, replaces Policy.Name in this call's events
	// (an HTTP transport reports the host).
	Dependency string
	// Breaker, when not nil, replaces the Policy's breaker for this call
	// (one breaker per host, route or shard, from a breaker.Group).
	Breaker *breaker.Breaker
	// Bulkhead, when not nil, replaces Policy.Bulkhead for this call. Do
	// frees the slot when op returns, so work that outlives op (an HTTP
	// response body read later) is not covered: hold a slot yourself for it.
	Bulkhead *bulkhead.Bulkhead
	// Throttler, when not nil, replaces Policy.Throttler for this call (one
	// throttle per host).
	Throttler *Throttler
	// NoHedge, when true, keeps this call from being hedged though the
	// Policy hedges (a request whose body cannot be sent twice).
	NoHedge bool
	// Discard, when not nil, is given each value of T that an attempt of a
	// hedged call returned with a nil error but that lost the race to
	// another attempt, so that what it holds is released (an HTTP
	// response's body closed). It may run on another goroutine than the
	// caller's, after Do returned.
	Discard func(v any)
}

// DoCall is Do with per-call settings c. p may be nil (see Policy). Like
// Do, it never hedges.
func DoCall[T any](ctx context.Context, p *Policy, c Call, op func(context.Context) (T, error)) (T, error) {
	var cl call
	if err := cl.init(ctx, p, c); err != nil {
		var zero T
		return zero, err
	}
	return run(&cl, op)
}

// DoHedged is DoCall with hedging: when the Policy has a Hedge and the call
// is idempotent (and c.NoHedge is false), an attempt that has not answered
// after the hedge delay gets a second one alongside it, up to
// HedgeConfig.MaxHedges; the first good answer wins and the others are
// cancelled. Each extra attempt runs on a goroutine of its own, which is why
// hedging has its own entry point: op outlives the call on a loser's
// goroutine, so it is moved to the heap, an allocation Do and DoCall do not
// pay. Without a Hedge, DoHedged behaves as DoCall.
func DoHedged[T any](ctx context.Context, p *Policy, c Call, op func(context.Context) (T, error)) (T, error) {
	var cl call
	if err := cl.init(ctx, p, c); err != nil {
		var zero T
		return zero, err
	}
	if cl.s.hedge != nil && cl.idempotent && !c.NoHedge {
		cl.hedged = true
		return runHedged(&cl, op)
	}
	return run(&cl, op)
}

// init resolves the call's settings into cl, a zero call: the Policy's,
// refined by c.
func (cl *call) init(ctx context.Context, p *Policy, c Call) error {
	if p == nil {
		p = &defaultPolicy
	}
	s := p.settings()
	if s.err != nil {
		return s.err
	}
	// Field by field into the zero call the caller declared: a composite
	// literal would be built aside and then copied in, with write barriers,
	// which cost more than the rest of a failed attempt.
	cl.ctx, cl.p, cl.s, cl.obs = ctx, p, s, p.Observer
	cl.idempotent, cl.dependency, cl.discard = p.Idempotent, c.Dependency, c.Discard
	cl.breaker, cl.bulkhead, cl.throttle = s.breaker, p.Bulkhead, p.Throttler
	switch c.Idempotent {
	case Idempotent:
		cl.idempotent = true
	case NotIdempotent:
		cl.idempotent = false
	}
	if c.Breaker != nil {
		cl.breaker = c.Breaker
	}
	if c.Bulkhead != nil {
		cl.bulkhead = c.Bulkhead
	}
	if c.Throttler != nil {
		cl.throttle = c.Throttler
	}
	return nil
}

// run is the retry loop of an unhedged call. It must not hand op to
// anything that keeps it, or op escapes to the heap for every call.
func run[T any](c *call, op func(context.Context) (T, error)) (T, error) {
	var zero T
	if c.dependency == "" {
		c.dependency = c.p.Name
	}
	c.begin()
	defer c.cleanup()
	for {
		actx, cancel, err := c.beforeAttempt()
		if err != nil {
			return zero, c.end(err)
		}
		v, err, timedOut := attempt(c, op, actx, cancel)
		if err == nil {
			c.succeeded()
			return v, nil
		}
		if err := c.failed(err, timedOut); err != nil {
			return zero, c.end(err)
		}
	}
}

// runHedged is run with hedged attempts.
func runHedged[T any](c *call, op func(context.Context) (T, error)) (T, error) {
	var zero T
	if c.dependency == "" {
		c.dependency = c.p.Name
	}
	c.begin()
	defer c.cleanup()
	for {
		actx, cancel, err := c.beforeAttempt()
		if err != nil {
			return zero, c.end(err)
		}
		v, err, timedOut := hedgedAttempt(c, op, actx, cancel)
		if err == nil {
			c.succeeded()
			return v, nil
		}
		if err := c.failed(err, timedOut); err != nil {
			return zero, c.end(err)
		}
	}
}

// attempt runs op once. The deferred function cancels the attempt's context,
// frees the bulkhead slot and, if op panicked, records the failed attempt
// before the panic goes on.
func attempt[T any](c *call, op func(context.Context) (T, error), actx context.Context, cancel context.CancelFunc) (v T, err error, timedOut bool) {
	done := false
	defer func() {
		if cancel != nil {
			cancel()
		}
		c.slot.Release() // a no-op without a bulkhead
		if !done {
			c.panicked()
		}
	}()
	v, err = op(actx)
	done = true
	if c.bounded {
		// Before cancel: a context still live bounds how long the attempt
		// took (see beforeAttempt).
		c.live = actx.Err() == nil
	}
	if err != nil && cancel != nil {
		// Before cancel: was it our attempt timeout that ended the attempt?
		timedOut = errors.Is(actx.Err(), context.DeadlineExceeded) && c.ctx.Err() == nil
	}
	return v, err, timedOut
}

// call is the state of one Do. It lives on Do's stack.
type call struct {
	ctx         context.Context
	p           *Policy
	s           *settings
	obs         event.Observer
	idempotent  bool
	dependency  string
	breaker     *breaker.Breaker   // nil: none
	bulkhead    *bulkhead.Bulkhead // nil: none
	throttle    *Throttler         // nil: none
	discard     func(any)          // Call.Discard
	hedged      bool               // attempts are hedged
	hedges      int                // hedges sent (counted in attempts too)
	permit      breaker.Permit     // the current attempt's
	slot        bulkhead.Slot      // the current attempt's; zero without a bulkhead
	actx        context.Context    // the current attempt's context, as the observer returned it
	operation   string             // event.Operation(ctx); set only when observed
	deadline    time.Time          // ctx's deadline
	hasDeadline bool
	timed       bool          // attempt durations are needed
	attempts    int           // attempts started
	retries     int           // retries granted so far
	delay       time.Duration // delay waited before the current attempt
	lastErr     error
	timer       *time.Timer
	start       time.Time // call start; set only when observed
	astart      time.Time // attempt start; set only when timed
	remain      time.Duration
	outcome     string // the CallEnd outcome of a call that fails; "" means event.OutcomeError

	// The clock, read at most once per attempt (see beforeAttempt).
	ref          time.Time // what later reads measure from with the monotonic clock alone (see clock); zero before the first
	monoDeadline bool      // the deadline has a monotonic reading: it is ref
	now          time.Time // the current attempt's start, read or derived; zero when nothing needed it
	fresh        bool      // now was read by this attempt's beforeAttempt
	endAt        time.Time // the current attempt's end, once read
	bounded      bool      // the attempt's context ends within one bucket of the windows its result goes into
	live         bool      // bounded, and the attempt's context was not done when op returned
}

func (c *call) begin() {
	c.s.budget.Deposit()
	c.timed = c.obs != nil || (c.breaker != nil && c.breaker.Timed())
	// Read once per call, not once per attempt or event: the context chain
	// only grows (an observer's span) and neither value changes within a
	// call.
	c.deadline, c.hasDeadline = c.ctx.Deadline()
	if c.hasDeadline && c.deadline != c.deadline.Round(0) { // Round(0) strips the monotonic reading
		c.ref, c.monoDeadline = c.deadline, true
	}
	if c.obs == nil {
		return
	}
	c.operation = event.Operation(c.ctx)
	c.start = c.clock()
	c.ctx = c.obs.Observe(c.ctx, c.event(event.CallStart, c.start))
}

// clockReads, when not nil, is called at every clock read Do makes and at
// every Done that leaves the breaker to read the clock, so that a test can
// count them. (A breaker that is not closed reads the clock in Allow and
// Refusal too; those are not counted.) It is nil outside tests: the cost
// is a load and a branch where it is checked.
var clockReads func()

// mayRead counts a read the breaker may make, for clockReads.
func mayRead() {
	if clockReads != nil {
		clockReads()
	}
}

// clock reads the clock. The first read of a call is time.Now, unless the
// context's deadline carries a monotonic reading (time.Now().Add does, as
// in context.WithTimeout; time.Unix does not); every other one measures
// from that first reading or from the deadline with the monotonic clock
// alone, t.Add(time.Since(t)), which costs about four fifths of time.Now
// (time.Since alone, without the Add, three fifths). The result has both
// readings, so it compares with the deadline, the breaker's epoch and
// other readings exactly as time.Now's would.
func (c *call) clock() time.Time {
	if clockReads != nil {
		clockReads()
	}
	if c.ref.IsZero() {
		c.ref = time.Now()
		return c.ref
	}
	return c.ref.Add(time.Since(c.ref))
}

// left reads the time left before the deadline, for an attempt that may
// need no time.Time at all; the attempt's start, if asked for later, is
// then the deadline minus it. It is for a deadline with a monotonic
// reading (c.ref is the deadline).
func (c *call) left() time.Duration {
	if clockReads != nil {
		clockReads()
	}
	return time.Until(c.deadline)
}

// ended returns the time the current attempt ended, reading the clock the
// first time it is asked for: every use after op returned (the breaker,
// the throttle, the retry decision, the events) shares one read.
func (c *call) ended() time.Time {
	if c.endAt.IsZero() {
		c.endAt = c.clock()
	}
	return c.endAt
}

// resultAt returns the time to record the attempt's result at in the
// breaker's and the throttle's windows: its end if that has been read,
// else its start when the attempt is known to have ended less than one of
// their buckets after it (see beforeAttempt), else its end.
func (c *call) resultAt() time.Time {
	if c.endAt.IsZero() && c.live {
		return c.now
	}
	return c.ended()
}

// done records an untimed attempt's outcome in the breaker.
func (c *call) done(o breaker.Outcome) {
	switch {
	case o == breaker.Ignored || c.breaker == nil || c.breaker == c.s.breaker && c.s.breakerBucket == noWindow:
		c.permit.Done(o, 0) // reads no clock
	case !c.endAt.IsZero():
		c.permit.DoneAt(o, 0, c.endAt)
	case c.live:
		c.permit.DoneAt(o, 0, c.now)
	default:
		// The breaker reads the clock only if its window needs it, with the
		// monotonic clock alone.
		mayRead()
		c.permit.Done(o, 0)
	}
}

// recordLimit is how much later than its attempt's start a result may be
// recorded at that start: one bucket of the narrowest window it goes into,
// which is within the granularity of that window. A breaker other than the
// Policy's (a Call's, from a breaker.Group) has a window Do does not know
// without a cost: its results are recorded at their end.
// It is -1 when nothing records the result at a time (no breaker, or one
// without a time window, and no throttle): then no time is worth taking.
func (c *call) recordLimit() time.Duration {
	limit := noWindow
	if c.breaker != nil {
		if c.breaker != c.s.breaker {
			return -1
		}
		limit = c.s.breakerBucket
	}
	if c.throttle != nil {
		limit = min(limit, time.Duration(c.throttle.width))
	}
	if limit == noWindow {
		return -1
	}
	return limit
}

// noWindow is the bucket width of a breaker that records no time.
const noWindow = time.Duration(math.MaxInt64)

func (c *call) cleanup() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// beforeAttempt checks what must hold before an attempt starts (time left,
// breaker, bulkhead, in that order: the cheapest refusal first, and no slot
// taken for an attempt the breaker refuses), then builds the attempt's
// context.
//
// It reads the clock at most once, and only when something needs the time:
// the deadline check, the throttle, or an attempt duration. A retry of an
// untimed call does not read it at all: it starts when its wait ends, at
// the previous attempt's end (read for the retry decision) plus the delay.
// That is exact but for the timer waking up late, which the retry
// decision has allowed for: it granted the retry because delay plus
// MinAttemptTime fit in the time left. A deadline that passed meanwhile
// still ends the call with ErrDeadline, without an attempt.
func (c *call) beforeAttempt() (context.Context, context.CancelFunc, error) {
	var now time.Time
	// fromLeft: now is not read yet but is the deadline minus c.remain, read
	// here; fresh: now (or fromLeft) was read here, and no bulkhead wait
	// came since.
	fromLeft, fresh := false, false
	switch {
	case c.attempts == 0:
		now = c.start // read by begin when observed; zero otherwise
	case !c.timed && !c.hedged && !c.endAt.IsZero():
		now = c.endAt.Add(c.delay)
	}
	c.endAt, c.bounded, c.live = time.Time{}, false, false
	c.remain = -1
	if c.hasDeadline {
		switch {
		case !now.IsZero():
			if c.attempts > 0 {
				if err := c.ctx.Err(); err != nil && errors.Is(err, context.DeadlineExceeded) {
					return nil, nil, c.giveUp(ErrDeadline, 0)
				}
			}
			c.remain = c.deadline.Sub(now)
		case c.monoDeadline:
			// The time left is all that the checks below may need: read it
			// alone, and derive now from it if they need that too.
			c.remain, fromLeft, fresh = c.left(), true, true
		default:
			now, fresh = c.clock(), true
			c.remain = c.deadline.Sub(now)
		}
		if c.remain < c.s.minAttempt {
			return nil, nil, c.giveUp(ErrDeadline, 0)
		}
	}
	if c.throttle != nil {
		switch {
		case !now.IsZero():
		case fromLeft:
			now = c.fromLeft()
		default:
			now, fresh = c.clock(), true
		}
		if !c.throttle.admit(now, c.s.rand()) {
			return nil, nil, c.throttled()
		}
	}
	if c.breaker != nil {
		var err error
		if now.IsZero() && fromLeft && c.breaker.State() != breaker.Closed {
			now = c.fromLeft()
		}
		if now.IsZero() {
			c.permit, err = c.breaker.Allow() // reads the clock only when not closed
		} else {
			c.permit, err = c.breaker.AllowAt(now)
		}
		if err != nil {
			return nil, nil, c.rejected(err)
		}
		if c.obs != nil && c.permit.Probe() {
			c.obs.Observe(c.ctx, c.event(event.BreakerProbe, time.Time{}))
		}
	}
	if c.bulkhead != nil {
		var latest time.Time
		if c.hasDeadline {
			latest = c.deadline.Add(-c.s.minAttempt)
		}
		var err error
		if c.slot, err = c.bulkhead.AcquireBy(c.ctx, latest); err != nil {
			c.permit.Done(breaker.Ignored, 0) // frees a probe slot
			return nil, nil, c.bulkheadRejected(err)
		}
		fresh = false // a wait for a slot may have made now old
	}
	if fromLeft && now.IsZero() && (c.timed || fresh && c.s.attemptTimeout > 0 && c.remain > c.s.attemptTimeout) {
		now = c.fromLeft()
	}
	c.attempts++
	actx := c.ctx
	var cancel context.CancelFunc
	// The attempt ends by bound after start at the latest, if its context
	// is live when op returns; bound < 0: no bound.
	start, bound := now, c.remain
	if at := c.s.attemptTimeout; at > 0 {
		switch {
		case c.hasDeadline && c.remain <= at:
			// The caller's deadline comes first: no timer needed, only the
			// promise that op's context ends with the attempt.
			actx, cancel = context.WithCancel(c.ctx)
		case fresh:
			// Arm the timer from the reading just made rather than let
			// WithTimeout read the clock again.
			actx, cancel = context.WithDeadline(c.ctx, now.Add(at))
			bound = at
		default:
			actx, cancel = context.WithTimeout(c.ctx, at)
			// WithTimeout read the clock: its deadline minus at is that
			// reading, unless the caller's deadline came first.
			if d, ok := actx.Deadline(); ok && (!c.hasDeadline || d.Before(c.deadline)) {
				start, bound = d.Add(-at), at
			}
		}
	}
	if c.timed {
		switch {
		case !now.IsZero():
		case !start.IsZero():
			now = start
		default:
			now = c.clock()
		}
		c.astart = now
	}
	// A result may be recorded at the attempt's start, without reading the
	// clock at its end, when the attempt cannot have ended later than
	// within one bucket of the windows it is recorded in (a timed attempt
	// reads its end anyway, a hedged one measures its latency, a half-open
	// probe's result moves the breaker at the time it is recorded).
	c.bounded = !c.timed && !c.hedged && bound >= 0 && bound <= c.recordLimit() && !c.permit.Probe()
	if c.bounded && start.IsZero() {
		if !fromLeft {
			c.bounded = false
		} else {
			start = c.fromLeft()
		}
	}
	c.now, c.fresh = start, fresh
	if c.obs != nil {
		e := c.event(event.AttemptStart, now)
		e.Delay = c.delay
		actx = c.obs.Observe(actx, e)
		c.actx = actx
	}
	return actx, cancel, nil
}

// fromLeft is the time the attempt's c.remain was read at.
func (c *call) fromLeft() time.Time { return c.deadline.Add(-c.remain) }

func (c *call) succeeded() {
	if c.throttle != nil {
		c.throttle.record(c.resultAt(), true)
	}
	if c.obs == nil {
		if c.timed {
			now := c.ended()
			c.permit.DoneAt(breaker.Success, now.Sub(c.astart), now)
		} else {
			c.done(breaker.Success)
		}
		return
	}
	now := c.recordAttempt(breaker.Success, nil)
	e := c.event(event.CallEnd, now)
	e.Outcome = event.OutcomeOK
	e.Duration = now.Sub(c.start)
	c.obs.Observe(c.ctx, e)
}

func (c *call) panicked() {
	if c.throttle != nil {
		c.throttle.record(c.resultAt(), true) // the operation's fault, not the dependency's
	}
	c.recordAttempt(breaker.Failure, errPanicked)
	c.end(errPanicked) // the call ends here too: observers close what they opened
}

var errPanicked = errors.New("guardrail: operation panicked")

// failed handles a failed attempt: classify, record, decide, wait. It
// returns nil when another attempt should run, else the error Do returns.
func (c *call) failed(err error, timedOut bool) error {
	c.lastErr = err
	if perr := c.ctx.Err(); perr != nil {
		if errors.Is(perr, context.Canceled) {
			// The caller gave up: not the dependency's fault, not retried.
			if c.throttle != nil {
				c.throttle.record(c.resultAt(), true) // nor evidence against it
			}
			c.recordAttempt(breaker.Ignored, err)
			c.outcome = event.OutcomeCanceled
			return err
		}
		// The caller's deadline passed during the attempt: the dependency did
		// not answer in time.
		if c.throttle != nil {
			c.throttle.record(c.resultAt(), false)
		}
		c.recordAttempt(breaker.Failure, err)
		c.timeout()
		if !c.idempotent && !c.s.classify(err).Unsent {
			return c.giveUp(ErrOutcomeUnknown, 0)
		}
		return c.giveUp(ErrDeadline, 0)
	}

	v := c.s.classify(err)
	if timedOut {
		v.Outcome, v.Retryable, v.Timeout = breaker.Failure, true, true
	}
	if c.throttle != nil && !c.live || c.hasDeadline && v.Retryable && (c.idempotent || v.Unsent) &&
		c.attempts-c.hedges < c.s.maxAttempts && !(v.RetryAfter > c.s.maxRetryAfter && c.s.maxRetryAfter >= 0) {
		// The throttle, or the retry decision below (the time left), needs
		// the attempt's end: read it now, so that the breaker records the
		// attempt at it too.
		c.ended()
	}
	c.recordAttempt(v.Outcome, err)
	if c.throttle != nil {
		// An answer, if not a good one, is one the dependency took; an
		// overload answer or a timeout is not.
		c.throttle.record(c.resultAt(), !v.Timeout && !isOverload(err, v))
	}
	if v.Timeout {
		c.timeout()
		if !c.idempotent && !v.Unsent {
			return c.giveUp(ErrOutcomeUnknown, 0)
		}
	}
	switch {
	case !v.Retryable:
		return err
	case !c.idempotent && !v.Unsent:
		c.refuse(event.ReasonNotIdempotent)
		return err
	case c.attempts-c.hedges >= c.s.maxAttempts:
		c.refuse(event.ReasonAttempts)
		return err
	}

	delay, reason := time.Duration(0), event.ReasonBackoff
	if v.RetryAfter > 0 && c.s.maxRetryAfter >= 0 {
		if v.RetryAfter > c.s.maxRetryAfter {
			// Retrying sooner than the server asked would defeat its request.
			c.refuse(event.ReasonRetryAfter)
			return err
		}
		delay, reason = v.RetryAfter, event.ReasonRetryAfter
	} else {
		delay = c.s.backoff.Delay(c.retries, c.delay, c.s.rand())
	}
	if c.hasDeadline {
		if left := c.deadline.Sub(c.ended()); delay+c.s.minAttempt > left {
			// No sleeping toward a deadline the retry would miss.
			c.refuse(event.ReasonDeadline)
			retryIn := time.Duration(0)
			if reason == event.ReasonRetryAfter {
				retryIn = delay
			}
			return c.giveUp(ErrDeadline, retryIn)
		}
	}
	if c.breaker != nil {
		if err := c.breaker.Refusal(); err != nil { // reads the clock only when open
			// It opened meanwhile: no sleeping toward a certain refusal.
			c.refuse(event.ReasonBreakerOpen)
			return c.rejected(err)
		}
	}
	if !c.s.budget.TryRetry() {
		if c.obs != nil {
			e := c.event(event.BudgetExhausted, time.Time{})
			e.Tokens = c.s.budget.Tokens()
			c.obs.Observe(c.ctx, e)
		}
		c.refuse(event.ReasonBudget)
		return c.giveUp(ErrBudgetExhausted, delay) // the wait it would have had
	}
	if c.obs != nil {
		e := c.event(event.Retry, time.Time{})
		e.Delay, e.Reason, e.Err = delay, reason, err
		c.obs.Observe(c.ctx, e)
	}
	c.retries++
	c.delay = delay
	return c.wait(delay)
}

// wait sleeps for d or until the caller's context ends.
func (c *call) wait(d time.Duration) error {
	if d <= 0 {
		return nil
	}
	if c.timer == nil {
		c.timer = time.NewTimer(d)
	} else {
		c.timer.Reset(d)
	}
	select {
	case <-c.timer.C:
		return nil
	case <-c.ctx.Done():
		c.endAt = time.Time{} // the call ends now, not when the attempt did
		if errors.Is(c.ctx.Err(), context.Canceled) {
			c.outcome = event.OutcomeCanceled
			return c.ctx.Err()
		}
		return c.giveUp(ErrDeadline, 0)
	}
}

// recordAttempt reports the attempt's outcome to the breaker and the
// observer. It returns the attempt's end, if it read it.
func (c *call) recordAttempt(o breaker.Outcome, err error) time.Time {
	if !c.timed {
		c.done(o)
		return time.Time{}
	}
	now := c.ended()
	d := now.Sub(c.astart)
	c.permit.DoneAt(o, d, now)
	c.permit = breaker.Permit{}
	if c.obs != nil {
		e := c.event(event.AttemptEnd, now)
		e.Outcome = o.String()
		e.Duration = d
		e.Err = err
		c.obs.Observe(c.actx, e)
	}
	return now
}

// rejected turns a breaker's refusal into ErrCircuitOpen.
func (c *call) rejected(err error) error {
	var retryIn time.Duration
	var oe *breaker.OpenError
	if errors.As(err, &oe) {
		retryIn = oe.RetryIn()
	}
	if c.obs != nil {
		e := c.event(event.BreakerReject, time.Time{})
		e.Delay, e.Err = retryIn, err
		c.obs.Observe(c.ctx, e)
	}
	cause := c.lastErr
	if cause == nil {
		cause = err
	}
	c.outcome = event.OutcomeCircuitOpen
	return &Error{Kind: ErrCircuitOpen, Attempts: c.attempts, RetryIn: retryIn, Err: cause}
}

// throttled turns the throttle's local rejection into ErrThrottled.
func (c *call) throttled() error {
	if c.obs != nil {
		e := c.event(event.Throttled, time.Time{})
		e.Attempt = c.attempts + 1 // the attempt that was not sent
		e.Reason = event.ReasonThrottled
		c.obs.Observe(c.ctx, e)
	}
	c.outcome = event.OutcomeThrottled
	cause := c.lastErr
	if cause == nil {
		cause = ErrThrottled
	}
	return &Error{Kind: ErrThrottled, Attempts: c.attempts, Err: cause}
}

// bulkheadRejected turns a bulkhead's refusal into ErrBulkheadFull, the
// caller's deadline passing during the wait into ErrDeadline, and the
// caller's own cancellation into ctx.Err().
func (c *call) bulkheadRejected(err error) error {
	if !errors.Is(err, bulkhead.ErrFull) {
		// The caller's context ended while waiting: cancelled, or its
		// deadline passed, which is ErrDeadline as anywhere else in Do.
		if errors.Is(err, context.Canceled) {
			c.outcome = event.OutcomeCanceled
			return err
		}
		return c.giveUp(ErrDeadline, 0)
	}
	if c.obs != nil {
		e := c.event(event.BulkheadReject, time.Time{})
		e.Reason, e.Err = event.ReasonBulkheadFull, err
		if errors.Is(err, bulkhead.ErrNoTime) {
			e.Reason = event.ReasonDeadline
		}
		e.InFlight, e.Limit = c.bulkhead.InFlight(), c.bulkhead.Limit()
		c.obs.Observe(c.ctx, e)
	}
	cause := c.lastErr
	if cause == nil {
		cause = err
	}
	c.outcome = event.OutcomeBulkheadFull
	return &Error{Kind: ErrBulkheadFull, Attempts: c.attempts, Err: cause}
}

func (c *call) timeout() {
	if c.obs == nil {
		return
	}
	e := c.event(event.Timeout, time.Time{})
	e.Phase = event.PhaseAttempt
	e.Err = c.lastErr
	c.obs.Observe(c.actx, e)
}

func (c *call) refuse(reason string) {
	if c.obs == nil {
		return
	}
	e := c.event(event.RetryRefused, time.Time{})
	e.Reason, e.Err = reason, c.lastErr
	c.obs.Observe(c.ctx, e)
}

// giveUp builds the typed error for kind, wrapping the last error (or the
// context's, when no attempt failed yet), and records the call's outcome.
func (c *call) giveUp(kind error, retryIn time.Duration) error {
	cause := c.lastErr
	if cause == nil {
		cause = c.ctx.Err()
	}
	switch kind {
	case ErrDeadline:
		c.outcome = event.OutcomeDeadline
	case ErrBudgetExhausted:
		c.outcome = event.OutcomeBudgetExhausted
	case ErrOutcomeUnknown:
		c.outcome = event.OutcomeUnknown
	}
	return &Error{Kind: kind, Attempts: c.attempts, RetryIn: retryIn, Err: cause}
}

// end reports the call's end to the observer and returns err.
func (c *call) end(err error) error {
	if c.obs == nil {
		return err
	}
	now := c.ended() // the last attempt's end, when the call ends with it
	e := c.event(event.CallEnd, now)
	// The outcome is the one this call decided on, never read back from
	// err: an error that wraps another call's *Error (a nested Do, or the
	// cancel cause a fallback group gives the sibling it stops) says what
	// happened to that call, not to this one.
	e.Outcome = c.outcome
	if e.Outcome == "" {
		e.Outcome = event.OutcomeError
	}
	e.Duration = now.Sub(c.start)
	e.Err = err
	c.obs.Observe(c.ctx, e)
	return err
}

// event fills the fields every event shares. now may be zero when the
// event's kind does not report the time left.
func (c *call) event(kind event.Kind, now time.Time) event.Event {
	e := event.Event{
		Kind:       kind,
		Dependency: c.dependency,
		Operation:  c.operation,
		Attempt:    c.attempts,
		Remaining:  -1,
	}
	if c.hasDeadline && !now.IsZero() {
		e.Remaining = c.deadline.Sub(now)
	}
	return e
}
