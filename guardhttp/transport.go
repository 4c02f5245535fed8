package guardhttp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unsafe"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/internal/readlimit"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/deadline"
)

// Transport is an http.RoundTripper that runs every request under the
// guardrail retry engine (guardrail.DoCall) with phase timeouts, and
// announces the request's deadline to the server.
//
// Per request, in this order: the time left on the request's context is
// checked (Config.MinAttemptTime); the circuit breaker of the request's key
// (its host, or Config.Key's answer) may refuse it; the key's bulkhead, if
// configured, gives it a slot; each attempt runs on a copy of the request,
// with X-Request-Timeout and X-Request-Deadline set from the time left
// (minus Config.DeadlineReserve), X-Retry-Attempt: n on the n-th retry,
// and, for a request made while serving one of a call chain (package
// chain), X-Retry-Amplification and X-Request-Cohort; each phase is
// bounded by its own timeout; its response or error is classified
// (Config.Classify), the chain's markers added to the verdict whatever the
// classifier said (guardrail.Verdict.Marked), and recorded by the
// breaker; a retryable
// failure is retried while attempts, the deadline, the breaker and the
// retry budget allow, after the server's Retry-After or the backoff delay.
//
// Which requests are retried: GET, HEAD, OPTIONS, PUT, DELETE and TRACE,
// and any request with an Idempotency-Key (or X-Idempotency-Key) header;
// Config.IdempotencyKeys gives POST and PATCH one. Any request is retried
// after a failure that says it was never sent (connection refused, connect
// or TLS timeout) or an answer marked X-Not-Processed; none is retried
// after an answer marked X-Already-Retried. A timeout after a request that is not idempotent was
// sent ends with guardrail.ErrOutcomeUnknown: it may have taken effect.
// A request body is sent again through GetBody, or else from a copy kept in
// memory up to Config.MaxBufferedBody; a larger body without GetBody is sent
// once and its request is never retried. A keyed request answered 409 with
// a valid Retry-After (the same key is still in flight) is retried with its
// key after it (guardrail.Verdict.InFlight); a 409 without a key is final.
//
// Every send that reaches the base transport's connections is an attempt.
// A request with a body that net/http would send again by itself reaches
// it without GetBody, so that net/http leaves the retry to the engine; a
// bodyless one net/http may still resend, and each connection it takes for
// the request beyond the first (httptrace GotConn) counts as one more
// attempt, toward MaxAttempts, the budget and the events
// (guardrail.Call.Resends).
//
// What the caller gets: the last attempt's response, whenever the last
// attempt got one, even if it is a 503 that was not retried because the
// budget, the deadline or the attempts ran out (a status is not an error
// for a RoundTripper), with its body readable; a response thrown away for a
// retry is drained (up to 64 KiB) and closed so its connection is reused.
// An error when no attempt got a response, or the last one failed without
// one: it wraps the last cause (errors.As to *TimeoutError names the phase)
// and, when the engine gave up early, Is guardrail.ErrDeadline,
// ErrBudgetExhausted, ErrOutcomeUnknown, ErrCircuitOpen or ErrBulkheadFull
// (errors.As to *guardrail.Error gives the attempt count and, when known,
// how long to wait: the time to the breaker's next probe). A POST or PATCH
// whose last attempt failed without an answer after its request may have
// reached the server (a timeout or a reset after GotConn) ends with an
// error that Is guardrail.ErrOutcomeUnknown, whether or not it was
// retried: it may have taken effect. A request that Config.IdempotencyKeys
// gave a key fails with an *IdempotencyKeyError holding that key; when it
// got a response, the key is in resp.Request.Header, the request the last
// attempt sent. respond.Status and respond.Error turn these errors into
// the answer a server gives its own client.
//
// Phase timeouts rely only on what net/http documents: the base
// transport reports its progress through net/http/httptrace (GetConn,
// TLSHandshakeStart, GotConn, WroteRequest), as *http.Transport does for
// HTTP/1 and HTTP/2, directly or through a proxy, and it ends a request
// whose context is cancelled, in whatever phase, body included. One timer
// per attempt follows the phases; when a limit runs out, the Transport
// records which one, then cancels the attempt's context, and the attempt
// fails with that record, a *TimeoutError, whatever error the base
// transport made of the cancellation. With a base that reports nothing,
// only the attempt timeout and the body-idle timeout apply. See
// docs/http-client.md.
//
// A Transport is safe for concurrent use by multiple goroutines. It does
// not modify the caller's request, and starts no goroutine of its own.
type Transport struct {
	base      http.RoundTripper
	http      *http.Transport // base, if it is one: it asks for a connection first thing
	envProxy  bool            // http's Proxy is http.ProxyFromEnvironment (NewClient's)
	s         settings
	observer  event.Observer // Config.Observer, for events after the engine returned
	breakers  *breaker.Group
	bulkheads *bulkhead.Group  // nil: none
	policy    guardrail.Policy // must not be copied: holds the budget
	hedges    bool             // Config.Hedge is set
	hold      func(any, *bulkhead.Slot)
	timers    sync.Pool // of *phaseTimer, lent to one attempt at a time
	levels    chain.Levels
}

