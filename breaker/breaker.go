package breaker

import (
	"context"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// State is a breaker's state: a plain value, safe for concurrent use.
type State uint8

// The states of a breaker.
const (
	// Closed: calls go through and are recorded in the window.
	Closed State = iota
	// Open: calls are rejected at once until the open time ends.
	Open
	// HalfOpen: a limited number of probes go through; their results
	// decide between Closed and Open.
	HalfOpen
)

// String returns "closed", "open" or "half_open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half_open"
	default:
		return "unknown"
	}
}

// The state word packs the state, two flags and a generation counter that
// changes on every transition, so a Permit can tell whether the state it
// was issued in is still current with one atomic load.
const (
	stateMask    uint64 = 3
	flagForced   uint64 = 1 << 2 // no spontaneous transitions: ForceOpen, ForceClosed, MetricsOnly
	flagNoRecord uint64 = 1 << 3 // Disabled: admit everything, record nothing
	genUnit      uint64 = 1 << 4
)

// Breaker is a circuit breaker: it watches the outcomes of calls to one
// dependency and, when too many of them fail or are slow, rejects calls at
// once for a while instead of letting them pile up on a dependency that
// cannot answer.
//
// Closed, it admits every call and records outcomes in a sliding window
// (time-based by default, rotated lazily: no timer, no goroutine). When a
// failure or slow call is recorded and the window holds at least
// MinRequests calls, it compares failures/calls with FailureRate and
// slow/calls with SlowRate; either rate at or above its threshold trips it
// open. Both comparisons are inclusive. With ConsecutiveFailures set, a
// run of that many failures with no success between them trips it too, at
// any volume. A success never trips the breaker.
//
// Open, it rejects every call with an *OpenError (which Is ErrOpen) for
// OpenFor plus a random jitter. The first call after that turns it
// half-open.
//
// Half-open, it admits exactly HalfOpenProbes concurrent probes and rejects
// the rest with an error that Is ErrOpen but is no *OpenError, since no
// retry time is known. A probe reported as Failure (or slow) opens it
// again; CloseAfter consecutive successful probes close it with an empty
// window. A probe reported as Ignored (the caller gave up) frees its
// slot without counting. If no probe reports for OpenFor while every slot
// is taken, the probes are presumed lost and the breaker opens again, so a
// probe whose result never comes cannot wedge it.
//
// Every Permit remembers the generation of the state that issued it; a
// result reported after the state changed (a slow call started while
// closed that ends after the breaker opened) is dropped.
//
// Breaker is safe for concurrent use by multiple goroutines. The closed
// path is lock-free and allocation-free; rejection is allocation-free.
type Breaker struct {
	// Read by every call, and rarely written: kept together ahead of mu so
	// that they do not share a cache line with it.
	state   atomic.Uint64             // state word; read by every Allow and Done
	openErr atomic.Pointer[OpenError] // the current open period's error; set before state
	cfg     *normalized               // shared by the breakers of a Group
	name    string
	tw      timeWindow   // used unless cw is set
	cw      *countWindow // set for a count window

	mu sync.Mutex
	// Guarded by mu:
	inflight  int32 // half-open: probes admitted and not reported
	passed    int32 // half-open: consecutive successful probes
	lastProbe int64 // half-open: clock of the last probe admission or report
	opens     int32 // consecutive openings since the last close

	// Owned by the Group that created the breaker, if any: see entry marks
	// in group.go. gidx is guarded by the Group's mutex.
	gmark atomic.Uint32
	gidx  int32

	// ConsecutiveFailures: the closed state's run of failures (see
	// countRun). 32 bits, in what was padding, to keep a Group's breakers
	// in their allocation size class.
	run atomic.Uint32

	dq *delivery // transitions to deliver; allocated at the first one with a callback
}

// delivery is the queue of transitions waiting for the Observer. It is guarded by the breaker's mu, and exists only for a
// breaker that has callbacks and has changed state, to keep idle breakers
// small (a Group may hold many).
type delivery struct {
	pending    []transition
	delivering bool
}

