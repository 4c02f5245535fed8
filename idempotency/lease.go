package idempotency

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/event"
)

// Errors Held and Confirm return.
var (
	// ErrLeaseLost: the request's lease on its key is no longer known to
	// be held, so a retry may run the request again: a renewal or Confirm
	// found the lock lost (the error then matches ErrLockLost too), the
	// lease's end passed without a renewal, or the handler has returned or
	// hijacked the connection.
	// A handler that gets it must not commit a side effect.
	ErrLeaseLost = errors.New("idempotency: lease lost")
	// ErrNoLease: the context does not come from a request run under a
	// Session (Session.Context) or let through Unprotected: a request with
	// a method the middleware passes through (not in Config.Methods), or a
	// context from elsewhere, such as a handler that is not behind the
	// middleware or interceptor at all. A request the middleware lets
	// through unprotected (no key while Config.Required is false, or run by
	// Config.FailOpen after a store failure) is not one of these: Held,
	// Confirm and Release return nil for it.
	ErrNoLease = errors.New("idempotency: no lease in context")
)

// unprotected is the value under leaseKey of a request the middleware lets
// through without a key to protect it, by the configuration's choice.
type unprotected struct{}

// Unprotected returns ctx marked as the context of a request that a
// transport lets through without a key to protect it, by its
// configuration's choice: no key where none is required, or a store
// failure where the transport fails open. Held, Confirm and Release
// return nil for it, so that a handler needs no special case for such a
// request. The HTTP middleware and guardgrpc's interceptor mark theirs;
// a transport built on Keys calls it itself.
func Unprotected(ctx context.Context) context.Context {
	return context.WithValue(ctx, leaseKey{}, unprotected{})
}

// leaseOf returns the renewal of ctx's request, or nil with the error Held
// returns when there is none: nil for a request let through unprotected,
// ErrNoLease otherwise.
func leaseOf(ctx context.Context) (*renewal, error) {
	switch v := ctx.Value(leaseKey{}).(type) {
	case *renewal:
		return v, nil
	case unprotected:
		return nil, nil
	}
	return nil, ErrNoLease
}

// errReturned is why a lease is no longer the request's once its handler
// has returned or hijacked the connection: the key is being, or has been,
// completed or released.
var errReturned = fmt.Errorf("%w: the handler has returned or hijacked the connection", ErrLeaseLost)

// leaseKey is the context key of the *renewal of a request the middleware
// runs under a lease, or of unprotected{} for one it lets through.
type leaseKey struct{}

