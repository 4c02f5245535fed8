package guardhttp

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
)

// Overload reports whether the answer says the server is overloaded (429
// Too Many Requests, 503 Service Unavailable), for guardrail.Overloader:
// hedging pauses and the throttle does not count it as accepted.
func (e *StatusError) Overload() bool {
	return e.StatusCode == http.StatusTooManyRequests || e.StatusCode == http.StatusServiceUnavailable
}

// hedgeable reports whether the engine may hedge the request: its method
// is idempotent (GET, HEAD, PUT, DELETE...) and its body can be sent more
// than once. A POST or PATCH is not hedged even with an idempotency key:
// two copies in flight at once meet the server's "same key in flight"
// refusal (409), not a replay.
func (c *call) hedgeable() bool {
	return c.t.hedges && c.idempotent && !c.unsafe && c.replayable()
}

// discardLoser releases the response of an attempt that lost a hedge race:
// its body is closed, which ends the attempt and frees its connection.
func discardLoser(v any) {
	if resp, ok := v.(*http.Response); ok && resp != nil && resp.Body != nil {
		resp.Body.Close()
	}
}

// hedgedCall is the state a hedged request's attempts share: they run at
// once, so the call's attempt count, body and the fields here are under
// mu, and their failed responses and marks are lists.
type hedgedCall struct {
	mu       sync.Mutex
	inflight int
	pendings []*http.Response
	marks    []mark
	ended    bool
}

// mark is an error handed to the engine and the caller's error it marks.
type mark struct{ marked, raw error }

// hedgedAttempt is attempt for a hedged request, whose attempts the engine
// may run at once: the call's shared state (attempt count, body, pending
// responses, marks) is read and written under c.mu, and the round trip
// itself runs outside it.
func (c *call) hedgedAttempt(actx context.Context) (*http.Response, error) {
	t := c.t
	c.hs.mu.Lock()
	if c.hs.inflight == 0 {
		// A new round: every attempt of the last one has ended, so its
		// failed responses will not be returned.
		for _, p := range c.hs.pendings {
			discard(p)
		}
		c.hs.pendings = c.hs.pendings[:0]
	}
	c.hs.inflight++
	c.n++
	n := c.n
	c.hs.mu.Unlock()
	defer func() {
		c.hs.mu.Lock()
		c.hs.inflight--
		c.hs.mu.Unlock()
	}()

	var release func()
	if t.bulkheads != nil {
		var err error
		if release, err = c.acquire(n); err != nil {
			return nil, err // marked by acquire
		}
	}
	now := time.Now()
	c.hs.mu.Lock()
	a := t.newAttempt(c, actx, now)
	a.n = n
	a.release = release
	body, getBody, length, same, err := c.body()
	if err != nil {
		c.hs.mu.Unlock()
		a.finish()
		return nil, c.hedgeMark(err, guardrail.Verdict{Outcome: breaker.Ignored}, nil)
	}
	saved := c.n
	c.n = n // headers and header read the attempt number from the call
	dl, headers := c.headers(a)
	a.req = *c.req.WithContext(a.ctx)
	r := &a.req
	if !same {
		r.Body, r.GetBody, r.ContentLength = body, getBody, length
	}
	if headers {
		r.Header = c.header(dl, now, &a.vals, &a.digits)
	}
	c.n = saved
	c.hs.mu.Unlock()

	// The engine cancels a losing attempt's context with ErrHedgeLost; the
	// attempt's own context follows the caller's, so end it here.
	stop := context.AfterFunc(actx, func() {
		if cause := context.Cause(actx); errors.Is(cause, guardrail.ErrHedgeLost) {
			a.cancel(cause)
		}
	})
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		stop()
		err = a.failed(err)
		return nil, c.hedgeMark(err, t.s.classify(nil, err), nil)
	}
	v := t.s.classify(resp, nil)
	if v.Outcome == breaker.Success {
		a.handOver(resp)
		return resp, nil
	}
	stop()
	if v.Retryable && n < t.s.maxAttempts {
		a.buffer(resp) // may be thrown away: free its connection now
	} else {
		a.handOver(resp)
	}
	return nil, c.hedgeMark(&StatusError{StatusCode: resp.StatusCode, resp: resp}, v, resp)
}

// hedgeMark is mark for hedged attempts: the marks and the failed
// responses are kept, all of them, for end to find the one the engine
// returned; after end, a late loser's response is released at once.
func (c *call) hedgeMark(err error, v guardrail.Verdict, resp *http.Response) error {
	marked := guardrail.WithVerdict(err, v)
	c.hs.mu.Lock()
	defer c.hs.mu.Unlock()
	if c.hs.ended {
		if resp != nil {
			discard(resp)
		}
		return marked
	}
	c.hs.marks = append(c.hs.marks, mark{marked, err})
	if resp != nil {
		c.hs.pendings = append(c.hs.pendings, resp)
	}
	return marked
}

// endHedged is end for a hedged request.
func (c *call) endHedged(resp *http.Response, err error) (*http.Response, error) {
	c.closeBody()
	c.hs.mu.Lock()
	c.hs.ended = true
	pendings, marks := c.hs.pendings, c.hs.marks
	c.hs.pendings, c.hs.marks = nil, nil
	c.hs.mu.Unlock()
	var keep *http.Response
	var se *StatusError
	if err != nil && errors.As(err, &se) && se.resp != nil {
		for _, p := range pendings {
			if p == se.resp {
				keep = p
			}
		}
	}
	for _, p := range pendings {
		if p != keep {
			discard(p)
		}
	}
	if err == nil {
		return resp, nil
	}
	if keep != nil {
		return keep, nil
	}
	var ge *guardrail.Error
	for _, m := range marks {
		switch {
		case err == m.marked:
			return nil, m.raw
		case errors.As(err, &ge) && ge.Err == m.marked:
			ge.Err = m.raw
			return nil, err
		}
	}
	return nil, err
}
