package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/ratelimit"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/shed"
	"github.com/guardrail-go/guardrail/throttle"
)

// httpHandle is an HTTP dependency's RoundTripper: it sends each request
// through the Transport of the settings in force when the request starts.
type httpHandle struct {
	name string
	cur  atomic.Pointer[httpValue]
}

// RoundTrip sends req under the current settings; a dependency deadline
// bounds the whole request, its body included.
func (h *httpHandle) RoundTrip(req *http.Request) (*http.Response, error) {
	v := h.cur.Load()
	if v.deadline <= 0 {
		return v.t.RoundTrip(req)
	}
	ctx, cancel := context.WithTimeout(req.Context(), v.deadline)
	resp, err := v.t.RoundTrip(req.WithContext(ctx))
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the current Transport.
func (h *httpHandle) CloseIdleConnections() { h.cur.Load().t.CloseIdleConnections() }

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// HTTPClient returns the *http.Client of the HTTP dependency name. The
// same client is returned on every call, and a reload changes the settings
// its next requests run under. It has no Timeout of its own: the
// dependency's deadline, the request's context and the phase timeouts
// bound a request.
func (r *Registry) HTTPClient(name string) (*http.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.https[name]
	if !ok {
		return nil, r.unknown("HTTP dependency", name)
	}
	return &http.Client{Transport: h}, nil
}

// HTTPConfig returns the guardhttp.Config the HTTP dependency name's
// current Transport was built with (its Budget, Breakers and Throttler
// are the Registry's; its Hedge is a copy), and the deadline bounding
// each of its requests.
func (r *Registry) HTTPConfig(name string) (guardhttp.Config, time.Duration, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.https[name]
	if !ok {
		return guardhttp.Config{}, 0, r.unknown("HTTP dependency", name)
	}
	v := h.cur.Load()
	cfg := v.cfg
	cfg.Hedge = cloneHedge(cfg.Hedge)
	return cfg, v.deadline, nil
}

func (r *Registry) unknown(what, name string) error {
	return fmt.Errorf("%w: %s %q", ErrUnknown, what, name)
}

// policyValue is a policy dependency's settings in force.
type policyValue struct {
	p        *guardrail.Policy
	deadline time.Duration
	throttle *throttle.Config // p.Throttler's settings
	origin   origin
}

// PolicyHandle is a policy dependency's handle: Policy returns the
// guardrail.Policy in force, which a reload replaces, and WithDeadline
// bounds a call by the dependency's deadline. A call is the core's:
//
//	ctx, cancel := h.WithDeadline(ctx)
//	defer cancel()
//	v, err := guardrail.Do(ctx, h.Policy(), op)
//
// guardrail.Do never hedges; guardrail.DoHedged hedges when the file gives
// the dependency a hedge section, for an operation written to be hedged
// (safe to run concurrently with itself, honouring its context): a hedge
// section alone cannot make code run its operation twice at once.
//
// A PolicyHandle is safe for concurrent use.
type PolicyHandle struct {
	cur atomic.Pointer[policyValue]
}

// Policy returns the policy in force now. Pass it to guardrail.Do for one
// call; take it again for the next, to follow reloads. The dependency's
// deadline is not in it: WithDeadline applies it.
func (h *PolicyHandle) Policy() *guardrail.Policy { return h.cur.Load().p }

// WithDeadline returns ctx bounded by the dependency's deadline for a
// whole call, every attempt and backoff included, when the file sets one,
// and the function that releases it; ctx itself, and a no-op, when the
// file sets none.
func (h *PolicyHandle) WithDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if d := h.cur.Load().deadline; d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return ctx, func() {}
}

// Policy returns the handle of the policy dependency name.
func (r *Registry) Policy(name string) (*PolicyHandle, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.policies[name]
	if !ok {
		return nil, r.unknown("policy dependency", name)
	}
	return h, nil
}

