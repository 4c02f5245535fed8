package guardhttp

import (
	"context"
	"net/http"
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

// hedgedAttempt is attempt for a hedged request, whose attempts the
// engine may run at once: the attempt count and the body are shared under
// c.mu, and the round trip itself runs outside it.
func (c *call) hedgedAttempt(actx context.Context) (*http.Response, error) {
	c.mu.Lock()
	c.n++
	n := c.n
	c.mu.Unlock()
	return c.send(actx, n)
}
