package fallback

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrRequired means a required part of a request failed, so the request
// failed.
var ErrRequired = errors.New("fallback: required part failed")

// PartError is the error Group.Wait returns when a required part failed. It
// Is ErrRequired and unwraps to the part's error. It is not modified after
// it is returned, so it is safe to share.
type PartError struct {
	// Part is the failed part's name.
	Part string
	// Err is its error.
	Err error
}

// Error returns "fallback: required part failed: <part>: <error>".
func (e *PartError) Error() string {
	return ErrRequired.Error() + ": " + e.Part + ": " + e.Err.Error()
}

// Is reports whether target is ErrRequired.
func (e *PartError) Is(target error) bool { return target == ErrRequired }

// Unwrap returns the part's error.
func (e *PartError) Unwrap() error { return e.Err }

// Group runs the parts of one request concurrently, some required and some
// optional (seed 003, card 037: B is required, C optional). Every part runs
// under the request's context, so the request's deadline and cancellation
// reach it, and may have its own shorter timeout: min(timeout, time left).
//
// When a required part fails, the group's context is cancelled at once, so
// the other parts stop and Wait returns the failure before the deadline,
// not at it. When an optional part fails or times out, the request goes on
// without it and Partial reports true, so the answer can say it is partial
// ({"C": null, "partial": true} and MarkPartial on the response) instead of
// failing as a whole.
//
// Wait returns only when every part has returned: a part must honour its
// context, and then no goroutine outlives the request. A Group is for one
// request: add parts with Required and Optional, then call Wait once. Its
// methods are safe for concurrent use.
type Group struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	err      error    // the first required failure
	missing  []string // optional parts that failed, in completion order
	panicked any      // the first panic in a part
	hasPanic bool
}

// NewGroup returns a Group whose parts run under ctx.
func NewGroup(ctx context.Context) *Group {
	ctx, cancel := context.WithCancelCause(ctx)
	return &Group{ctx: ctx, cancel: cancel}
}

// Part is one part of a Group's request and, after Wait, its result. Its
// methods may be called from any goroutine once Wait has returned, not
// before.
type Part[T any] struct {
	name  string
	value T
	err   error
}

// Name returns the part's name.
func (p *Part[T]) Name() string { return p.name }

// Value returns the part's result and true if it succeeded, or the zero T
// and false. Call it after Group.Wait.
func (p *Part[T]) Value() (T, bool) { return p.value, p.err == nil }

// Err returns the part's error, or nil. Call it after Group.Wait.
func (p *Part[T]) Err() error { return p.err }

// Required starts fn as a part the request cannot do without: its failure
// cancels the other parts and becomes Wait's error. A timeout above zero
// bounds the part (within the request's deadline); zero means the request's
// deadline only.
func Required[T any](g *Group, name string, timeout time.Duration, fn func(context.Context) (T, error)) *Part[T] {
	return start(g, name, timeout, true, fn)
}

// Optional starts fn as a part the request can do without: if it fails or
// times out, the request goes on and Partial reports true. A timeout above
// zero bounds the part (within the request's deadline), so that a slow
// optional dependency costs at most that much; zero means the request's
// deadline only.
func Optional[T any](g *Group, name string, timeout time.Duration, fn func(context.Context) (T, error)) *Part[T] {
	return start(g, name, timeout, false, fn)
}

func start[T any](g *Group, name string, timeout time.Duration, required bool, fn func(context.Context) (T, error)) *Part[T] {
	p := &Part[T]{name: name}
	g.wg.Go(func() {
		ctx, cancel := g.ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, timeout)
		}
		defer cancel()
		defer func() {
			if v := recover(); v != nil {
				p.err = fmt.Errorf("fallback: part %s panicked: %v", name, v)
				g.fail(p.err, v, true)
			}
		}()
		p.value, p.err = fn(ctx)
		if p.err == nil {
			return
		}
		var zero T
		p.value = zero // a failed part has no value, whatever fn returned
		if required {
			g.fail(&PartError{Part: name, Err: p.err}, nil, false)
			return
		}
		g.mu.Lock()
		g.missing = append(g.missing, name)
		g.mu.Unlock()
	})
	return p
}

func (g *Group) fail(err error, panicValue any, panicked bool) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	if panicked && !g.hasPanic {
		g.panicked, g.hasPanic = panicValue, true
	}
	g.mu.Unlock()
	g.cancel(err)
}

// Context returns the context the parts run under: the request's, cancelled
// when a required part fails or Wait returns. Use it for work done beside
// the parts.
func (g *Group) Context() context.Context { return g.ctx }

// Wait waits for every part to return and reports the first required
// failure (a *PartError), or nil. If a part panicked, Wait panics with the
// same value once the others have stopped.
func (g *Group) Wait() error {
	g.wg.Wait()
	g.cancel(context.Canceled)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.hasPanic {
		panic(g.panicked)
	}
	return g.err
}

// Partial reports whether an optional part failed or timed out, so the
// result lacks it. Call it after Wait.
func (g *Group) Partial() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.missing) > 0
}

// Missing returns the names of the optional parts that failed, in the order
// they failed. Call it after Wait.
func (g *Group) Missing() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.missing...)
}
