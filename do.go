package guardrail

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/throttle"
)

// Do runs op under p and returns its result. p may be nil (see Policy).
//
// Before every attempt Do checks the time left on ctx: below
// Policy.MinAttemptTime it stops with ErrDeadline. It then asks the
// Policy's Pauses, if any (a paused dependency stops the call with
// ErrCircuitOpen around ErrPaused), and the breaker (an open one stops the
// call with ErrCircuitOpen, without running op) and
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
// When ctx carries a chain.State (the request a server is serving, package
// chain), Do takes part in the call chain: it does not retry an answer
// whose verdict has Retried (the server behind already retried), it
// refuses a retry that would take the request past the chain's
// amplification cap (ErrBudgetExhausted), and, when it gives up after
// retries or is refused by the budget, the breaker or the throttle, it
// marks the State, so that the server's error answer tells the tier above
// not to retry in turn.
//
// Do returns exactly one of:
//
//   - op's value and a nil error, on success;
//   - the zero T and the last attempt's error as op returned it (without
//     the verdict Permanent, Transient, Unsent, RetryAfterError or
//     WithVerdict put on it, which was for Do), for a failure that is not
//     retried (permanent, or the operation is not idempotent) or when
//     attempts are exhausted;
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
	// IdempotentWithKey marks a call that has effects but carries an
	// idempotency key the dependency deduplicates by (a POST with an
	// Idempotency-Key): it is retried as an idempotent call, and when its
	// last attempt got no answer after it may have reached the dependency,
	// the call ends with ErrOutcomeUnknown around whatever else ended it,
	// as a call that is not idempotent does: the caller must learn the
	// outcome, by sending again with the same key.
	IdempotentWithKey
)

// Call refines a Policy for one call, for callers such as an HTTP transport
// that decide per request what Do otherwise reads from the Policy. The zero
// Call changes nothing: every field's zero value means "as the Policy
// says". A Call is a plain value that DoCall copies; the values it points
// to must be safe for concurrent use.
type Call struct {
	// Idempotent, when not IdempotenceOfPolicy, replaces
	// Policy.Idempotent for this call.
	Idempotent Idempotence
	// Dependency, when not empty, replaces Policy.Name in this call's events
	// (an HTTP transport reports the host).
	Dependency string
	// MaxAttempts, when positive, replaces Policy.MaxAttempts for this call
	// (1: a request whose body cannot be sent twice). A negative value is
	// invalid.
	MaxAttempts int
	// AttemptTimeout, when positive, replaces Policy.AttemptTimeout for
	// this call; negative means no bound of its own (a stream that may
	// rightly live long).
	AttemptTimeout time.Duration
	// Breaker, when not nil, replaces the Policy's breaker for this call
	// (one breaker per host, route or shard, from a breaker.Group).
	Breaker *breaker.Breaker
	// Bulkhead, when not nil, replaces Policy.Bulkhead for this call.
	Bulkhead *bulkhead.Bulkhead
	// Throttler, when not nil, replaces Policy.Throttler for this call (one
	// throttle per host); NoThrottle turns the Policy's off for it.
	Throttler  *throttle.Throttler
	NoThrottle bool
	// Observer, when not nil, replaces Policy.Observer for this call's
	// events.
	Observer event.Observer
	// NoHedge, when true, keeps this call from being hedged though the
	// Policy hedges (a request whose body cannot be sent twice).
	NoHedge bool
	// Discard, when not nil, is given what an attempt produced that the
	// call throws away, so that what it holds is released (an HTTP
	// response's body drained and closed): the error of a failed attempt
	// that is retried, and the value or error of a hedged attempt that lost
	// the race to another or failed beside it. For a hedge it may run on
	// another goroutine than the caller's, after Do returned.
	Discard func(v any)
	// Resends, when not nil, counts the sends that a transport below op
	// made on its own within one attempt, beyond the first (net/http's
	// Transport sends an idempotent request again when a reused
	// connection fails before any answer): op adds to it, and DoCall reads
	// and zeroes it when op returns. Each is an attempt of the call: it
	// counts toward MaxAttempts, it spends a retry token from the budget
	// while one is left (it was sent already: it cannot be refused), and
	// it is reported as an AttemptStart and an AttemptEnd with outcome
	// ignored (the breaker never saw it). DoHedged ignores it.
	Resends *int
	// Hold, when not nil, is given the bulkhead slot of the attempt whose
	// result the call returns (its value, or its error when it failed),
	// instead of Do freeing the slot when op returns: work that outlives
	// op (an HTTP response body read later) stays bounded by the bulkhead.
	// Hold must Release the slot when that work is done. Slots of attempts
	// whose results are thrown away are freed by Do. A held slot costs an
	// allocation per attempt.
	Hold func(result any, slot *bulkhead.Slot)
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
		cl.resends = nil // its attempts run at once: no one count to read
		return runHedged(&cl, op)
	}
	return run(&cl, op)
}

