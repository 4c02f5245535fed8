package guardhttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
)

// phase is where an attempt stands, in the order the base transport
// reports it through net/http/httptrace.
type phase uint8

const (
	phaseStart   phase = iota // the base transport has reported nothing yet
	phaseConnect              // GetConn: DNS, pool, dial
	phaseTLS                  // TLSHandshakeStart
	phaseWrite                // GotConn: writing headers and body
	phaseHeader               // WroteRequest: waiting for the response headers
	phaseBody                 // the response is out; its body is being read
	phaseDone                 // the body was read or closed, or the attempt failed
)

var phaseNames = [...]string{
	phaseConnect: event.PhaseConnect,
	phaseTLS:     event.PhaseTLS,
	phaseWrite:   event.PhaseWrite,
	phaseHeader:  event.PhaseResponseHeader,
	phaseBody:    event.PhaseBodyIdle,
}

// epoch anchors the monotonic clock readings kept as integers.
var epoch = time.Now()

// nanotime returns the monotonic clock in nanoseconds since epoch, always
// positive. It reads only the monotonic clock, which is cheaper than
// time.Now.
func nanotime() int64 { return int64(time.Since(epoch)) + 1 }

// attempt is one try of a request: its context, which guardhttp cancels
// when one of its limits runs out; one timer that enforces the phase
// limits; the trace hooks that report the phase boundaries; and, once the
// response is out, its body, which keeps the attempt alive until it is read
// or closed.
//
// Everything here rests on what net/http documents: a request's context
// "controls the entire lifetime of a request and its response: obtaining a
// connection, sending the request, and reading the response headers and
// body"; httptrace's hooks report when a connection is asked for and got,
// when a TLS handshake starts and when the request was written. A limit
// that runs out records its *TimeoutError in the attempt first, then
// cancels the context: what the round trip or a body Read then returns is
// replaced by that record, whatever net/http made of the cancellation.
//
// The context is derived from the caller's, not from the retry engine's
// attempt context: the engine ends that one when the attempt returns,
// while the body is still to be read.
//
// The timer is armed lazily: a phase boundary moves the due time forward
// without touching the timer, which, when it fires early, re-arms itself
// for the current due time. On the success path it is armed once and
// stopped once.
//
// Times are monotonic nanoseconds since epoch (nanotime); 0 means none.
type attempt struct {
	t      *Transport
	dep    string
	n      int  // attempt number, 1-based
	handed bool // the body belongs to the caller; set before it is shared
	ctx    context.Context
	cancel context.CancelCauseFunc
	detach func() bool   // stops forwarding the caller's cancellation; nil when inherited
	body   io.ReadCloser // the response body, once handed over
	trace  httptrace.ClientTrace
	req    http.Request // the copy of the caller's request the attempt sends
	vals   [6]string    // values of the headers the attempt adds (see call.header)
	digits [40]byte     // the bytes of its deadline headers' values

	// reading is the time at which the current body Read began, 0 between
	// Reads: the body-idle check reads it instead of the timer being
	// re-armed on every Read.
	reading atomic.Int64

	mu       sync.Mutex  // guards the fields below
	timer    *phaseTimer // nil until armed, and again once the attempt is done
	phase    phase
	started  int64          // start of the current phase
	limit    time.Duration  // limit of the current phase; 0: none
	expires  int64          // when the current limit runs out
	deadline int64          // end of the attempt (AttemptTimeout)
	cause    *TimeoutError  // the timeout that ended the attempt
	reached  bool           // set by failed: the request may have reached the server
	conns    int            // connections the base transport took for the request (GotConn)
	slot     *bulkhead.Slot // the bulkhead slot the engine left to the attempt; nil: none
}

func (t *Transport) newAttempt(c *call, actx context.Context, now time.Time) *attempt {
	a := &attempt{t: t, dep: c.dep, n: c.n}
	parent := c.req.Context()
	var ctx context.Context
	if t.observer != nil {
		// The observer may have put values (a span) in the engine's attempt
		// context: keep them, but take cancellation from the caller.
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(context.WithoutCancel(actx))
		a.cancel = cancel
		a.detach = context.AfterFunc(parent, func() { cancel(context.Cause(parent)) })
		if dl, ok := parent.Deadline(); ok {
			ctx = withDeadline{ctx, dl} // what WithoutCancel dropped
		}
	} else {
		ctx, a.cancel = context.WithCancelCause(parent)
	}
	start := int64(now.Sub(epoch)) + 1
	if t.s.attemptTimeout > 0 {
		a.deadline = start + int64(t.s.attemptTimeout)
		if dl, ok := parent.Deadline(); ok && int64(dl.Sub(epoch))+1 <= a.deadline {
			a.deadline = 0 // the caller's deadline comes first
		}
	}
	a.trace.GotConn = a.gotConn
	a.trace.WroteRequest = a.wroteRequest
	if t.mayHandshake(c.req) {
		a.trace.TLSHandshakeStart = a.tlsStart
	}
	if t.http == nil {
		a.trace.GetConn = a.getConn
	}
	a.ctx = httptrace.WithClientTrace(ctx, &a.trace)
	a.mu.Lock()
	if t.http != nil {
		// *http.Transport asks for a connection first thing: GetConn
		// would only tell us what we know.
		a.phase = phaseConnect
	}
	a.arm(start)
	a.mu.Unlock()
	return a
}