// Held returns nil if the request that ctx belongs to still holds its
// idempotency key, and otherwise an error saying why not. ctx is the
// context of a handler behind the HTTP middleware or guardgrpc's
// interceptor, or one derived from Session.Context. It does no I/O, so a
// handler can call it as often as it likes.
//
// The key is held while its lease's end, as of the lock or the latest
// renewal or Confirm that succeeded, is still ahead by the local clock.
// That end is measured from before each store call, so Held never reports
// a lease held after the store let it end; it may report it lost early, by
// up to the time a store call takes.
//
// Held returns an error matching ErrLeaseLost once a renewal or Confirm
// found the lock lost, once the lease's end passed (renewals kept failing,
// or renewal is off and the handler outran the lease), and once the
// handler has returned. Once Held or Confirm reported the lease lost, both
// keep reporting it for the rest of the request. With
// Config.CancelOnLeaseLost, the handler's context is cancelled, with that
// error as its cause, as soon as the lease is lost.
//
// For a request let through unprotected (no key while Config.Required is
// false, or Config.FailOpen after a store failure; see Unprotected), Held
// returns nil: nothing guards it, so nothing can be lost, and the handler
// goes on as it would without the middleware. It returns ErrNoLease when
// ctx does not come from a request run under a key.
//
// A nil result says the key is held now, not for how long: before a side
// effect that must not happen twice, call Confirm instead.
//
// Held is safe for concurrent use.
func Held(ctx context.Context) error {
	rn, err := leaseOf(ctx)
	if rn == nil {
		return err
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.check(time.Now())
}

// Confirm extends the lease of the request that ctx belongs to, now, with
// one store call (Store.Extend with the request's lock token). When it
// returns nil, the key is held for at least one more lease (Config.Lease,
// or the longer one a request deadline set) from the moment Confirm was
// called. Call it right before committing a side effect that must not
// happen twice, such as charging a card, commit only if it returns nil,
// and keep the commit well within the lease.
//
// It returns an error matching ErrLeaseLost, without calling the store,
// when Held would; one matching both ErrLeaseLost and ErrLockLost when the
// store says the request no longer holds the key; and the store's error
// (or ctx's) when the call failed, in which case the lease is as it was,
// held until its end unless a renewal succeeds. Like Held, it returns nil
// without calling the store for a request let through unprotected (no key
// while Config.Required is false, or FailOpen), so a handler can call it
// before every commit whether or not the request has a key; and
// ErrNoLease when ctx does not come from a request the middleware
// handles. The call is bounded by Config.StoreTimeout as well as by ctx, so
// it fails once the client has gone if ctx is the request's: a handler
// that goes on committing after that can pass context.WithoutCancel of it,
// through which the lease is still found.
//
// Confirm also extends a lease that is not renewed (DisableLeaseRenewal).
// It is safe for concurrent use.
func Confirm(ctx context.Context) error {
	rn, err := leaseOf(ctx)
	if rn == nil {
		return err
	}
	rn.mu.Lock()
	start := time.Now()
	err = rn.check(start)
	rn.mu.Unlock()
	if err != nil {
		return err
	}

	sctx, cancel := context.WithTimeout(ctx, rn.k.storeTimeout)
	err = rn.k.store.Extend(sctx, rn.key, rn.token, rn.lease)
	cancel()

	rn.mu.Lock()
	defer rn.mu.Unlock()
	switch {
	case errors.Is(err, ErrLockLost):
		rn.lose(lockLost(err))
	case err != nil:
		return fmt.Errorf("idempotency: confirming the lease: %w", err)
	case !rn.stopped:
		rn.extended(start)
		if rn.idle { // the store is back: renew again, from this renewal on
			rn.idle = false
			rn.timer.Reset(time.Until(start.Add(rn.every)))
		}
	}
	// The lease may have been reported lost while the call was in flight,
	// or the call may have taken longer than the lease itself.
	return rn.check(time.Now())
}

// Release tells the middleware (or guardgrpc's interceptor, or whatever
// ends the request's Session) that the request that ctx belongs to has
// committed nothing and will commit nothing: when its handler ends,
// however it ends (a response, a panic, a hijacked connection), its key is
// released rather than stored, so that a retry with the key runs the
// handler again. The response is still sent to this request's client.
//
// Call it when the handler knows that no side effect happened, typically
// right before it gives up on an error that it may re-raise as a panic: a
// panic or a hijack otherwise leaves the key's outcome unknown, and
// retries get 500 until the key expires (see Server.Middleware). It does
// no I/O and cannot be undone.
//
// A hijack settles the key when the connection is taken over, so call
// Release before hijacking.
//
// It returns nil once recorded, and nil for a request let through
// unprotected (nothing to release); an error matching ErrLeaseLost if the
// handler has already returned or hijacked the connection; and ErrNoLease
// when ctx does not come from a request run under a key. It is safe for
// concurrent use.
func Release(ctx context.Context) error {
	rn, err := leaseOf(ctx)
	if rn == nil {
		return err
	}
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.stopped {
		return errReturned
	}
	rn.released = true
	return nil
}

// lockLost is why a lease is lost when the store said err (ErrLockLost).
func lockLost(err error) error {
	return fmt.Errorf("%w: the store no longer holds the key for this request: %w", ErrLeaseLost, err)
}

// minRenewEvery keeps a tiny lease from turning renewal into a busy loop.
const minRenewEvery = time.Millisecond

// renewal, the state of a Session, tracks a key's lease while its handler runs, for Held and
// Confirm, and keeps it alive unless renewal is off. A timer fires every
// third of the lease and extends it to a full lease from then, so a lease
// has two chances to be renewed before it ends. Nothing runs while no
// renewal is due: the timer's function is the only goroutine, and only
// while it calls the store. With CancelOnLeaseLost a second timer fires
// at the lease's end, moved by each renewal.
type renewal struct {
	k            *Keys
	ctx          context.Context // Begin's, for its values (logs, traces); never its cancellation
	hctx         context.Context // the handler's: ctx with the lease, cancelled on a lost lease with CancelOnLeaseLost
	op           string          // Operation of events
	attrs        []slog.Attr     // attributes of log lines
	key, token   string
	lease, every time.Duration
	begun        time.Time
	abort        context.CancelCauseFunc // cancels the handler's context; nil unless CancelOnLeaseLost

	mu       sync.Mutex
	timer    *time.Timer        // guarded by mu; nil when renewal is off
	expiry   *time.Timer        // guarded by mu; fires at end to cancel the handler's context; nil unless abort is set
	end      time.Time          // guarded by mu; when the lease ends at the latest renewal or Confirm, by our clock, measured from before the call so never late
	failed   error              // guarded by mu; the latest renewal's error, nil once one succeeds
	lost     error              // guarded by mu; why the lease was reported lost (ErrLeaseLost), nil until then
	idle     bool               // guarded by mu; renewal gave up before the lease's end: none is scheduled or in flight
	stopped  bool               // guarded by mu; the handler returned
	released bool               // guarded by mu; Release was called: free the key, whatever the outcome
	finished bool               // guarded by mu; the Session was ended (Complete, Release, Unknown)
	cancel   context.CancelFunc // guarded by mu; cancels the renewal in flight, nil when none
	wg       sync.WaitGroup     // the renewal in flight; Add only under mu while !stopped
}

// start returns the Session of the lock that token took on key at begun
// for lease, and starts renewing it unless renewal is off. Its context is
// ctx with the lease in it for Held and Confirm and, with
// CancelOnLeaseLost, cancelled when the lease is lost.
func (k *Keys) start(ctx context.Context, op string, attrs []slog.Attr, key, token string, lease time.Duration, begun time.Time) *Session {
	s := &Session{renewal{
		k: k, ctx: ctx, op: op, attrs: attrs,
		key: key, token: token, lease: lease, every: max(lease/3, minRenewEvery),
		begun: begun, end: begun.Add(lease),
	}}
	rn := &s.renewal
	rn.hctx = context.WithValue(ctx, leaseKey{}, rn)
	if k.cancelOnLost {
		rn.hctx, rn.abort = context.WithCancelCause(rn.hctx)
	}
	rn.mu.Lock() // the timers' functions read them
	if k.renew {
		rn.timer = time.AfterFunc(time.Until(begun.Add(rn.every)), rn.fire)
	}
	if rn.abort != nil {
		rn.expiry = time.AfterFunc(time.Until(rn.end), rn.expire)
	}
	rn.mu.Unlock()
	return s
}

// with returns the session's log attributes followed by kv, as the
// arguments of a log call.
func (rn *renewal) with(kv ...any) []any {
	out := make([]any, 0, len(rn.attrs)+len(kv))
	for _, a := range rn.attrs {
		out = append(out, a)
	}
	return append(out, kv...)
}

// stop ends renewal when the handler has returned: no renewal starts after
// it, and one in flight is cancelled and waited for, so that nothing
// touches the key or logs for this request once stop returns. From then
// on Held and Confirm report the lease lost. (A Confirm already in flight
// is the caller's own call; the store refuses it once the key is completed
// or released, and it changes nothing before.) With CancelOnLeaseLost the
// handler's context is cancelled if cancelContext is set, as net/http
// would once the request ends; a hijack stops renewal without it, because
// the handler still runs and its context stays valid until it returns. It
// may be called again, and returns whether the handler called Release.
func (rn *renewal) stop(cancelContext bool) (released bool) {
	rn.mu.Lock()
	rn.stopped = true
	if rn.timer != nil {
		rn.timer.Stop()
	}
	if rn.abort != nil {
		rn.expiry.Stop()
		if cancelContext {
			rn.abort(nil)
		}
	}
	if rn.cancel != nil {
		rn.cancel()
	}
	released = rn.released
	rn.mu.Unlock()
	rn.wg.Wait()
	return released
}

// check returns nil if the lease is known held at now, and otherwise why
// it is not, matching ErrLeaseLost. The caller holds mu.
func (rn *renewal) check(now time.Time) error {
	switch {
	case rn.lost != nil:
		return rn.lost
	case rn.stopped:
		return errReturned
	case !now.Before(rn.end):
		rn.lose(rn.ended())
		return rn.lost
	}
	return nil
}

// lose records why the lease is lost, unless it already was or the
// handler has returned, and with CancelOnLeaseLost cancels the handler's
// context for that cause. The caller holds mu; cancelling runs none of our
// code, so it cannot come back for mu.
func (rn *renewal) lose(why error) {
	if rn.lost == nil && !rn.stopped {
		rn.lost = why
		if rn.abort != nil {
			rn.abort(why)
		}
	}
}

// ended says why the lease ended without a renewal. The caller holds mu.
func (rn *renewal) ended() error {
	switch {
	case rn.timer == nil:
		return fmt.Errorf("%w: it ended, and lease renewal is off", ErrLeaseLost)
	case rn.failed != nil:
		return fmt.Errorf("%w: it ended while renewing it failed: %w", ErrLeaseLost, rn.failed)
	}
	return fmt.Errorf("%w: it ended before a renewal succeeded", ErrLeaseLost)
}

// extended records that a renewal or Confirm that started at start
// succeeded. Calls may overlap, so the end only moves forward. The caller
// holds mu.
func (rn *renewal) extended(start time.Time) {
	if end := start.Add(rn.lease); end.After(rn.end) {
		rn.end = end
		if rn.expiry != nil {
			rn.expiry.Reset(time.Until(end))
		}
	}
}

// expire runs when the lease's end passes, with CancelOnLeaseLost: unless
// a renewal or Confirm moved the end meanwhile (and set the timer again),
// the lease is lost, and check cancels the handler's context.
func (rn *renewal) expire() {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	rn.check(time.Now())
}

// fire renews the lease once, then schedules the next renewal or gives up.
func (rn *renewal) fire() {
	rn.mu.Lock()
	if rn.stopped {
		rn.mu.Unlock()
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(rn.ctx), rn.k.storeTimeout)
	rn.cancel = cancel
	rn.wg.Add(1)
	rn.mu.Unlock()
	defer rn.wg.Done()

	start := time.Now()
	err := rn.k.store.Extend(ctx, rn.key, rn.token, rn.lease)
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
		rn.failed = nil
		rn.extended(start)
		again = true
	case errors.Is(err, ErrLockLost):
		// Nothing left to renew; Complete or Release will be refused too.
		rn.lose(lockLost(err))
	default:
		rn.failed = err
		again = next.Before(rn.end) // another try fits before the lease ends
	}
	if again {
		rn.timer.Reset(time.Until(next))
	} else {
		rn.idle = rn.lost == nil // a Confirm that succeeds may still revive it
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
	rn.k.emit(rn.ctx, rn.op, event.ReasonStoreError, err)
	attrs := rn.with("err", err, "running", start.Sub(rn.begun).Round(time.Millisecond))
	switch {
	case errors.Is(err, ErrLockLost) && rn.abort != nil:
		rn.k.log.ErrorContext(rn.ctx, "idempotency: the key's lease was lost while the handler ran (it ended before a renewal reached the store, and a retry may have taken the key over); the handler's context is cancelled (CancelOnLeaseLost), a retry may run the request again, and this response will not be stored", attrs...)
	case errors.Is(err, ErrLockLost):
		rn.k.log.ErrorContext(rn.ctx, "idempotency: the key's lease was lost while the handler ran (it ended before a renewal reached the store, and a retry may have taken the key over); the handler goes on, but a retry may run the request again and this response will not be stored", attrs...)
	case again:
		rn.k.log.WarnContext(rn.ctx, "idempotency: renewing the key's lease failed; trying again at the next renewal",
			append(attrs, "lease_left", end.Sub(start).Round(time.Millisecond))...)
	case rn.abort != nil:
		rn.k.log.ErrorContext(rn.ctx, "idempotency: renewing the key's lease failed and no renewal is left before it ends; when it ends, the handler's context is cancelled (CancelOnLeaseLost) and a retry may run the request again",
			append(attrs, "lease_left", end.Sub(start).Round(time.Millisecond))...)
	default:
		rn.k.log.ErrorContext(rn.ctx, "idempotency: renewing the key's lease failed and no renewal is left before it ends; once it ends, a retry may run the request again while the handler still runs",
			append(attrs, "lease_left", end.Sub(start).Round(time.Millisecond))...)
	}
}