// New returns a closed breaker configured by cfg, or an error that Is
// ErrInvalidConfig and names every field cfg holds an invalid value in.
func New(cfg Config) (*Breaker, error) {
	n, err := cfg.normalize("Config.")
	if err != nil {
		return nil, err
	}
	n.epoch = time.Now()
	return newBreaker(&n, n.name), nil
}

// newBreaker returns a closed breaker named name configured by n, which
// it may share with others and never modifies.
func newBreaker(n *normalized, name string) *Breaker {
	b := &Breaker{cfg: n, name: name}
	if b.cfg.count > 0 {
		b.cw = newCountWindow(b.cfg.count)
	} else {
		b.tw.init(n)
	}
	b.state.Store(b.baseWord(0))
	return b
}

// baseWord is the closed state word of the configured mode.
func (b *Breaker) baseWord(gen uint64) uint64 {
	w := gen &^ (genUnit - 1)
	switch b.cfg.mode {
	case MetricsOnly:
		w |= flagForced
	case Disabled:
		w |= flagForced | flagNoRecord
	}
	return w
}

// clock returns the time since the breaker's epoch. With a monotonic epoch
// (always, outside testing/synctest bubbles) it reads only the monotonic
// clock, which costs about half of time.Now.
func (b *Breaker) clock() int64 { return int64(time.Since(b.cfg.epoch)) }

func (b *Breaker) clockAt(t time.Time) int64 { return int64(t.Sub(b.cfg.epoch)) }

// Permit is the right to make one call, returned by Allow. Report the call's
// result with Done exactly once; later calls of Done are not detected and
// would count the call again. The zero Permit is valid and records nothing.
// A Permit is a small value: copy it freely, and call Done from any
// goroutine (once in all: it is not safe to report one call twice, from
// one goroutine or several).
type Permit struct {
	b *Breaker
	w uint64 // state word at Allow
}

// Probe reports whether this permit is a half-open probe.
func (p Permit) Probe() bool { return p.b != nil && p.w&stateMask == uint64(HalfOpen) }

// Allow asks to make one call. It returns a Permit to report the call's
// outcome with, or an error that Is ErrOpen: the breaker's *OpenError while
// open; while half-open with every probe slot taken, an error that is no
// *OpenError.
//
// Closed, Allow reads no clock, takes no lock and allocates nothing.
func (b *Breaker) Allow() (Permit, error) {
	w := b.state.Load()
	if w&stateMask == uint64(Closed) {
		return Permit{b, w}, nil
	}
	return b.allowSlow(w, -1)
}

// AllowAt is Allow with the current time supplied by the caller, for a
// caller that has just read the clock.
func (b *Breaker) AllowAt(now time.Time) (Permit, error) {
	w := b.state.Load()
	if w&stateMask == uint64(Closed) {
		return Permit{b, w}, nil
	}
	return b.allowSlow(w, max(b.clockAt(now), 0))
}

func (b *Breaker) allowSlow(w uint64, now int64) (Permit, error) {
	if w&stateMask == uint64(Open) {
		e := b.openErr.Load()
		if e != nil && e.w == w {
			if w&flagForced != 0 {
				return Permit{}, e
			}
			if now < 0 {
				now = b.clock()
			}
			if now < e.until {
				return Permit{}, e
			}
		}
	}
	if now < 0 {
		now = b.clock()
	}
	b.mu.Lock()
	w = b.state.Load()
	switch State(w & stateMask) {
	case Closed:
		b.mu.Unlock()
		return Permit{b, w}, nil
	case Open:
		e := b.openErr.Load()
		if w&flagForced != 0 || now < e.until {
			b.mu.Unlock()
			return Permit{}, e
		}
		w = b.setLocked(w, HalfOpen, 0, transition{Reason: ReasonOpenElapsed, Cause: "open time elapsed"}, now)
		b.inflight, b.passed, b.lastProbe = 1, 0, now
		b.unlockAndDeliver()
		return Permit{b, w}, nil
	default: // HalfOpen
		if int(b.inflight) < b.cfg.probes {
			b.inflight++
			b.lastProbe = now
			b.mu.Unlock()
			return Permit{b, w}, nil
		}
		if now-b.lastProbe < int64(b.cfg.openFor) {
			b.mu.Unlock()
			return Permit{}, errTooManyProbes
		}
		b.setLocked(w, Open, 0, transition{Reason: ReasonProbeTimeout, Cause: "no probe reported within " + b.cfg.openFor.String()}, now)
		e := b.openErr.Load()
		b.unlockAndDeliver()
		return Permit{}, e
	}
}