// Handle is a server guardrail's handle: Current returns the value in
// force, a *deadline.Server, *shed.Shedder, *idempotency.Server or
// *ratelimit.Limiter, which a reload replaces, and Middleware runs a
// handler through the middleware of the value in force at each request.
// The Registry makes every Handle (a zero one holds no value). It is safe
// for concurrent use.
type Handle[T any] struct {
	cur atomic.Pointer[T]
	mw  func(*T, http.Handler) http.Handler
}

func newHandle[T any](mw func(*T, http.Handler) http.Handler) *Handle[T] {
	return &Handle[T]{mw: mw}
}

// Current returns the value in force: for a shedder, for Acquire and
// Stats; for a rate limiter, for Allow and Len.
func (h *Handle[T]) Current() *T { return h.cur.Load() }

// Middleware returns next behind the value's middleware (as
// deadline.Server.Middleware, shed.Shedder.Middleware and the others
// return it) under the value in force when each request starts.
func (h *Handle[T]) Middleware(next http.Handler) http.Handler {
	return follow(&h.cur, h.mw, next)
}

// Deadline returns the deadline handle of server name.
func (r *Registry) Deadline(name string) (*Handle[deadline.Server], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.dls[name]
	if !ok {
		return nil, r.unknown("server with a deadline section", name)
	}
	return e.h, nil
}

// Shedder returns the shedder handle of server name.
func (r *Registry) Shedder(name string) (*Handle[shed.Shedder], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.sheds[name]
	if !ok {
		return nil, r.unknown("server with a shed section", name)
	}
	return h, nil
}

// deadlineEntry is a deadline handle and the settings of its value.
type deadlineEntry struct {
	h   *Handle[deadline.Server]
	cfg deadline.Config // written under the Registry's mu
}

// idempotencyEntry is an idempotency handle and the store and scope it
// was given, with which a reload rebuilds its value.
type idempotencyEntry struct {
	h     *Handle[idempotency.Server]
	store idempotency.Store
	scope func(*http.Request) (string, error)
	log   *slog.Logger
	obs   event.Observer
}

func (e *idempotencyEntry) build(cfg idempotency.Config, caller bool) (*idempotency.Server, error) {
	if caller {
		if e.scope == nil {
			return nil, errors.New("config: the idempotency scope is caller, and no Scope function was given")
		}
		cfg.Scope = e.scope
	} else if e.scope != nil {
		return nil, errors.New("config: the idempotency scope is single_tenant, and a Scope function was given; pass nil")
	}
	cfg.Logger, cfg.Observer = e.log, e.obs
	return idempotency.New(e.store, cfg)
}

// Idempotency builds the idempotency middleware of server name on store.
// scope is the Scope function when the file's scope is caller, and must be
// nil when it is single_tenant. A reload rebuilds it with the same store
// and scope.
func (r *Registry) Idempotency(name string, store idempotency.Store, scope func(*http.Request) (string, error)) (*Handle[idempotency.Server], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rs *resolvedServer
	for _, s := range r.checked.Load().Servers {
		if s.Name == name && s.Idempotency != nil {
			rs = s
		}
	}
	if rs == nil {
		return nil, r.unknown("server with an idempotency section", name)
	}
	e := &idempotencyEntry{h: newHandle((*idempotency.Server).Middleware), store: store, scope: scope, log: r.opts.Logger, obs: r.opts.Observer}
	srv, err := e.build(*rs.Idempotency, rs.IdempotencyScopeCaller)
	if err != nil {
		return nil, err
	}
	e.h.cur.Store(srv)
	r.idems[name] = append(r.idems[name], e)
	return e.h, nil
}

// rateLimitEntry is a rate limiter handle, the key function it was given,
// with which a reload rebuilds its value, and the settings of its value.
type rateLimitEntry struct {
	h      *Handle[ratelimit.Limiter]
	keyFn  func(*http.Request) (string, error)
	obs    event.Observer
	store  fleet.TokenStore
	cfg    ratelimit.Config     // settings of h's value, without Key; written under the Registry's mu
	shared *fleet.LimiterConfig // its fleet limiter's, without Store; nil: none
	fleet  *fleet.Limiter       // h's value's fleet limiter; nil: none
}