// AdmissionLevel returns the highest admission level the dependencies
// reported on their answers (chain.HeaderAdmission) within the last
// chain.LevelTTL, 0 if none: what a chain.Server in front of the handler
// that calls through this Transport refuses at its door
// (chain.Config.Admission), so that requests the dependencies would shed
// are shed before any work.
func (t *Transport) AdmissionLevel() int { return t.levels.Level(time.Now()) }

// NewTransport returns a Transport that sends requests through base under
// cfg. A nil base means http.DefaultTransport. It returns an error naming
// the field if cfg is invalid (see Config).
//
// The phase limits hold for any *http.Transport. A base of one's own should
// also bound its dialer (net.Dialer's Timeout) and its TLS handshake
// (TLSHandshakeTimeout), as NewClient's does: net/http lets a dial that a
// cancelled request started run on, to fill the pool, and only those
// bounds end it. A timeout the base raises itself before the Transport's
// own limit runs out reaches the caller as the base's error.
func NewTransport(base http.RoundTripper, cfg Config) (*Transport, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, s: cfg.settings(), observer: cfg.Observer}
	t.http, _ = base.(*http.Transport)
	t.policy = guardrail.Policy{
		Name:      cfg.Name,
		Retry:     cfg.Retry,
		Hedge:     cfg.Hedge,
		Throttler: cfg.Throttler,
	}
	// The Transport bounds attempts itself: the engine's attempt context
	// ends when the attempt returns, before the body is read.
	t.policy.AttemptTimeout = 0
	t.hold = t.holdSlot
	t.hedges = cfg.Hedge != nil
	if cfg.Observer != nil {
		t.policy.Observer = phaseObserver{cfg.Observer}
	}
	// Every request brings the breaker of its key; the Policy's own would
	// be one breaker for every host, so it is turned off.
	t.policy.Breaker, _ = breaker.New(breaker.Config{Mode: breaker.Disabled}) // a valid Config
	t.breakers = cfg.Breakers
	if t.breakers == nil {
		gc := breaker.GroupConfig{Config: cfg.Breaker}
		if obs, name := cfg.Observer, cfg.Name; obs != nil {
			gc.Config.Observer = event.Join(cfg.Breaker.Observer, event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if name != "" {
					e.Dependency = name // the client's name, not the key's
				}
				return obs.Observe(ctx, e)
			}))
		}
		t.breakers, _ = breaker.NewGroup(gc) // validated with cfg
	}
	if cfg.Bulkhead != nil {
		t.bulkheads, _ = bulkhead.NewGroup(bulkhead.GroupConfig{Config: *cfg.Bulkhead}) // Config.validate checked cfg.Bulkhead
	}
	return t, nil
}

// Breakers returns the group holding the breaker of each key, for metrics
// and manual control.
func (t *Transport) Breakers() *breaker.Group { return t.breakers }

// baseTransport returns the *http.Transport that NewClient sends through
// for s: proxies from the environment, HTTP/2 when the server offers it,
// up to DefaultMaxIdleConnsPerHost idle connections per host kept 90 s, a
// dialer bounded by the connect timeout and a TLS handshake bounded by the
// TLS timeout.
func baseTransport(s *settings) *http.Transport {
	dialer := &net.Dialer{Timeout: s.connect, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * DefaultMaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   s.tls,
		ExpectContinueTimeout: time.Second,
	}
}