// Done reports the outcome of the call and its duration d (used for the
// slow-call rate; pass 0 if slow-call tracking is off). Ignored releases
// the permit without counting. A result from a state that has since
// changed is dropped.
//
// Closed, Done reads the clock at most once (never with a count window or
// for Ignored), takes no lock except once per bucket width, and allocates
// nothing.
func (p Permit) Done(o Outcome, d time.Duration) { p.record(o, d, -1) }

// DoneAt is Done with the current time supplied by the caller, for a
// caller that has just read the clock (to measure d, say).
func (p Permit) DoneAt(o Outcome, d time.Duration, now time.Time) {
	if p.b != nil {
		p.record(o, d, max(p.b.clockAt(now), 0))
	}
}

// record is Done and DoneAt: now is a clock reading, or negative to read
// the clock only if the result needs one.
func (p Permit) record(o Outcome, d time.Duration, now int64) {
	b := p.b
	if b == nil {
		return
	}
	if p.w&(stateMask|flagNoRecord) != uint64(Closed) {
		b.doneSlow(p.w, o, d, now)
		return
	}
	if o == Ignored || b.state.Load() != p.w {
		return
	}
	if b.cw != nil {
		b.recordCount(p.w, o, d)
		return
	}
	if now < 0 {
		now = b.clock()
	}
	b.recordTime(p.w, now, o, d)
}

func (b *Breaker) isSlow(d time.Duration) bool {
	return b.cfg.slowCall > 0 && int64(d) >= b.cfg.slowCall
}

func (b *Breaker) recordTime(w uint64, now int64, o Outcome, d time.Duration) {
	failure, slow := o == Failure, b.isSlow(d)
	b.tw.add(&b.mu, now, failure, slow)
	var run uint32
	if b.cfg.consecutive > 0 {
		run = b.countRun(w, failure)
	}
	if (failure || slow) && w&flagForced == 0 {
		c := b.tw.sum(now)
		if r := b.trips(c); r != "" || run > 0 && run >= b.cfg.consecutive {
			b.mu.Lock()
			if b.state.Load() != w {
				b.mu.Unlock()
				return
			}
			b.trip(w, c, r, run, now)
			b.unlockAndDeliver()
		}
	}
}

func (b *Breaker) recordCount(w uint64, o Outcome, d time.Duration) {
	failure, slow := o == Failure, b.isSlow(d)
	b.mu.Lock()
	if b.state.Load() != w {
		b.mu.Unlock()
		return
	}
	b.cw.add(failure, slow)
	var run uint32
	if b.cfg.consecutive > 0 {
		run = b.countRun(w, failure)
	}
	if (failure || slow) && w&flagForced == 0 {
		if r := b.trips(b.cw.counts); r != "" || run > 0 && run >= b.cfg.consecutive {
			b.trip(w, b.cw.counts, r, run, b.clock())
			b.unlockAndDeliver()
			return
		}
	}
	b.mu.Unlock()
}

// The run word counts consecutive failures for ConsecutiveFailures. Its
// high half holds the low 16 bits of the generation of the closed state
// the run belongs to, its low half the run's length (at most 65535), so
// that one compare-and-swap both counts a failure and checks that the
// permit's state is still the current one: a permit from before a
// transition can neither extend nor end the run of the state after it.
// (record checks the whole state word first; the 16 bits only guard the
// instants between that check and the swap, in which 65536 transitions
// cannot happen.) Every transition starts an empty run in the new
// generation (setLocked).
const runMask = 1<<16 - 1

func runWord(w uint64) uint32 { return uint32(w/genUnit) << 16 }

