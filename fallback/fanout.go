package fallback

import (
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// PartError is the error Fanout.Wait returns when a required part failed:
// the only error Wait returns. It unwraps to the part's error. It is not
// modified after it is returned, so it is safe to share.
type PartError struct {
	// Part is the failed part's name.
	Part string
	// Err is its error.
	Err error
}

// Error returns "fallback: required part failed: <part>: <error>".
func (e *PartError) Error() string {
	return "fallback: required part failed: " + e.Part + ": " + e.Err.Error()
}

// Unwrap returns the part's error.
func (e *PartError) Unwrap() error { return e.Err }

// Fanout fetches the parts of one answer concurrently, each required or
// optional, like an errgroup that can answer without its optional parts. A
// product page, say, needs the product and its price (required) and would
// like its reviews (optional). Every part runs under the request's context,
// so the request's deadline and cancellation reach it, and may have its own
// shorter timeout: min(timeout, time left).
//
// When a required part fails, the fanout's context is cancelled at once, so
// the other parts stop and Wait returns the failure before the deadline,
// not at it. When an optional part fails or times out, the request goes on
// without it and Missing names it, so the answer can say it is partial
// ({"reviews": null, "partial": true} and MarkPartial on the response)
// instead of failing as a whole.
//
// Wait returns only when every part has returned: a part must honour its
// context, and then no goroutine outlives the request. A Fanout is for one
// request: add parts with Required and Optional, then call Wait once. Its
// methods are safe for concurrent use. (It is unrelated to breaker.Group,
// which holds one circuit breaker per key.)
type Fanout struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	err      error       // the first required failure
	missing  []string    // optional parts that failed, in completion order
	panicked *PanicError // the first panic in a part
}

// NewFanout returns a Fanout whose parts run under ctx.
func NewFanout(ctx context.Context) *Fanout {
	ctx, cancel := context.WithCancelCause(ctx)
	return &Fanout{ctx: ctx, cancel: cancel}
}

// PanicError is a part's panic, recovered in the part's goroutine, where
// the stack still shows where it happened. Wait panics with it once every
// other part has stopped, so that the panic reaches the request's goroutine
// (and its recovery middleware) with the part's stack instead of Wait's.
// When the panic value is an error, it unwraps to it. It is not modified
// after it is made, so it is safe to share.
type PanicError struct {
	// Part is the name of the part that panicked.
	Part string
	// Value is the value the part panicked with.
	Value any
	// Stack is the part's goroutine stack at the panic, as runtime/debug.Stack
	// formats it.
	Stack []byte
}

// Error returns "fallback: part <name> panicked: <value>" followed by a
// newline and the stack of the part, so that a log of the error or of the
// re-panic shows where the part panicked.
func (e *PanicError) Error() string {
	return fmt.Sprintf("fallback: part %s panicked: %v\n\n%s", e.Part, e.Value, e.Stack)
}

// Unwrap returns the panic value if it is an error, or nil.
func (e *PanicError) Unwrap() error {
	err, _ := e.Value.(error)
	return err
}

// Part is one part of a Fanout's answer and, after Wait, its result. Its
// methods may be called from any goroutine once Wait has returned, not
// before.
type Part[T any] struct {
	value T
	err   error
}

// Value returns the part's result and true if it succeeded, or the zero T
// and false. Call it after Fanout.Wait.
func (p *Part[T]) Value() (T, bool) { return p.value, p.err == nil }

// Err returns the part's error, or nil. Call it after Fanout.Wait.
func (p *Part[T]) Err() error { return p.err }

// Required starts fn as a part the request cannot do without: its failure
// cancels the other parts and becomes Wait's error. A timeout above zero
// bounds the part (within the request's deadline); zero, or a negative value,
// which means no limit, leaves the request's deadline only.
func Required[T any](g *Fanout, name string, timeout time.Duration, fn func(context.Context) (T, error)) *Part[T] {
	return start(g, name, timeout, true, fn)
}

// Optional starts fn as a part the request can do without: if it fails or
// times out, the request goes on and Missing names it. A timeout above
// zero bounds the part (within the request's deadline), so that a slow
// optional dependency costs at most that much; zero, or a negative value,
// which means no limit, leaves the request's deadline only.
func Optional[T any](g *Fanout, name string, timeout time.Duration, fn func(context.Context) (T, error)) *Part[T] {
	return start(g, name, timeout, false, fn)
}

func start[T any](g *Fanout, name string, timeout time.Duration, required bool, fn func(context.Context) (T, error)) *Part[T] {
	p := new(Part[T])
	g.wg.Go(func() {
		ctx, cancel := g.ctx, context.CancelFunc(func() {})
		if timeout > 0 {
			ctx, cancel = context.WithTimeout(ctx, timeout)
		}
		defer cancel()
		defer func() {
			if v := recover(); v != nil {
				pe := &PanicError{Part: name, Value: v, Stack: debug.Stack()}
				p.err = pe
				g.fail(pe, pe)
			}
		}()
		p.value, p.err = fn(ctx)
		if p.err == nil {
			return
		}
		var zero T
		p.value = zero // a failed part has no value, whatever fn returned
		if required {
			g.fail(&PartError{Part: name, Err: p.err}, nil)
			return
		}
		g.mu.Lock()
		g.missing = append(g.missing, name)
		g.mu.Unlock()
	})
	return p
}

func (g *Fanout) fail(err error, panicked *PanicError) {
	g.mu.Lock()
	if g.err == nil {
		g.err = err
	}
	if panicked != nil && g.panicked == nil {
		g.panicked = panicked
	}
	g.mu.Unlock()
	g.cancel(err)
}

// Context returns the context the parts run under: the request's, cancelled
// when a required part fails or Wait returns. Use it for work done beside
// the parts.
func (g *Fanout) Context() context.Context { return g.ctx }

// Wait waits for every part to return and reports the first required
// failure (a *PartError), or nil. If a part panicked, the others are
// cancelled at once and Wait, once they have stopped, panics with a
// *PanicError that carries the part's panic value and its stack.
func (g *Fanout) Wait() error {
	g.wg.Wait()
	g.cancel(context.Canceled)
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.panicked != nil {
		panic(g.panicked)
	}
	return g.err
}

// Missing returns the names of the optional parts that failed or timed
// out, in the order they failed, so the result lacks them: the answer is
// partial when it is not empty. Call it after Wait.
func (g *Fanout) Missing() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.missing...)
}