// sharedGrace is how long a fleet limiter replaced by a reload stays open
// for the requests that still hold the old handle's value; then it is
// closed, which returns its unspent tokens to the store.
const sharedGrace = 5 * time.Second

// build returns the limiter for cfg and, when shared is set, the fleet
// limiter it charges.
func (e *rateLimitEntry) build(cfg ratelimit.Config, shared *fleet.LimiterConfig) (*ratelimit.Limiter, *fleet.Limiter, error) {
	cfg.Key, cfg.Observer = e.keyFn, e.obs
	if shared == nil {
		l, err := ratelimit.New(cfg)
		return l, nil, err
	}
	if e.store == nil {
		return nil, nil, fmt.Errorf("config: servers.%s.rate_limit.shared needs Options.TokenStore, the store the fleet shares", cfg.Name)
	}
	lc := *shared
	lc.Store = e.store
	fl, err := fleet.NewLimiter(lc)
	if err != nil {
		return nil, nil, err
	}
	cfg.Rate, cfg.Burst, cfg.MaxKeys, cfg.Shared = 0, 0, 0, fl
	l, err := ratelimit.New(cfg)
	if err != nil {
		_ = fl.Close()
		return nil, nil, err
	}
	return l, fl, nil
}

// retire closes fl, a fleet limiter a reload replaced, after sharedGrace.
func retire(fl *fleet.Limiter) {
	if fl != nil {
		time.AfterFunc(sharedGrace, func() { _ = fl.Close() })
	}
}

// Close closes the fleet limiters of the rate limiters with a shared
// section, which returns their unspent tokens to the store and stops
// their goroutines; their handles then refuse every request (503). Call it
// when the process stops serving. A Registry without such a section has
// nothing to close. It returns the first error a limiter's Close
// returned.
func (r *Registry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var first error
	for _, es := range r.limits {
		for _, e := range es {
			if e.fleet == nil {
				continue
			}
			if err := e.fleet.Close(); err != nil && first == nil {
				first = err
			}
		}
	}
	return first
}

// RateLimiter builds the per-client rate limiter of server name. key says
// which client a request is charged to, as ratelimit.Config.Key: it cannot
// come from a file. Nil means the host of the peer's address (RemoteAddr),
// which behind a proxy is the proxy's. A reload that changes the server's
// rate_limit section rebuilds the limiter with the same key function, and
// every client starts again with a full bucket; one that does not change
// it keeps the buckets.
func (r *Registry) RateLimiter(name string, key func(*http.Request) (string, error)) (*Handle[ratelimit.Limiter], error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rs *resolvedServer
	for _, s := range r.checked.Load().Servers {
		if s.Name == name && s.RateLimit != nil {
			rs = s
		}
	}
	if rs == nil {
		return nil, r.unknown("server with a rate_limit section", name)
	}
	e := &rateLimitEntry{h: newHandle((*ratelimit.Limiter).Middleware), keyFn: key, obs: r.opts.Observer,
		store: r.opts.TokenStore, cfg: *rs.RateLimit, shared: rs.RateLimitShared}
	l, fl, err := e.build(e.cfg, e.shared)
	if err != nil {
		return nil, err
	}
	e.h.cur.Store(l)
	e.fleet = fl
	r.limits[name] = append(r.limits[name], e)
	return e.h, nil
}

// follow returns a handler that runs next through the middleware of the
// value in force, building that middleware once per value.
func follow[T any](cur *atomic.Pointer[T], mw func(*T, http.Handler) http.Handler, next http.Handler) http.Handler {
	type built struct {
		src *T
		h   http.Handler
	}
	var cache atomic.Pointer[built]
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		s := cur.Load()
		b := cache.Load()
		if b == nil || b.src != s {
			b = &built{s, mw(s, next)}
			cache.Store(b)
		}
		b.h.ServeHTTP(w, req)
	})
}