// mayHandshake reports whether sending req may take a TLS handshake: it is
// an HTTPS request, or the base transport may send it through a proxy
// (which may be an HTTPS one). A request that cannot need no hook for it,
// which saves an allocation per attempt.
func (t *Transport) mayHandshake(req *http.Request) bool {
	if req.URL.Scheme != "http" || t.http == nil {
		return true
	}
	if t.http.Proxy == nil {
		return false
	}
	if !t.envProxy {
		return true // a Proxy of the caller's, which may be costly to ask twice
	}
	// http.ProxyFromEnvironment, as NewClient's base has: the base asks it
	// about each request too, and for an HTTP request without HTTP_PROXY
	// its answer is a few comparisons.
	u, err := t.http.Proxy(req)
	return u != nil || err != nil
}

// deadlineTime returns the attempt's deadline (AttemptTimeout) as a time,
// or the zero time if it has none.
func (a *attempt) deadlineTime() time.Time {
	if a.deadline == 0 {
		return time.Time{}
	}
	return epoch.Add(time.Duration(a.deadline - 1))
}

func (a *attempt) getConn(string)                { a.enter(phaseConnect) }
func (a *attempt) tlsStart()                     { a.enter(phaseTLS) }
func (a *attempt) gotConn(httptrace.GotConnInfo) { a.enter(phaseWrite) }
func (a *attempt) wroteRequest(i httptrace.WroteRequestInfo) {
	if i.Err == nil {
		a.enter(phaseHeader)
	}
}

// sends returns how many times the base transport took a connection for
// the attempt's request, each one a send that may have reached the
// server: more than one when it sent the request again by itself.
func (a *attempt) sends() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.conns
}

// limitOf returns the limit of phase p; 0 means none.
func (s *settings) limitOf(p phase) time.Duration {
	switch p {
	case phaseConnect:
		return s.connect
	case phaseTLS:
		return s.tls
	case phaseWrite:
		return s.write
	case phaseHeader:
		return s.header
	case phaseBody:
		return s.bodyIdle
	}
	return 0
}

// enter moves the attempt to phase p and starts its limit. Phases move
// forward, except that the base transport trying again on another
// connection starts over at connect (GetConn) or write (GotConn). A TLS
// handshake counts only while connecting: a dial that an earlier try gave
// up on may report one late.
func (a *attempt) enter(p phase) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if p == phaseWrite {
		a.conns++ // counted whatever the phase: each is a send
	}
	if a.cause != nil || a.phase >= phaseBody {
		return
	}
	switch p {
	case phaseConnect, phaseWrite:
	case phaseTLS:
		if a.phase != phaseConnect && a.phase != phaseTLS {
			return
		}
	default:
		if p <= a.phase {
			return
		}
	}
	a.phase = p
	a.arm(nanotime())
}

// startBody moves the attempt to the body phase. Body-idle time is
// counted from the start of each Read, so the timer only needs to look no
// later than one limit after any Read could have begun, the previous
// phase's start; the check re-arms if it comes too soon.
func (a *attempt) startBody() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cause != nil || a.phase >= phaseBody {
		return
	}
	a.phase = phaseBody
	a.limit = a.t.s.bodyIdle
	due := int64(0)
	if a.limit > 0 {
		due = a.started + int64(a.limit)
	}
	a.schedule(0, due)
}

// arm starts the limit of the current phase at now, bounded by the
// attempt's deadline. The caller holds a.mu.
func (a *attempt) arm(now int64) {
	a.started = now
	a.limit = a.t.s.limitOf(a.phase)
	due := int64(0)
	if a.limit > 0 {
		due = now + int64(a.limit)
	}
	a.schedule(now, due)
}