// countRun records a failure (the run grows) or a success (it ends) of a
// permit from closed state word w, and returns the run's length after a
// failure, 0 otherwise. Concurrent failures and successes are ordered by
// their compare-and-swaps, so the length is exact: n failures in a row
// return 1..n.
func (b *Breaker) countRun(w uint64, failure bool) uint32 {
	g := runWord(w)
	for {
		v := b.run.Load()
		switch {
		case v&^runMask != g: // the run of another state: the permit is stale
			return 0
		case !failure && v == g: // a success with no run: the common case, one load
			return 0
		case !failure:
			if b.run.CompareAndSwap(v, g) {
				return 0
			}
		case v&runMask == runMask: // saturated: still a run (MetricsOnly never trips)
			return runMask
		default:
			if b.run.CompareAndSwap(v, v+1) {
				return v&runMask + 1
			}
		}
	}
}

// trips applies the rate thresholds to a window's counts (inclusive): it
// returns the reason to trip, or "".
func (b *Breaker) trips(c counts) Reason {
	if c.calls < b.cfg.minRequests || c.calls <= 0 {
		return ""
	}
	// Division, not multiplication: f/c >= rate is exact for the rates
	// people write (11/20 >= 0.55), f >= rate*c is not (0.55*20 > 11).
	switch {
	case float64(c.failures)/float64(c.calls) >= b.cfg.failureRate:
		return ReasonFailureRate
	case b.cfg.slowCall > 0 && float64(c.slow)/float64(c.calls) >= b.cfg.slowRate:
		return ReasonSlowRate
	}
	return ""
}

// ReasonConsecutiveFailures: closed -> open, Config.ConsecutiveFailures
// failures in a row. The event's Detail gives the run: "5 consecutive
// failures".
const ReasonConsecutiveFailures Reason = "consecutive_failures"

// trip opens the breaker from closed state word w, for reason r
// (ReasonFailureRate or ReasonSlowRate), or for a run of run consecutive
// failures when r is empty. The caller holds mu.
func (b *Breaker) trip(w uint64, c counts, r Reason, run uint32, now int64) {
	t := transition{Reason: r}
	switch r {
	case ReasonFailureRate:
		t.Cause = rateCause("failure", c.failures, c.calls, b.cfg.failureRate)
	case ReasonSlowRate:
		t.Cause = rateCause("slow-call", c.slow, c.calls, b.cfg.slowRate)
	default:
		t.Reason, t.Cause = ReasonConsecutiveFailures, strconv.FormatUint(uint64(run), 10)+" consecutive failures"
	}
	b.setLocked(w, Open, 0, t, now)
}

// doneSlow handles a probe's result (and a disabled breaker's, which it
// drops). now < 0 means unknown.
func (b *Breaker) doneSlow(w uint64, o Outcome, d time.Duration, now int64) {
	if w&stateMask != uint64(HalfOpen) {
		return
	}
	b.mu.Lock()
	if b.state.Load() != w {
		b.mu.Unlock()
		return
	}
	if now < 0 {
		now = b.clock()
	}
	b.inflight--
	b.lastProbe = now
	switch {
	case o == Ignored:
		b.mu.Unlock()
		return
	case o == Failure:
		b.setLocked(w, Open, 0, transition{Reason: ReasonProbeFailed, Cause: "probe failed"}, now)
	case b.isSlow(d):
		b.setLocked(w, Open, 0, transition{Reason: ReasonProbeSlow, Cause: "probe took " + d.String()}, now)
	default:
		if b.passed++; int(b.passed) >= b.cfg.closeAfter {
			b.setLocked(w, Closed, 0, transition{Reason: ReasonProbesPassed, Cause: "probes passed"}, now)
		}
	}
	b.unlockAndDeliver()
}

// setLocked moves the breaker from state word w to state to (with flags)
// and queues the transition for delivery. The caller holds mu and then
// calls unlockAndDeliver. It returns the new state word.
func (b *Breaker) setLocked(w uint64, to State, flags uint64, t transition, now int64) uint64 {
	nw := (w&^(genUnit-1) + genUnit) | uint64(to) | flags
	switch to {
	case Open:
		e := &OpenError{Name: b.name, w: nw}
		if flags&flagForced == 0 {
			b.opens++
			d := b.openDuration(int(b.opens))
			e.until = now + int64(d)
			e.Until = b.cfg.epoch.Add(time.Duration(e.until))
			t.OpenFor = d
		}
		b.openErr.Store(e) // before the state: Allow checks e.w against the state
	case Closed:
		b.opens = 0
		if b.cw == nil {
			b.tw.reset()
		} else {
			b.cw.reset()
		}
	case HalfOpen:
		b.inflight, b.passed = 0, 0
	}
	b.run.Store(runWord(nw)) // before the state: a stale permit's failure finds another generation
	b.state.Store(nw)
	from := State(w & stateMask)
	if from == to && (w^nw)&(flagForced|flagNoRecord) == 0 {
		return nw // same state, same flags (a Reset of a closed breaker): nothing to tell
	}
	if b.cfg.observer != nil {
		t.Name, t.From, t.To = b.name, from, to
		if b.dq == nil {
			b.dq = new(delivery)
		}
		b.dq.pending = append(b.dq.pending, t)
	}
	return nw
}

