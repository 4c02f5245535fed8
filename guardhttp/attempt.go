package guardhttp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
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
	phaseConnect: guardrail.PhaseConnect,
	phaseTLS:     guardrail.PhaseTLS,
	phaseWrite:   guardrail.PhaseWrite,
	phaseHeader:  guardrail.PhaseResponseHeader,
	phaseBody:    guardrail.PhaseBodyIdle,
}

// epoch anchors the monotonic clock readings kept in atomics.
var epoch = time.Now()

// attempt is one try of a request: its context, which a timeout cancels
// with a *TimeoutError as the cause; one timer that enforces the phase
// limits; the trace hooks that report the phase boundaries; and, once the
// response is out, its body, which keeps the attempt alive until it is read
// or closed.
//
// The context is derived from the caller's, not from the retry engine's
// attempt context: the engine ends that one when the attempt returns,
// while the body is still to be read.
//
// The timer is armed lazily: a phase boundary moves the due time forward
// without touching the timer, which, when it fires early, re-arms itself
// for the current due time. On the success path it is armed once and
// stopped once.
type attempt struct {
	t       *Transport
	dep     string
	n       int // attempt number, 1-based
	ctx     context.Context
	cancel  context.CancelCauseFunc
	detach  func() bool // stops forwarding the caller's cancellation; nil when inherited
	release func()      // frees the bulkhead slot; nil when none
	trace   httptrace.ClientTrace
	body    io.ReadCloser // the response body, once handed over
	handed  bool          // the body belongs to the caller; set before it is shared

	// reading is the monotonic time (ns since epoch, +1) at which the
	// current body Read began, 0 between Reads: the body-idle check reads it
	// instead of the timer being re-armed on every Read.
	reading atomic.Int64

	mu       sync.Mutex  // guards the fields below
	timer    *phaseTimer // nil until armed, and again once the attempt is done
	phase    phase
	started  time.Time     // start of the current phase
	limit    time.Duration // limit of the current phase; 0: none
	expires  time.Time     // when the current limit runs out; zero: none
	armed    time.Time     // when the timer is set to fire; zero: not set
	deadline time.Time     // end of the attempt (AttemptTimeout); zero: none
	cause    *TimeoutError // the timeout that cancelled the attempt
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
	if t.s.attemptTimeout > 0 {
		a.deadline = now.Add(t.s.attemptTimeout)
		if dl, ok := parent.Deadline(); ok && !dl.After(a.deadline) {
			a.deadline = time.Time{} // the caller's deadline comes first
		}
	}
	a.trace.GotConn = a.gotConn
	a.trace.WroteRequest = a.wroteRequest
	if !t.reportsConn {
		a.trace.GetConn = a.getConn
	}
	if !t.reportsConn || t.proxied || c.req.URL.Scheme == "https" {
		a.trace.TLSHandshakeStart = a.tlsStart
	}
	a.ctx = httptrace.WithClientTrace(ctx, &a.trace)
	a.mu.Lock()
	if t.reportsConn {
		// *http.Transport asks for a connection first thing: GetConn
		// would only tell us what we know.
		a.phase = phaseConnect
	}
	a.arm(now)
	a.mu.Unlock()
	return a
}

func (a *attempt) getConn(string)                { a.enter(phaseConnect) }
func (a *attempt) tlsStart()                     { a.enter(phaseTLS) }
func (a *attempt) gotConn(httptrace.GotConnInfo) { a.enter(phaseWrite) }
func (a *attempt) wroteRequest(i httptrace.WroteRequestInfo) {
	if i.Err == nil {
		a.enter(phaseHeader)
	}
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
	a.arm(time.Now())
}

// startBody moves the attempt to the body phase without reading the clock:
// body-idle time is counted from the start of each Read, so the timer only
// needs to look no later than one limit after any Read could have begun.
// The previous phase's start is earlier than any Read: one body limit
// after it is early enough, and the check re-arms if it comes too soon.
func (a *attempt) startBody() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cause != nil || a.phase >= phaseBody {
		return
	}
	a.phase = phaseBody
	a.limit = a.t.s.bodyIdle
	due := time.Time{}
	if a.limit > 0 {
		due = a.started.Add(a.limit)
	}
	if !a.deadline.IsZero() && (due.IsZero() || a.deadline.Before(due)) {
		due = a.deadline
	}
	a.expires = due
	if !due.IsZero() && (a.armed.IsZero() || due.Before(a.armed)) {
		a.schedule(time.Now(), due)
	}
}