// schedule sets the time the current limit runs out to due (0: never), or
// to the attempt's deadline if that comes first, and makes sure the timer
// fires no later. now is the current time, or 0 if the caller has not read
// it. The caller holds a.mu.
func (a *attempt) schedule(now, due int64) {
	if a.deadline != 0 && (due == 0 || a.deadline < due) {
		due = a.deadline
	}
	a.expires = due
	if due == 0 {
		return
	}
	if a.timer == nil {
		a.timer = takeTimer(a)
	}
	a.timer.fireBy(now, due)
}

// fire runs when pt, the attempt's timer, goes off: it re-arms the timer
// if the limit now runs out later, and otherwise records a TimeoutError
// and then cancels the attempt's context with it.
func (a *attempt) fire(pt *phaseTimer) {
	a.mu.Lock()
	if a.timer != pt {
		a.mu.Unlock() // the attempt gave pt back: it is done
		return
	}
	pt.due = 0
	if a.phase == phaseDone || a.cause != nil || a.expires == 0 {
		a.mu.Unlock()
		return
	}
	now := nanotime()
	if now < a.expires {
		a.schedule(now, a.expires)
		a.mu.Unlock()
		return
	}
	if a.phase == phaseBody && (a.deadline == 0 || now < a.deadline) {
		// Only time spent inside a Read counts: the caller's own pace
		// between Reads is not the server's fault.
		since := a.reading.Load()
		if since == 0 {
			a.schedule(now, now+int64(a.limit))
			a.mu.Unlock()
			return
		}
		if due := since + int64(a.limit); now < due {
			a.schedule(now, due)
			a.mu.Unlock()
			return
		}
	}
	te := a.expired(now)
	a.mu.Unlock()
	a.cancel(te)
}

// expired records and returns the timeout of the limit that ran out at
// now, the attempt's deadline or its current phase's. The caller holds
// a.mu, and has checked that a limit ran out.
func (a *attempt) expired(now int64) *TimeoutError {
	te := &TimeoutError{Dependency: a.dep, notSent: a.phase == phaseConnect || a.phase == phaseTLS}
	if a.deadline != 0 && now >= a.deadline {
		te.Phase, te.After = event.PhaseAttempt, a.t.s.attemptTimeout
	} else {
		te.Phase, te.After = phaseNames[a.phase], a.limit
	}
	a.cause = te
	return te
}

// withDeadline reports a deadline that its context inherits from
// elsewhere. It adds no timer: the context ends with the caller's, which
// has that deadline. Done, Err and Value (hence context.Cause) are the
// embedded cancel context's, so contexts derived from it need no goroutine.
type withDeadline struct {
	context.Context
	deadline time.Time
}

func (c withDeadline) Deadline() (time.Time, bool) { return c.deadline, true }

// phaseTimer is a timer lent to one attempt at a time, so that a request
// does not allocate one. It goes back to the pool stopped.
//
// A run of fire that starts as the timer passes to another attempt finds
// either the attempt that gave it back, which no longer holds it and
// ignores it, or the one that took it, whose limit has not run out: it at
// most re-arms the timer.
type phaseTimer struct {
	t    *time.Timer
	a    atomic.Pointer[attempt] // the attempt it is lent to; nil in the pool
	pool *sync.Pool              // its Transport's: where it goes back

	// due is when t fires, 0 if it is not armed. The attempt holding the
	// timer guards it with its mu.
	due int64
}

// takeTimer lends a timer of a's Transport to a. The pool is the
// Transport's, not the process's: a timer made inside a testing/synctest
// bubble belongs to it, and one Transport's timers stay with the bubble
// its requests ran in, as its *http.Transport's idle connections do.
func takeTimer(a *attempt) *phaseTimer {
	pt, _ := a.t.timers.Get().(*phaseTimer)
	if pt == nil {
		pt = &phaseTimer{pool: &a.t.timers}
		pt.t = time.AfterFunc(time.Hour, pt.fire)
		pt.t.Stop()
	}
	pt.a.Store(a)
	return pt
}

// fireBy makes sure the timer fires no later than due. now is the current
// time, or 0 if the caller has not read it. The caller holds the mu of the
// attempt holding pt.
func (pt *phaseTimer) fireBy(now, due int64) {
	if pt.due == 0 || due < pt.due {
		pt.due = due
		if now == 0 {
			now = nanotime()
		}
		pt.t.Reset(time.Duration(due - now))
	}
}

func (pt *phaseTimer) fire() {
	if a := pt.a.Load(); a != nil {
		a.fire(pt)
	}
}

// release gives the timer back. The caller no longer holds it: it set its
// attempt's timer to nil, under the attempt's mu.
func (pt *phaseTimer) release() {
	pt.t.Stop()
	pt.due = 0
	pt.a.Store(nil)
	pt.pool.Put(pt)
}