// openDuration is the open time of the n-th consecutive opening: OpenFor
// grown by OpenBackoff up to MaxOpenFor, plus jitter.
func (b *Breaker) openDuration(n int) time.Duration {
	d := float64(b.cfg.openFor)
	if b.cfg.backoff > 1 {
		max := float64(b.cfg.maxOpenFor)
		for i := 1; i < n && d < max; i++ {
			d *= b.cfg.backoff
		}
		d = math.Min(d, max)
	}
	if b.cfg.jitter > 0 {
		r := b.cfg.rand()
		if !(r >= 0) { // also NaN
			r = 0
		}
		d += d * b.cfg.jitter * math.Min(r, 1)
	}
	if d >= math.MaxInt64 {
		return math.MaxInt64
	}
	return time.Duration(d)
}

// unlockAndDeliver releases mu and delivers queued transitions to the
// Observer, in order, outside the lock. If another
// goroutine is already delivering, it hands its transitions over to it and
// returns.
func (b *Breaker) unlockAndDeliver() {
	q := b.dq
	if q == nil || len(q.pending) == 0 || q.delivering {
		b.mu.Unlock()
		return
	}
	q.delivering = true
	ok := false
	defer func() {
		if !ok { // a callback panicked (mu is held again): let the next transition deliver
			q.delivering = false
			q.pending = q.pending[:0]
			b.mu.Unlock()
		}
	}()
	for len(q.pending) > 0 {
		t := q.pending[0]
		q.pending = append(q.pending[:0], q.pending[1:]...)
		b.mu.Unlock()
		func() {
			defer b.mu.Lock()
			b.cfg.observer.Observe(context.Background(), t.event())
		}()
	}
	q.delivering = false
	ok = true
	b.mu.Unlock()
}

// Execute runs fn if the breaker allows it and records its outcome, as
// classified by Config.Classify (DefaultClassify if nil). It returns the
// rejection error without calling fn, or fn's error. If fn panics, the
// call counts as a failure, as in guardrail.Do, and the panic goes on: a
// dependency whose answers make the caller panic is failing it, and must
// be able to trip the breaker.
func (b *Breaker) Execute(fn func() error) error {
	p, err := b.Allow()
	if err != nil {
		return err
	}
	var start int64
	if b.cfg.slowCall > 0 {
		start = b.clock()
	}
	finished := false
	defer func() {
		if !finished {
			b.finish(p, Failure, start)
		}
	}()
	err = fn()
	finished = true
	b.finish(p, b.cfg.classify(err), start)
	return err
}

// finish records the outcome of Execute's call, started at start when
// slow calls are tracked.
func (b *Breaker) finish(p Permit, o Outcome, start int64) {
	if b.cfg.slowCall > 0 && o != Ignored {
		now := b.clock()
		p.record(o, time.Duration(now-start), now)
		return
	}
	p.Done(o, 0)
}

// State returns the current state. A breaker whose open time has elapsed
// reports Open until a call turns it half-open.
func (b *Breaker) State() State { return State(b.state.Load() & stateMask) }

// ForceOpen opens the breaker until Reset or ForceClosed: every call is
// rejected with an *OpenError whose Until is zero.
func (b *Breaker) ForceOpen() { b.force(Open, flagForced, ReasonForcedOpen, "forced open") }

// ForceClosed closes the breaker until Reset or ForceOpen: every call is
// admitted and recorded (Metrics keeps working) but it never trips.
func (b *Breaker) ForceClosed() {
	b.force(Closed, flagForced, ReasonForcedClosed, "forced closed")
}

