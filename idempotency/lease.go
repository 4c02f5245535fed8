package idempotency

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail"
)

// minRenewEvery keeps a tiny lease from turning renewal into a busy loop.
const minRenewEvery = time.Millisecond

// renewal keeps a key's lease alive while its handler runs. A timer fires
// every third of the lease and extends it to a full lease from then, so a
// lease has two chances to be renewed before it ends. Nothing runs while no
// renewal is due: the timer's function is the only goroutine, and only
// while it calls the store.
//
// A nil *renewal is valid and does nothing (renewal off).
type renewal struct {
	m            *middleware
	ctx          context.Context // the request's, for its values (logs, traces); never its cancellation
	op           string          // Operation of events
	method       string
	route        string
	key, token   string
	lease, every time.Duration
	begun        time.Time

	mu      sync.Mutex
	timer   *time.Timer        // guarded by mu
	end     time.Time          // guarded by mu; when the lease ends at the latest renewal, by our clock, measured from before the call so never late
	stopped bool               // guarded by mu; the handler returned
	cancel  context.CancelFunc // guarded by mu; cancels the renewal in flight, nil when none
	wg      sync.WaitGroup     // the renewal in flight; Add only under mu while !stopped
}

// renew starts renewing the lease that token took on key at begun, unless
// renewal is off.
func (m *middleware) renew(r *http.Request, route, key, token string, lease time.Duration, begun time.Time) *renewal {
	if m.cfg.DisableLeaseRenewal {
		return nil
	}
	rn := &renewal{
		m: m, ctx: r.Context(), op: operation(r), method: r.Method, route: route,
		key: key, token: token, lease: lease, every: max(lease/3, minRenewEvery),
		begun: begun, end: begun.Add(lease),
	}
	rn.mu.Lock() // fire reads rn.timer
	rn.timer = time.AfterFunc(time.Until(begun.Add(rn.every)), rn.fire)
	rn.mu.Unlock()
	return rn
}

// stop ends renewal when the handler has returned: no renewal starts after
// it, and one in flight is cancelled and waited for, so that nothing
// touches the key or logs for this request once stop returns.
func (rn *renewal) stop() {
	if rn == nil {
		return
	}
	rn.mu.Lock()
	rn.stopped = true
	rn.timer.Stop()
	if rn.cancel != nil {
		rn.cancel()
	}
	rn.mu.Unlock()
	rn.wg.Wait()
}

// fire renews the lease once, then schedules the next renewal or gives up.
func (rn *renewal) fire() {
	rn.mu.Lock()
	if rn.stopped {
		rn.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rn.ctx), rn.m.storeTimeout)
	rn.cancel = cancel
	rn.wg.Add(1)
	rn.mu.Unlock()
	defer rn.wg.Done()

	start := time.Now()
	err := rn.m.store.Extend(ctx, rn.key, rn.token, rn.lease)
	cancel()

	rn.mu.Lock()
	rn.cancel = nil
	if rn.stopped { // the handler returned meanwhile: the outcome no longer matters
		rn.mu.Unlock()
		return
	}
	next := start.Add(rn.every)
	again := false
	switch {
	case err == nil:
		rn.end = start.Add(rn.lease)
		again = true
	case errors.Is(err, ErrLockLost):
		// Nothing left to renew; Complete or Release will be refused too.
	default:
		again = next.Before(rn.end) // another try fits before the lease ends
	}
	if again {
		rn.timer.Reset(time.Until(next))
	}
	end := rn.end
	rn.mu.Unlock()

	if err != nil {
		rn.report(err, again, start, end)
	}
}

// report logs a failed renewal at start, with the lease ending at end, and
// emits a store_error event. again says whether another renewal is due.
func (rn *renewal) report(err error, again bool, start, end time.Time) {
	rn.m.emitOp(rn.ctx, rn.op, guardrail.ReasonStoreError, err)
	attrs := []any{"err", err, "method", rn.method, "route", rn.route,
		"running", start.Sub(rn.begun).Round(time.Millisecond)}
	switch {
	case errors.Is(err, ErrLockLost):
		rn.m.log.ErrorContext(rn.ctx, "idempotency: the key's lease was lost while the handler ran (it ended before a renewal reached the store, and a retry may have taken the key over); the handler goes on, but a retry may run the request again and this response will not be stored", attrs...)
	case again:
		rn.m.log.WarnContext(rn.ctx, "idempotency: renewing the key's lease failed; trying again at the next renewal",
			append(attrs, "lease_left", end.Sub(start).Round(time.Millisecond))...)
	default:
		rn.m.log.ErrorContext(rn.ctx, "idempotency: renewing the key's lease failed and no renewal is left before it ends; once it ends, a retry may run the request again while the handler still runs",
			append(attrs, "lease_left", end.Sub(start).Round(time.Millisecond))...)
	}
}