// NewClient returns an *http.Client whose Transport is a Transport over an
// *http.Transport of its own: the proxies of the environment as
// http.ProxyFromEnvironment reads them (once, on first use), HTTP/2 when
// the server offers it, up to DefaultMaxIdleConnsPerHost idle connections
// per host kept 90 s, keep-alive probes every 30 s, a dialer bounded by
// the connect timeout and a TLS handshake bounded by the TLS timeout (so
// that a dial the request gave up on does not linger). The client has no
// Timeout: the request's context, the attempt and the phase timeouts bound
// it. It returns an error naming the field if cfg is invalid (see Config).
func NewClient(cfg Config) (*http.Client, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := cfg.settings()
	t, err := NewTransport(baseTransport(&s), cfg)
	if err != nil {
		return nil, err
	}
	t.envProxy = true
	return &http.Client{Transport: t}, nil
}

// RetryBudget returns the budget retries are spent from, for metrics.
func (t *Transport) RetryBudget() *budget.Budget { return t.policy.BudgetInUse() }

// CloseIdleConnections closes the idle connections of the base transport,
// if it has such a method.
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip sends req under the Transport's policy. See Transport for what
// it returns.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c := call{t: t, req: req}
	if err := c.prepare(); err != nil {
		c.closeBody()
		return nil, err
	}
	gc := guardrail.Call{
		Idempotent: c.idempotence(),
		Dependency: c.dep,
		Breaker:    t.breakers.Get(c.key),
		Discard:    discardResult,
	}
	if !c.replayable() {
		gc.MaxAttempts, gc.NoHedge = 1, true
	}
	if t.bulkheads != nil {
		// The engine takes the slot and, through hold, leaves it to the
		// response: the attempt lasts until its body is read or closed.
		gc.Bulkhead, gc.Hold = t.bulkheads.Get(c.key), t.hold
	}
	if t.hedges && c.hedgeable() {
		// A copy of its own: a hedged call's attempts outlive RoundTrip on
		// the losers' goroutines, so what they use moves to the heap; c,
		// which the unhedged path uses, stays put.
		hc := new(call)
		*hc = c
		hc.mu = new(sync.Mutex)
		resp, err := guardrail.DoHedged(req.Context(), &t.policy, gc, hc.hedgedAttempt)
		return hc.end(resp, err)
	}
	gc.NoHedge = true
	// The engine keeps what the Call points to where c cannot be: a
	// counter of c's own would move all of c to the heap.
	c.resends = counters.Get().(*int)
	gc.Resends = c.resends
	resp, err := guardrail.DoCall(req.Context(), &t.policy, gc, c.attempt)
	*c.resends = 0
	counters.Put(c.resends)
	c.resends = nil
	return c.end(resp, err)
}

// counters holds the resend counters of requests (guardrail.Call.Resends).
var counters = sync.Pool{New: func() any { return new(int) }}

// idempotence is the engine's setting for the request: a POST or PATCH
// with an idempotency key is retried, yet its outcome is unknown when its
// last attempt was lost.
func (c *call) idempotence() guardrail.Idempotence {
	switch {
	case !c.idempotent:
		return guardrail.NotIdempotent
	case c.unsafe:
		return guardrail.IdempotentWithKey
	}
	return guardrail.Idempotent
}

// holdSlot leaves the bulkhead slot of the attempt whose result the engine
// returns to the attempt's response body, which frees it when read or
// closed; without a body, the slot is freed at once.
func (t *Transport) holdSlot(result any, slot *bulkhead.Slot) {
	var resp *http.Response
	switch r := result.(type) {
	case *http.Response:
		resp = r
	case *StatusError:
		resp = r.resp
	}
	if resp != nil {
		if a, ok := resp.Body.(*attempt); ok {
			a.hold(slot)
			return
		}
	}
	slot.Release()
}