// call is the state of one Do: the settings it runs under, then what its
// attempts did. It lives on Do's stack.
type call struct {
	settled

	// State of the attempts.
	ref          time.Time // what clock measures from; zero before its first read
	start        time.Time // the call's start; set only when observed
	attempts     int       // attempts started, hedges included
	hedges       int       // hedges sent
	retries      int       // retries granted
	delay        time.Duration
	permit       breaker.Permit  // the current attempt's
	slot         bulkhead.Slot   // the current attempt's, freed when op returns
	held         *bulkhead.Slot  // the current attempt's instead, kept for Call.Hold
	actx         context.Context // the current attempt's context, as the observer returned it
	astart       time.Time       // the current attempt's start, when timed
	endAt        time.Time       // the current attempt's end, once read
	lastErr      error           // the last attempt's error, unmarked
	lost         bool            // the last attempt got no answer after it may have been received
	chainRetried bool            // an answer said the server behind had already retried
	timer        *time.Timer
	outcome      string // the CallEnd outcome of a call that fails; "" means event.OutcomeError
}

// settled is what a call runs under: the Policy's settings refined by the
// Call, set by init and begin and never written once the first attempt
// starts, so that the hedges of a hedged call read a copy of it on their
// goroutines.
type settled struct {
	ctx            context.Context
	s              *settings
	obs            event.Observer
	dependency     string
	operation      string // event.Operation(ctx); set only when observed
	idempotent     bool   // a failed attempt may be repeated
	effects        bool   // a lost answer makes the outcome unknown
	maxAttempts    int
	attemptTimeout time.Duration // 0: none
	breaker        *breaker.Breaker
	bulkhead       *bulkhead.Bulkhead
	throttle       *throttle.Throttler
	pauses         Pauser // nil: none
	discard        func(any)
	hold           func(any, *bulkhead.Slot)
	resends        *int // Call.Resends; nil for a hedged call
	deadline       time.Time
	hasDeadline    bool
	timed          bool // attempt durations are needed (an observer, a breaker that times)
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
	if c.MaxAttempts < 0 {
		return fmt.Errorf("%w: Call.MaxAttempts is %d; want 1 or more, or zero for the Policy's", ErrInvalidConfig, c.MaxAttempts)
	}
	// Field by field into the zero call the caller declared: a composite
	// literal would be built aside and then copied in, with write barriers.
	cl.ctx, cl.s, cl.obs = ctx, s, p.Observer
	cl.dependency, cl.discard, cl.hold = c.Dependency, c.Discard, c.Hold
	cl.resends = c.Resends
	cl.idempotent, cl.effects = p.Idempotent, !p.Idempotent
	cl.maxAttempts, cl.attemptTimeout = s.maxAttempts, s.attemptTimeout
	cl.breaker, cl.bulkhead, cl.throttle = s.breaker, p.Bulkhead, p.Throttler
	cl.pauses = s.pauses
	if cl.dependency == "" {
		cl.dependency = p.Name
	}
	switch c.Idempotent {
	case Idempotent:
		cl.idempotent, cl.effects = true, false
	case NotIdempotent:
		cl.idempotent, cl.effects = false, true
	case IdempotentWithKey:
		cl.idempotent, cl.effects = true, true
	}
	if c.MaxAttempts > 0 {
		cl.maxAttempts = c.MaxAttempts
	}
	switch {
	case c.AttemptTimeout > 0:
		cl.attemptTimeout = c.AttemptTimeout
	case c.AttemptTimeout < 0:
		cl.attemptTimeout = 0
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
	if c.NoThrottle {
		cl.throttle = nil
	}
	if c.Observer != nil {
		cl.obs = c.Observer
	}
	return nil
}

// run is the retry loop of an unhedged call. It must not hand op to
// anything that keeps it, or op escapes to the heap for every call.
func run[T any](c *call, op func(context.Context) (T, error)) (T, error) {
	var zero T
	c.begin()
	defer c.cleanup()
	for {
		actx, cancel, err := c.beforeAttempt()
		if err != nil {
			return zero, c.end(err)
		}
		v, err, timedOut := attempt(c, op, actx, cancel)
		if c.resends != nil && *c.resends > 0 {
			c.resent()
		}
		if err == nil {
			c.succeeded()
			if c.held != nil {
				c.handOver(v) // converted to any only here: no allocation otherwise
			}
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
			if c.held != nil {
				c.handOver(v) // converted to any only here: no allocation otherwise
			}
			return v, nil
		}
		if err := c.failed(err, timedOut); err != nil {
			return zero, c.end(err)
		}
	}
}

// attempt runs op once. The deferred function cancels the attempt's context,
// frees the bulkhead slot unless the call holds it for Call.Hold and, if
// op panicked, records the failed attempt before the panic goes on.
func attempt[T any](c *call, op func(context.Context) (T, error), actx context.Context, cancel context.CancelFunc) (v T, err error, timedOut bool) {
	done := false
	defer func() {
		if cancel != nil {
			cancel()
		}
		c.slot.Release() // a no-op without a bulkhead
		if !done {
			c.releaseSlot()
			c.panicked()
		}
	}()
	v, err = op(actx)
	done = true
	if err != nil && cancel != nil {
		// Before cancel: was it our attempt timeout that ended the attempt?
		timedOut = errors.Is(actx.Err(), context.DeadlineExceeded) && c.ctx.Err() == nil
	}
	return v, err, timedOut
}

// errResent is the error of a send that the transport below op made
// again on its own: the one before it failed without an answer.
var errResent = errors.New("guardrail: request sent again by the transport after its connection failed")

// resent counts the sends the transport made on its own during the
// attempt that just returned (Call.Resends) as attempts of the call.
// They come before the attempt's end in the events, numbered after it.
func (c *call) resent() {
	n := *c.resends
	*c.resends = 0
	for range n {
		c.attempts++
		c.s.budget.TryRetry() // it was sent: spend a token if one is left
		if c.obs != nil {
			ctx := c.obs.Observe(c.ctx, c.event(event.AttemptStart, time.Time{}))
			e := c.event(event.AttemptEnd, time.Time{})
			e.Outcome, e.Err = breaker.Ignored.String(), errResent
			c.obs.Observe(ctx, e)
		}
	}
}

func (c *call) begin() {
	c.s.budget.Deposit()
	c.timed = c.obs != nil || (c.breaker != nil && c.breaker.Timed())
	// Read once per call: the context chain only grows (an observer's
	// span) and neither value changes within a call.
	c.deadline, c.hasDeadline = c.ctx.Deadline()
	if c.hasDeadline && c.deadline != c.deadline.Round(0) { // Round(0) strips the monotonic reading
		// The deadline has a monotonic reading (context.WithTimeout's
		// does): the clock can measure from it alone.
		c.ref = c.deadline
	}
	if c.obs == nil {
		return
	}
	c.operation = event.Operation(c.ctx)
	c.start = c.clock()
	c.ctx = c.obs.Observe(c.ctx, c.event(event.CallStart, c.start))
}

// clock reads the clock. The first read of a call is time.Now, unless the
// deadline has a monotonic reading; every later one measures from that
// first reading, or from the deadline, with the monotonic clock alone,
// t.Add(time.Since(t)), which costs less than time.Now and compares with
// the deadline, the breaker's epoch and other readings exactly as
// time.Now's would.
func (c *call) clock() time.Time {
	if c.ref.IsZero() {
		c.ref = time.Now()
		return c.ref
	}
	return c.ref.Add(time.Since(c.ref))
}

// ended returns the current attempt's end, reading the clock the first
// time it is asked for, so that every use after op returned (the breaker,
// the throttle, the retry decision, the events) shares one read.
func (c *call) ended() time.Time {
	if c.endAt.IsZero() {
		c.endAt = c.clock()
	}
	return c.endAt
}

func (c *call) cleanup() {
	if c.timer != nil {
		c.timer.Stop()
	}
}

// beforeAttempt checks what must hold before an attempt starts (time left,
// a fleet's pause, throttle, breaker, bulkhead, in that order: the
// cheapest refusal first, and no slot taken for an attempt the breaker
// refuses), then builds the attempt's context. It reads the clock once,
// and only if something needs the time: the deadline, the pauses, the
// throttle, or an attempt's duration.
func (c *call) beforeAttempt() (context.Context, context.CancelFunc, error) {
	c.endAt = time.Time{}
	var now time.Time
	switch {
	case c.attempts == 0 && !c.start.IsZero():
		now = c.start // read by begin for the observer
	case c.hasDeadline || c.throttle != nil || c.timed || c.pauses != nil:
		now = c.clock()
	}
	if c.hasDeadline && c.deadline.Sub(now) < c.s.minAttempt {
		return nil, nil, c.giveUp(ErrDeadline, 0)
	}
	if c.pauses != nil {
		if until, ok := c.pauses.Paused(c.dependency, now); ok {
			return nil, nil, c.paused(until.Sub(now))
		}
	}
	if c.throttle != nil && !c.throttle.Admit(now, c.s.rand()) {
		return nil, nil, c.throttled()
	}
	if c.breaker != nil {
		var err error
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
		if c.hold != nil {
			c.held = new(bulkhead.Slot)
			*c.held, err = c.bulkhead.AcquireBy(c.ctx, latest)
		} else {
			c.slot, err = c.bulkhead.AcquireBy(c.ctx, latest)
		}
		if err != nil {
			c.held = nil
			c.permit.Done(breaker.Ignored, 0) // frees a probe slot
			return nil, nil, c.bulkheadRejected(err)
		}
		if !now.IsZero() {
			now = c.clock() // the wait for a slot may have made it old
		}
	}
	c.attempts++
	actx := c.ctx
	var cancel context.CancelFunc
	if at := c.attemptTimeout; at > 0 {
		switch {
		case c.hasDeadline && c.deadline.Sub(now) <= at:
			// The caller's deadline comes first: no timer needed, only the
			// promise that op's context ends with the attempt.
			actx, cancel = context.WithCancel(c.ctx)
		case !now.IsZero():
			// Arm the timer from the reading just made rather than let
			// WithTimeout read the clock again.
			actx, cancel = context.WithDeadline(c.ctx, now.Add(at))
		default:
			actx, cancel = context.WithTimeout(c.ctx, at)
		}
	}
	c.astart = now
	if c.obs != nil {
		e := c.event(event.AttemptStart, now)
		e.Delay = c.delay
		actx = c.obs.Observe(actx, e)
		c.actx = actx
	}
	return actx, cancel, nil
}

// releaseSlot frees the current attempt's bulkhead slot, if it has one.
func (c *call) releaseSlot() {
	c.slot.Release() // a no-op on the zero Slot
	if c.held != nil {
		c.held.Release()
		c.held = nil
	}
}

// handOver gives the current attempt's held slot to Call.Hold with what
// the call returns of the attempt.
func (c *call) handOver(result any) {
	if h := c.held; h != nil {
		c.held = nil
		c.hold(result, h)
	}
}

func (c *call) succeeded() {
	if c.throttle != nil {
		c.throttle.Record(c.ended(), true)
	}
	if c.obs == nil {
		if c.timed {
			now := c.ended()
			c.permit.DoneAt(breaker.Success, now.Sub(c.astart), now)
		} else {
			c.permit.Done(breaker.Success, 0) // the breaker reads the clock if its window needs it
		}
	} else {
		now := c.recordAttempt(breaker.Success, nil)
		e := c.event(event.CallEnd, now)
		e.Outcome = event.OutcomeOK
		e.Duration = now.Sub(c.start)
		c.obs.Observe(c.ctx, e)
	}
}

func (c *call) panicked() {
	if c.throttle != nil {
		c.throttle.Record(c.ended(), true) // the operation's fault, not the dependency's
	}
	c.recordAttempt(breaker.Failure, errPanicked)
	c.end(errPanicked) // the call ends here too: observers close what they opened
}

var errPanicked = errors.New("guardrail: operation panicked")

// unmarked returns err without the verdict Permanent, Transient,
// RetryAfterError, Unsent or WithVerdict put on it: the verdict was for
// Do, the error is for the caller.
func unmarked(err error) error {
	if m, ok := err.(*markedError); ok {
		return m.err
	}
	return err
}

// failed handles a failed attempt: classify, record, decide, wait. It
// returns nil when another attempt should run, else the error Do returns.
func (c *call) failed(err error, timedOut bool) error {
	c.lastErr = unmarked(err)
	if perr := c.ctx.Err(); perr != nil {
		return c.callerDone(err, perr)
	}
	v := c.s.classify(err)
	if timedOut {
		v.Outcome, v.Retryable, v.Timeout = breaker.Failure, true, true
	}
	if v.InFlight && !timedOut {
		// The same key is still running at the dependency: an answer, and
		// a healthy one. Coming back later, with the key, is how the
		// caller learns the outcome; only an idempotent call has a key.
		v = Verdict{Outcome: breaker.Ignored, Retryable: c.idempotent, RetryAfter: v.RetryAfter, InFlight: true}
	}
	c.lost = (v.Timeout || v.Unanswered) && !v.Unsent
	if v.RetryAfter > 0 && c.pauses != nil && !v.InFlight {
		// The dependency asked to be left alone, whether or not this
		// call retries: the process's other calls and the fleet's hear it.
		c.pauses.RetryAfter(c.dependency, v.RetryAfter, c.ended())
	}
	if c.hasDeadline || c.throttle != nil {
		c.ended() // the retry decision and the throttle need the attempt's end
	}
	c.recordAttempt(v.Outcome, err)
	if c.throttle != nil {
		// An answer, if not a good one, is one the dependency took; an
		// overload answer or a timeout is not.
		c.throttle.Record(c.ended(), v.InFlight || (!v.Timeout && !isOverload(err, v)))
	}
	if v.Timeout {
		c.timeout()
	}
	if c.lost && !c.idempotent {
		return c.giveUp(ErrOutcomeUnknown, 0)
	}
	switch {
	case v.Retried:
		c.chainRetried = true
		if v.Retryable {
			c.refuse(event.ReasonAlreadyRetried)
		}
		return c.lastErr
	case !v.Retryable:
		return c.lastErr
	case !c.idempotent && !v.Unsent:
		c.refuse(event.ReasonNotIdempotent)
		return c.lastErr
	case c.attempts-c.hedges >= c.maxAttempts:
		c.refuse(event.ReasonAttempts)
		return c.lastErr
	}
	delay, reason, stop := c.retryDelay(v)
	if stop != nil {
		return stop
	}
	if err := c.grant(delay, reason); err != nil {
		return err
	}
	if c.discard != nil {
		c.discard(c.lastErr)
	}
	c.releaseSlot()
	c.retries++
	c.delay = delay
	return c.wait(delay)
}

// callerDone ends a call whose context ended during the attempt.
func (c *call) callerDone(err, perr error) error {
	if errors.Is(perr, context.Canceled) {
		// The caller gave up: not the dependency's fault, not retried.
		if c.throttle != nil {
			c.throttle.Record(c.ended(), true) // nor evidence against it
		}
		c.recordAttempt(breaker.Ignored, err)
		c.outcome = event.OutcomeCanceled
		return c.lastErr
	}
	// The caller's deadline passed during the attempt: the dependency did
	// not answer in time.
	if c.throttle != nil {
		c.throttle.Record(c.ended(), false)
	}
	c.recordAttempt(breaker.Failure, err)
	c.timeout()
	c.lost = !c.s.classify(err).Unsent
	if c.lost && !c.idempotent {
		return c.giveUp(ErrOutcomeUnknown, 0)
	}
	return c.giveUp(ErrDeadline, 0)
}

// retryDelay returns the delay before retrying the failure v, and the
// reason for it, or the error that ends the call when the server asked for
// a longer wait than MaxRetryAfter allows. A fleet's pause that ends after
// the delay asks for the same wait as the server's Retry-After.
func (c *call) retryDelay(v Verdict) (time.Duration, string, error) {
	delay, reason := v.RetryAfter, event.ReasonRetryAfter
	if delay <= 0 {
		delay, reason = c.s.backoff.Delay(c.retries, c.delay, c.s.rand()), event.ReasonBackoff
	}
	if c.pauses != nil {
		now := c.ended()
		if until, ok := c.pauses.Paused(c.dependency, now); ok && until.Sub(now) > delay {
			delay, reason = until.Sub(now), event.ReasonRetryAfter
		}
	}
	if reason == event.ReasonRetryAfter && c.s.maxRetryAfter >= 0 && delay > c.s.maxRetryAfter {
		// Retrying sooner than the server asked would defeat its request.
		c.refuse(event.ReasonRetryAfter)
		return 0, "", c.lastErr
	}
	return delay, reason, nil
}

// grant asks the deadline, the breaker and the budget for a retry after
// delay, in that order, and returns the error that ends the call when one
// refuses.
func (c *call) grant(delay time.Duration, reason string) error {
	if c.hasDeadline {
		if left := c.deadline.Sub(c.ended()); delay > left || left-delay < c.s.minAttempt { // no overflow for a huge delay
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
	if st := chain.FromContext(c.ctx); st != nil && !st.AllowsAttempt(c.attempts-c.hedges+1) {
		// The request being served already stands for enough sends of
		// the user's: another one here multiplies a chain's retries.
		c.refuse(event.ReasonAmplification)
		return c.giveUp(ErrBudgetExhausted, delay)
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
		e.Delay, e.Reason, e.Err = delay, reason, c.lastErr
		c.obs.Observe(c.ctx, e)
	}
	return nil
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
		if c.endAt.IsZero() {
			c.permit.Done(o, 0) // the breaker reads the clock if its window needs it
		} else {
			c.permit.DoneAt(o, 0, c.endAt)
		}
		c.permit = breaker.Permit{}
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
		e.Err = unmarked(err)
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
	c.outcome = event.OutcomeCircuitOpen
	return &Error{Kind: ErrCircuitOpen, Attempts: c.attempts, RetryIn: retryIn, Err: c.cause(err)}
}

// cause is the error a typed error of the call wraps: the last attempt's,
// else def.
func (c *call) cause(def error) error {
	if c.lastErr != nil {
		return c.lastErr
	}
	return def
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
	return &Error{Kind: ErrThrottled, Attempts: c.attempts, Err: c.cause(ErrThrottled)}
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
	c.outcome = event.OutcomeBulkheadFull
	return &Error{Kind: ErrBulkheadFull, Attempts: c.attempts, Err: c.cause(err)}
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
	switch kind {
	case ErrDeadline:
		c.outcome = event.OutcomeDeadline
	case ErrBudgetExhausted:
		c.outcome = event.OutcomeBudgetExhausted
	case ErrOutcomeUnknown:
		c.outcome = event.OutcomeUnknown
	}
	return &Error{Kind: kind, Attempts: c.attempts, RetryIn: retryIn, Err: c.cause(c.ctx.Err())}
}

// end hands the last attempt's slot over, makes the outcome unknown when
// the last attempt of a call with effects got no answer, reports the
// call's end to the observer, and returns err.
func (c *call) end(err error) error {
	if c.held != nil {
		c.handOver(c.lastErr)
	}
	if c.effects && c.lost && !errors.Is(err, ErrOutcomeUnknown) && !errors.Is(err, context.Canceled) {
		// A call retried under an idempotency key: whatever ended it, its
		// last attempt may have taken effect.
		err = &Error{Kind: ErrOutcomeUnknown, Attempts: c.attempts, Err: err}
		c.outcome = event.OutcomeUnknown
	}
	if c.chainRetried || c.retries > 0 || chainRefusal(c.outcome) {
		// Whatever ends the request being served ends it after this tier
		// spent its retries: the tier above must not spend its own.
		chain.FromContext(c.ctx).MarkRetried()
	}
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

// chainRefusal reports whether a call that ended with outcome was refused
// by this process's own protection against a failing dependency, which
// the tier above would only meet again: the budget, the breaker, the
// throttle.
func chainRefusal(outcome string) bool {
	switch outcome {
	case event.OutcomeBudgetExhausted, event.OutcomeCircuitOpen, event.OutcomeThrottled:
		return true
	}
	return false
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
