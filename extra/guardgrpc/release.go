package guardgrpc

import (
	"context"
	"fmt"
	"sync"

	"github.com/guardrail-go/guardrail/idempotency"
)

// keyRunKey is the context key of the *keyRun of a call run under its
// idempotency key, or of unprotectedRun for a call let through without one.
type keyRunKey struct{}

// unprotectedRun marks a call the interceptor lets through without a key to
// protect it, by the configuration's choice (no key while
// KeyConfig.Required is false, or KeyConfig.FailOpen after a store
// failure), so that ReleaseKey needs no special case for it.
type unprotectedRun struct{}

func unprotectedCall(ctx context.Context) context.Context {
	return context.WithValue(ctx, keyRunKey{}, unprotectedRun{})
}

// keyRun is what ReleaseKey records for a call run under its key. It is
// safe for concurrent use.
type keyRun struct {
	mu       sync.Mutex
	done     bool // the handler has ended
	released bool // ReleaseKey was called before it ended
}

// finish marks the handler ended and reports whether it released its key.
func (r *keyRun) finish() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.done = true
	return r.released
}

// errHandlerEnded is ReleaseKey's error once the call's key is being, or
// has been, stored or released.
var errHandlerEnded = fmt.Errorf("%w: the handler has returned", idempotency.ErrLeaseLost)

// ReleaseKey tells the server that the unary call ctx belongs to has
// committed nothing and will commit nothing: when its handler ends,
// however it ends (an answer, an error, a panic), its idempotency key is
// released rather than stored, so that a retry with the key runs the
// handler again. The answer is still sent to this call's client. It is
// the gRPC form of idempotency.Release, which works only on requests of
// the HTTP middleware.
//
// Call it when the handler knows that no side effect happened, typically
// right before it gives up on an error that it may re-raise as a panic: a
// panic otherwise leaves the key's outcome unknown, and retries get
// INTERNAL until the key expires (see KeyConfig). It does no I/O and
// cannot be undone.
//
// It returns nil once recorded, and nil for a call let through unprotected
// (no key while KeyConfig.Required is false, or KeyConfig.FailOpen after a
// store failure: nothing to release); an error matching
// idempotency.ErrLeaseLost if the handler has already returned; and
// idempotency.ErrNoLease when ctx does not come from a call the
// interceptor handles under KeyConfig (a stream, a method outside
// KeyConfig.Methods, a server without Keys). It is safe for concurrent
// use.
func ReleaseKey(ctx context.Context) error {
	switch r := ctx.Value(keyRunKey{}).(type) {
	case *keyRun:
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.done {
			return errHandlerEnded
		}
		r.released = true
		return nil
	case unprotectedRun:
		return nil
	}
	return idempotency.ErrNoLease
}