// discardResult releases what an attempt the engine threw away holds: the
// response of a failed attempt it retries, or of a hedge that lost.
func discardResult(v any) {
	switch r := v.(type) {
	case *http.Response:
		if r != nil {
			discard(r)
		}
	case *StatusError:
		if r.resp != nil {
			discard(r.resp)
		}
	}
}

// body modes of a request.
const (
	bodyNone     = iota // no body: nothing to replay
	bodyGetBody         // req.Body first, then req.GetBody
	bodyBuffered        // all of it in buf
	bodyOnce            // too large to keep: buf, then the rest of req.Body, once
)

// call is one RoundTrip: one logical request and its attempts.
type call struct {
	t          *Transport
	req        *http.Request
	dep        string
	key        string // the failure domain: breaker and bulkhead key
	idemKey    string // generated Idempotency-Key, or ""
	idempotent bool
	unsafe     bool // the method is not idempotent (POST, PATCH), key or not
	bodyMode   int
	buf        []byte
	bodySent   bool         // req.Body was handed to the base transport, which closes it
	n          int          // attempts started
	resends    *int         // sends the base transport made on its own, for the engine (Call.Resends); nil when hedged
	mu         *sync.Mutex  // a hedged request's: its attempts run at once; nil when not hedged
	chain      *chain.State // the request a server is serving, when it is one; nil otherwise
}

func (c *call) prepare() error {
	t, req := c.t, c.req
	if req.URL == nil {
		return errors.New("guardhttp: nil Request.URL")
	}
	c.key = req.URL.Host
	if t.s.key != nil {
		c.key = t.s.key(req)
	}
	c.dep = t.s.name
	if c.dep == "" {
		c.dep = c.key
	}
	c.idempotent = idempotent(req)
	c.unsafe = !idempotentMethod(req.Method)
	c.chain = chain.FromContext(req.Context())
	if !c.idempotent && t.s.generateKeys && (req.Method == http.MethodPost || req.Method == http.MethodPatch) {
		c.idemKey = newKey()
		c.idempotent = true
	}
	return c.prepareBody()
}

// newKey returns 128 random bits in hex.
func newKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails: crypto/rand crashes the program instead
	return hex.EncodeToString(b[:])
}

// prepareBody decides how the body is sent again, buffering it if needed.
func (c *call) prepareBody() error {
	req, s := c.req, &c.t.s
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		c.bodyMode = bodyNone
		return nil
	case req.GetBody != nil:
		c.bodyMode = bodyGetBody
		return nil
	case s.maxAttempts <= 1 || s.maxBuffered < 0 || req.ContentLength > s.maxBuffered:
		c.bodyMode = bodyOnce
		return nil
	}
	// Memory follows the bytes read, never the declared length, and a
	// limit of math.MaxInt64 does not wrap to "read nothing".
	data, over, err := readlimit.ReadAtMost(req.Body, s.maxBuffered)
	c.buf = data
	if err != nil {
		return err
	}
	if over {
		c.bodyMode = bodyOnce
		return nil
	}
	c.bodyMode = bodyBuffered
	c.bodySent = true
	return req.Body.Close()
}

// replayable reports whether the body can be sent again.
func (c *call) replayable() bool { return c.bodyMode != bodyOnce }

// closeBody closes the caller's body if no attempt handed it to the base
// transport: a RoundTripper must always close it.
func (c *call) closeBody() {
	if !c.bodySent && c.req.Body != nil {
		c.bodySent = true
		c.req.Body.Close()
	}
}

// body returns the body of attempt c.n, its GetBody and its length, and
// whether they are the caller's request's own.
func (c *call) body() (_ io.ReadCloser, _ func() (io.ReadCloser, error), _ int64, same bool, _ error) {
	req := c.req
	switch c.bodyMode {
	case bodyGetBody:
		if !c.bodySent {
			c.bodySent = true
			return req.Body, req.GetBody, req.ContentLength, true, nil
		}
		b, err := req.GetBody()
		return b, req.GetBody, req.ContentLength, false, err
	case bodyBuffered:
		buf := c.buf
		if len(buf) == 0 && req.ContentLength <= 0 {
			return http.NoBody, nil, 0, false, nil
		}
		// A declared length the body did not match is kept, for the base
		// transport to refuse as it would have without us.
		length := req.ContentLength
		if length <= 0 {
			length = int64(len(buf))
		}
		get := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
		return io.NopCloser(bytes.NewReader(buf)), get, length, false, nil
	case bodyOnce:
		if c.bodySent {
			return nil, nil, 0, false, errors.New("guardhttp: request body already sent and not replayable")
		}
		c.bodySent = true
		if len(c.buf) == 0 {
			return req.Body, nil, req.ContentLength, false, nil
		}
		return onceBody{io.MultiReader(bytes.NewReader(c.buf), req.Body), req.Body}, nil, req.ContentLength, false, nil
	}
	return req.Body, req.GetBody, req.ContentLength, true, nil
}