// arm starts the limit of the current phase at now, bounded by the
// attempt's deadline. The caller holds a.mu.
func (a *attempt) arm(now time.Time) {
	a.started = now
	a.limit = a.t.s.limitOf(a.phase)
	due := time.Time{}
	if a.limit > 0 {
		due = now.Add(a.limit)
	}
	a.schedule(now, due)
}

// schedule sets the time the current limit runs out to due (zero: never),
// or to the attempt's deadline if that comes first. The timer is reset
// only when it would fire too late. The caller holds a.mu.
func (a *attempt) schedule(now, due time.Time) {
	if !a.deadline.IsZero() && (due.IsZero() || a.deadline.Before(due)) {
		due = a.deadline
	}
	a.expires = due
	if due.IsZero() || (!a.armed.IsZero() && !due.Before(a.armed)) {
		return
	}
	if a.timer == nil {
		a.timer = startTimer(a)
	}
	a.armed = due
	a.timer.t.Reset(due.Sub(now))
}

// fire runs when the timer goes off: it re-arms the timer if the limit now
// runs out later, and otherwise cancels the attempt with a TimeoutError.
func (a *attempt) fire() {
	a.mu.Lock()
	a.armed = time.Time{}
	if a.phase == phaseDone || a.cause != nil || a.expires.IsZero() {
		a.mu.Unlock()
		return
	}
	now := time.Now()
	if now.Before(a.expires) {
		a.schedule(now, a.expires)
		a.mu.Unlock()
		return
	}
	te := &TimeoutError{Dependency: a.dep}
	switch {
	case !a.deadline.IsZero() && !now.Before(a.deadline):
		te.Phase, te.After = guardrail.PhaseAttempt, a.t.s.attemptTimeout
		te.notSent = a.phase == phaseConnect || a.phase == phaseTLS
	case a.phase == phaseBody:
		// Only time spent inside a Read counts: the caller's own pace
		// between Reads is not the server's fault.
		since := time.Duration(a.reading.Load())
		if since == 0 {
			a.schedule(now, now.Add(a.limit))
			a.mu.Unlock()
			return
		}
		if due := epoch.Add(since - 1 + a.limit); now.Before(due) {
			a.schedule(now, due)
			a.mu.Unlock()
			return
		}
		te.Phase, te.After = guardrail.PhaseBodyIdle, a.limit
	default:
		te.Phase, te.After = phaseNames[a.phase], a.limit
		te.notSent = a.phase == phaseConnect || a.phase == phaseTLS
	}
	a.cause = te
	a.mu.Unlock()
	a.cancel(te)
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
// does not allocate one. A run of fire that starts as the timer passes to
// another attempt calls that attempt's fire, which finds its limit not yet
// run out and at most re-arms the timer for it; the attempt that gave the
// timer back is done and never touches it again.
type phaseTimer struct {
	t  *time.Timer
	mu sync.Mutex
	a  *attempt
}

var timers sync.Pool

func startTimer(a *attempt) *phaseTimer {
	pt, _ := timers.Get().(*phaseTimer)
	if pt == nil {
		pt = new(phaseTimer)
		pt.t = time.AfterFunc(time.Hour, pt.fire)
		pt.t.Stop()
	}
	pt.mu.Lock()
	pt.a = a
	pt.mu.Unlock()
	return pt
}

func (pt *phaseTimer) fire() {
	pt.mu.Lock()
	a := pt.a
	pt.mu.Unlock()
	if a != nil {
		a.fire()
	}
}

func (pt *phaseTimer) release() {
	pt.t.Stop()
	pt.mu.Lock()
	pt.a = nil
	pt.mu.Unlock()
	timers.Put(pt)
}

// failed ends an attempt whose round trip returned err and returns the
// error to report: the phase timeout that cancelled it, or a timeout the
// base transport raised itself while connecting (its dialer's), named as
// ours, or err unchanged.
func (a *attempt) failed(err error) error {
	a.mu.Lock()
	cause, p, started, limit := a.cause, a.phase, a.started, a.limit
	a.mu.Unlock()
	if cause == nil && (p == phaseConnect || p == phaseTLS) && a.ctx.Err() == nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			after := time.Since(started)
			if limit > 0 {
				after = min(after, limit)
			}
			cause = &TimeoutError{Phase: phaseNames[p], Dependency: a.dep, After: after, notSent: true}
		}
	}
	a.finish()
	if cause != nil {
		return cause
	}
	return err
}