// Reset returns the breaker to closed in its configured Mode, with an
// empty window and no memory of earlier openings. Permits issued before
// are dropped when they report.
func (b *Breaker) Reset() {
	b.mu.Lock()
	w := b.state.Load()
	base := b.baseWord(0)
	b.setLocked(w, Closed, base&(flagForced|flagNoRecord), transition{Reason: ReasonReset, Cause: "reset"}, b.clock())
	b.opens = 0
	b.unlockAndDeliver()
}

func (b *Breaker) force(to State, flags uint64, r Reason, cause string) {
	b.mu.Lock()
	b.setLocked(b.state.Load(), to, flags, transition{Reason: r, Cause: cause}, b.clock())
	b.unlockAndDeliver()
}

// Metrics is a snapshot of a breaker for monitoring: a plain value, owned by
// its caller.
type Metrics struct {
	// State is the state at the snapshot.
	State State
	// Forced is true while the state was forced (ForceOpen, ForceClosed) or
	// the mode is MetricsOnly or Disabled.
	Forced bool
	// Calls, Failures and Slow are the counts in the current window
	// (ignored calls are not counted), and FailureRate and SlowRate their
	// ratios to Calls (0 when Calls is 0). They are zero while open or
	// half-open: the window restarts empty when the breaker closes.
	Calls, Failures, Slow int
	// FailureRate and SlowRate are Failures/Calls and Slow/Calls.
	FailureRate, SlowRate float64
	// ConsecutiveFailures is the current run of failures with no success
	// between them, while closed and Config.ConsecutiveFailures is set;
	// else 0.
	ConsecutiveFailures int
	// Probes is the number of half-open probes in flight.
	Probes int
	// Opens counts consecutive openings since the breaker last closed.
	Opens int
	// OpenUntil is when an open breaker admits its next probe (zero when
	// not open, or forced open).
	OpenUntil time.Time
}

// Metrics returns a snapshot of the breaker's state and window.
func (b *Breaker) Metrics() Metrics {
	now := b.clock()
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.state.Load()
	m := Metrics{State: State(w & stateMask), Forced: w&flagForced != 0, Opens: int(b.opens)}
	switch m.State {
	case Closed:
		var c counts
		if b.cw == nil {
			c = b.tw.sum(now)
		} else {
			c = b.cw.counts
		}
		m.Calls, m.Failures, m.Slow = int(c.calls), int(c.failures), int(c.slow)
		if v := b.run.Load(); b.cfg.consecutive > 0 && v&^runMask == runWord(w) {
			m.ConsecutiveFailures = int(v & runMask)
		}
		if c.calls > 0 {
			m.FailureRate = float64(c.failures) / float64(c.calls)
			m.SlowRate = float64(c.slow) / float64(c.calls)
		}
	case Open:
		m.OpenUntil = b.openErr.Load().Until
	case HalfOpen:
		m.Probes = int(b.inflight)
	}
	return m
}

// Timed reports whether the breaker uses call durations (slow-call tracking
// is on), so a caller knows whether to measure them for Done.
func (b *Breaker) Timed() bool { return b.cfg.slowCall > 0 }

// Refusal returns the *OpenError Allow would return now because the
// breaker is open and its open time has not elapsed, or nil. Unlike Allow
// it changes nothing and takes no permit, so a caller about to wait before
// a retry can check that the retry would not be refused anyway.
func (b *Breaker) Refusal() error {
	w := b.state.Load()
	if w&stateMask != uint64(Open) {
		return nil
	}
	e := b.openErr.Load()
	if e == nil || e.w != w {
		return nil
	}
	if w&flagForced != 0 || b.clock() < e.until {
		return e
	}
	return nil
}

// event turns a transition into the event.BreakerTransition the Observer
// receives.
func (t transition) event() event.Event {
	return event.Event{
		Kind:       event.BreakerTransition,
		Dependency: t.Name,
		From:       t.From.String(),
		To:         t.To.String(),
		Reason:     string(t.Reason),
		Detail:     t.Cause,
		Delay:      t.OpenFor,
		Remaining:  -1,
	}
}