// onceBody is a body partly read ahead: the prefix then the rest.
type onceBody struct {
	io.Reader
	io.Closer
}

// attempt is the operation the retry engine runs: one try of the request.
func (c *call) attempt(actx context.Context) (*http.Response, error) {
	c.n++
	return c.send(actx, c.n)
}

// send sends attempt n and tells the engine what came of it: the response
// on success, else an error marked with the classifier's verdict on the
// response or the error, and whether the request may have reached the
// server. A failed response goes to the engine in a *StatusError with its
// body readable: the engine gives it back (Discard) when it retries, or
// returns it.
func (c *call) send(actx context.Context, n int) (*http.Response, error) {
	t := c.t
	now := time.Now()
	a, r, err := c.newRequest(actx, n, now)
	if err != nil {
		a.finish()
		return nil, guardrail.Permanent(err)
	}
	var stop func() bool
	if c.mu != nil {
		// The engine cancels a losing attempt's context with ErrHedgeLost;
		// the attempt's own context follows the caller's, so end it here.
		stop = context.AfterFunc(actx, func() {
			if cause := context.Cause(actx); errors.Is(cause, guardrail.ErrHedgeLost) {
				a.cancel(cause)
			}
		})
	}
	resp, err := t.base.RoundTrip(r)
	if resp != nil {
		vs, ok := resp.Header[chain.HeaderAdmission]
		if ok && len(vs) > 0 {
			t.levels.Note(c.key, vs[0], true, now)
		} else {
			t.levels.Note(c.key, "", false, now)
		}
	}
	if c.resends != nil {
		if k := a.sends(); k > 1 {
			*c.resends += k - 1
		}
	}
	if err != nil {
		if stop != nil {
			stop()
		}
		err = a.failed(err)
		v := t.s.classify(nil, err)
		v.Unanswered = a.reached && !v.Unsent
		return nil, guardrail.WithVerdict(err, v)
	}
	v := t.s.classify(resp, nil)
	if resp.StatusCode == http.StatusConflict {
		inFlight(r, resp, &v)
	}
	a.handOver(resp)
	if v.Outcome == breaker.Success {
		return resp, nil
	}
	v = v.Marked(chain.MarksOf(resp.Header[chain.HeaderRetried], resp.Header[chain.HeaderNotProcessed]))
	if stop != nil {
		stop()
	}
	return nil, guardrail.WithVerdict(&StatusError{StatusCode: resp.StatusCode, resp: resp}, v)
}

// newRequest builds attempt n and the request it sends, under c.mu for a
// hedged request, whose attempts share the body and the call's count.
func (c *call) newRequest(actx context.Context, n int, now time.Time) (*attempt, *http.Request, error) {
	if c.mu != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
	}
	a := c.t.newAttempt(c, actx, now)
	a.n = n
	body, getBody, length, same, err := c.body()
	if err != nil {
		return a, nil, err
	}
	dl, headers := c.headers(a, n)
	// A shallow copy of the caller's request, in the attempt: WithContext's
	// own copy does not outlive this line, so it costs no allocation.
	a.req = *c.req.WithContext(a.ctx)
	r := &a.req
	if !same {
		r.Body, r.GetBody, r.ContentLength = body, getBody, length
	}
	if headers {
		r.Header = c.header(dl, now, n, &a.vals, &a.digits)
	}
	if r.GetBody != nil && netHTTPResends(r) {
		// net/http sends such a request again by itself when a reused
		// connection fails, but only if it can rewind the body: without
		// GetBody it leaves the retry to us, and the engine counts it.
		r.GetBody = nil
	}
	return a, r, nil
}