// failed ends an attempt whose round trip returned err and returns the
// error to report: the timeout guardhttp recorded before it cancelled the
// attempt, or err unchanged.
//
// One more case is a timeout of guardhttp's too: while connecting, the
// base transport may give up an instant before guardhttp's timer fires,
// because NewClient bounds its dialer and its TLS handshake by the same
// limits (so that a dial nobody waits for any more does not linger), and
// those bounds start after the attempt's. Whether the phase's limit has
// run out is read from guardhttp's own clock, not from err.
func (a *attempt) failed(err error) error {
	a.mu.Lock()
	// Past GotConn the request may have reached the server; a base that
	// reports nothing leaves it unknown, so it may have too.
	a.reached = a.phase >= phaseWrite || a.phase == phaseStart
	cause := a.cause
	if cause == nil && (a.phase == phaseConnect || a.phase == phaseTLS) && a.expires != 0 {
		if now := nanotime(); now >= a.expires {
			cause = a.expired(now)
		}
	}
	a.mu.Unlock()
	a.finish()
	if cause != nil {
		return cause
	}
	return err
}

// timedOut returns the timeout that ended the attempt, if any.
func (a *attempt) timedOut() *TimeoutError {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cause
}

// finish ends the attempt: the timer goes back to the pool and the context
// is cancelled, releasing whatever the base transport still holds for it.
func (a *attempt) finish() {
	if !a.stopTimer() {
		return
	}
	a.cancel(nil)
	if a.detach != nil {
		a.detach()
	}
	a.mu.Lock()
	slot := a.slot
	a.slot = nil
	a.mu.Unlock()
	if slot != nil {
		slot.Release()
	}
}

// hold takes the bulkhead slot the engine leaves to the attempt: it is
// freed when the attempt ends, at once if it has ended already (a response
// without a body, or a protocol switch, which hands the connection over).
func (a *attempt) hold(slot *bulkhead.Slot) {
	a.mu.Lock()
	if a.phase != phaseDone {
		a.slot = slot
		slot = nil
	}
	a.mu.Unlock()
	if slot != nil {
		slot.Release()
	}
}

// stopTimer ends the attempt's phases and frees its timer. It reports
// false when they had already ended.
func (a *attempt) stopTimer() bool {
	a.mu.Lock()
	if a.phase == phaseDone {
		a.mu.Unlock()
		return false
	}
	a.phase = phaseDone
	pt := a.timer
	a.timer, a.expires = nil, 0
	a.mu.Unlock()
	if pt != nil {
		pt.release()
	}
	return true
}

// handOver gives resp to the caller with its body guarded by the body-idle
// timeout; the attempt lives until the body is read or closed.
func (a *attempt) handOver(resp *http.Response) {
	switch {
	case resp.Body == nil || resp.Body == http.NoBody:
		a.finish()
		return
	case resp.StatusCode == http.StatusSwitchingProtocols:
		// The body is the connection itself (io.ReadWriteCloser): leave it
		// as it is, stop the timers, and leave the context to the caller's.
		a.stopTimer() // a slot the engine leaves is freed at once: the connection is the caller's now
		return
	}
	a.watch(resp.Body)
	a.handed = true
	resp.Body = a
}

// watch makes body the attempt's and starts the body phase.
func (a *attempt) watch(body io.ReadCloser) {
	a.body = body // before the timer may look at it
	a.startBody()
}

// Read reads the response body. A Read that waits longer than the
// body-idle timeout for data fails with a *TimeoutError.
func (a *attempt) Read(p []byte) (int, error) {
	a.reading.Store(nanotime())
	n, err := a.body.Read(p)
	a.reading.Store(0)
	if err != nil {
		err = a.readFailed(err)
	}
	return n, err
}

func (a *attempt) readFailed(err error) error {
	if err == io.EOF {
		a.finish()
		return err
	}
	if te := a.timedOut(); te != nil {
		err = te
		if a.handed && a.t.observer != nil {
			// The retry engine is done with this attempt: report the timeout
			// here, once, on the reader's goroutine.
			a.t.observer.Observe(a.ctx, event.Event{
				Kind:       event.Timeout,
				Dependency: a.dep,
				Operation:  event.Operation(a.ctx),
				Attempt:    a.n,
				Phase:      te.Phase,
				Err:        te,
				Remaining:  -1,
			})
		}
	}
	a.finish()
	return err
}

// Close closes the response body and ends the attempt.
func (a *attempt) Close() error {
	err := a.body.Close()
	a.finish()
	return err
}

// discard throws away a response that is not returned to the caller.
func discard(resp *http.Response) {
	if resp.Body != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
		resp.Body.Close()
	}
}