// timedOut returns the timeout that cancelled the attempt, if any.
func (a *attempt) timedOut() *TimeoutError {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cause
}

// finish ends the attempt: the timer stops and the context is cancelled,
// releasing whatever the base transport still holds for it.
func (a *attempt) finish() {
	a.mu.Lock()
	if a.phase == phaseDone {
		a.mu.Unlock()
		return
	}
	a.phase = phaseDone
	pt := a.timer
	a.timer, a.expires, a.armed = nil, time.Time{}, time.Time{}
	a.mu.Unlock()
	if pt != nil {
		pt.release()
	}
	a.cancel(nil)
	if a.detach != nil {
		a.detach()
	}
	if a.release != nil {
		a.release()
	}
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
		a.mu.Lock()
		a.phase = phaseDone
		pt := a.timer
		a.timer, a.expires, a.armed = nil, time.Time{}, time.Time{}
		a.mu.Unlock()
		if pt != nil {
			pt.release()
		}
		if a.release != nil {
			a.release() // the connection is the caller's now
		}
		return
	}
	a.startBody()
	a.body = resp.Body
	a.handed = true
	resp.Body = a
}

// Read reads the response body. A Read that waits longer than the
// body-idle timeout for data fails with a *TimeoutError.
func (a *attempt) Read(p []byte) (int, error) {
	a.reading.Store(int64(time.Since(epoch)) + 1)
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
			a.t.observer.Observe(a.ctx, guardrail.Event{
				Kind:       guardrail.EventTimeout,
				Dependency: a.dep,
				Operation:  guardrail.Operation(a.ctx),
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

// buffer reads up to maxDrain bytes of the body of a response that may be
// thrown away for a retry, so that its connection goes back to the pool at
// once, and leaves resp readable in case it is the one the caller gets.
func (a *attempt) buffer(resp *http.Response) {
	if resp.Body == nil || resp.Body == http.NoBody {
		a.finish()
		return
	}
	a.startBody()
	a.body = resp.Body
	data, err := io.ReadAll(io.LimitReader(a, maxDrain+1))
	switch {
	case err != nil:
		resp.Body = &bufferedBody{data: data, err: err}
	case len(data) <= maxDrain:
		// a.Read saw EOF: the attempt is finished, the connection reused.
		resp.Body = &bufferedBody{data: data}
	default:
		a.handed = true
		resp.Body = &bufferedBody{data: data, rest: a}
	}
}

// bufferedBody is a response body read ahead: data, then rest if the body
// was longer, or then err if reading it failed.
type bufferedBody struct {
	data []byte
	rest io.ReadCloser
	err  error
}

func (b *bufferedBody) Read(p []byte) (int, error) {
	if len(b.data) > 0 {
		n := copy(p, b.data)
		b.data = b.data[n:]
		return n, nil
	}
	switch {
	case b.rest != nil:
		return b.rest.Read(p)
	case b.err != nil:
		return 0, b.err
	}
	return 0, io.EOF
}

func (b *bufferedBody) Close() error {
	b.data = nil
	if b.rest != nil {
		return b.rest.Close()
	}
	return nil
}

// discard throws away a response that is not returned to the caller.
func discard(resp *http.Response) {
	if resp.Body != nil {
		_, _ = io.CopyN(io.Discard, resp.Body, maxDrain)
		resp.Body.Close()
	}
}