// headers returns the deadline of attempt n (zero if none), and whether
// it needs headers the caller's request does not have.
func (c *call) headers(a *attempt, n int) (time.Time, bool) {
	dl, hasDeadline := c.req.Context().Deadline()
	if adl := a.deadlineTime(); !adl.IsZero() && (!hasDeadline || adl.Before(dl)) {
		dl, hasDeadline = adl, true
	}
	_, cohort := c.chain.Cohort()
	return dl, hasDeadline || n > 1 || c.idemKey != "" || c.chain.Amplification() > 1 || cohort
}

// header returns the headers of attempt n, whose deadline is dl (zero:
// none), with the values it adds kept in vals and the deadline's digits in
// digits, both parts of the attempt. now is the attempt's start.
//
// It allocates the map alone, whatever it adds.
func (c *call) header(dl time.Time, now time.Time, n int, vals *[6]string, digits *[40]byte) http.Header {
	hasDeadline := !dl.IsZero()
	// A shallow copy: the caller's value slices are shared, never written
	// (a key we set gets a slice of its own), and the base transport only
	// reads them.
	h := make(http.Header, len(c.req.Header)+len(vals))
	for k, v := range c.req.Header {
		h[k] = v
	}
	var keys [len(vals)]string
	k := 0
	if hasDeadline {
		vals[0], vals[1] = deadlineValues(now, dl.Sub(now)-c.t.s.reserve, digits)
		keys[0], keys[1] = deadline.HeaderTimeout, deadline.HeaderDeadline
		k = 2
	}
	if n > 1 {
		keys[k], vals[k] = deadline.HeaderRetryAttempt, strconv.Itoa(n-1)
		k++
	}
	if c.idemKey != "" {
		keys[k], vals[k] = headerIdempotencyKey, c.idemKey
		k++
	}
	if amp := c.chain.Outgoing(n); amp > 1 {
		keys[k], vals[k] = chain.HeaderAmplification, strconv.Itoa(amp)
		k++
	}
	if cohort, ok := c.chain.Cohort(); ok {
		keys[k], vals[k] = chain.HeaderCohort, strconv.Itoa(cohort)
		k++
	}
	for i := range k {
		h[keys[i]] = vals[i : i+1 : i+1] // a slice of its own: appending to one spills into no other
	}
	return h
}

// deadlineValues returns what deadline.Set writes for a request leaving at
// now with time left d, written in buf, which must not change afterwards:
// the strings are views of it (unsafe.String), so that they cost no
// allocation of their own; buf lives in the attempt, as long as they do.
func deadlineValues(now time.Time, d time.Duration, buf *[40]byte) (timeout, at string) {
	d = max(d, 0)
	b := strconv.AppendInt(buf[:0], int64(d/time.Millisecond), 10)
	n := len(b)
	b = strconv.AppendInt(b, now.Add(d).UnixMilli(), 10)
	s := unsafe.String(&buf[0], len(b))
	return s[:n], s[n:]
}

// end turns the engine's result into RoundTrip's: a failed response the
// engine gave up on is the caller's response, as it would be without
// guardrail; any other error is the engine's, as it returned it, with the
// generated idempotency key around it.
func (c *call) end(resp *http.Response, err error) (*http.Response, error) {
	c.closeBody()
	if err == nil {
		return resp, nil
	}
	cause := err
	if ge, ok := err.(*guardrail.Error); ok {
		cause = ge.Err
	}
	if se, ok := cause.(*StatusError); ok && se.resp != nil {
		return se.resp, nil
	}
	if c.idemKey != "" {
		err = &IdempotencyKeyError{Key: c.idemKey, Err: err}
	}
	return nil, err
}

// phaseObserver names the phase of the timeouts the engine reports: it
// sees an attempt that timed out, the attempt's error says in which phase.
type phaseObserver struct{ next event.Observer }

func (o phaseObserver) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.Timeout && e.Phase == event.PhaseAttempt {
		var te *TimeoutError
		if errors.As(e.Err, &te) {
			e.Phase = te.Phase
		}
	}
	return o.next.Observe(ctx, e)
}
