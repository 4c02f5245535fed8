package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/ratelimit"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/shed"
)

// ErrUnknown is the sentinel of a lookup by a name the file does not hold.
var ErrUnknown = errors.New("config: no such name in the policy file")

// Options are what a Registry needs besides the file. The zero value is
// valid. A plain value; what it points to must be safe for concurrent use.
type Options struct {
	// Observer receives the events of every value the Registry builds:
	// calls, retries, breaker transitions, shedding; and one
	// event.ConfigReload per reload attempt (Reload, ReloadBytes, a
	// SIGHUP, Watch), OutcomeOK or OutcomeError, which the metrics
	// adapters count as guardrail_config_reloads_total{outcome}. Nil
	// costs nothing.
	Observer event.Observer
	// Logger receives one line per reload, applied or rejected, and per
	// admin action. Nil means slog.Default().
	Logger *slog.Logger
	// OnReload, if set, is called after every reload attempt with its
	// outcome, for a metric or an alert; it runs on the reloading
	// goroutine.
	OnReload func(ReloadResult)
}

// ReloadResult is the outcome of one reload. A plain value.
type ReloadResult struct {
	// File is the file read.
	File string
	// Err is nil when the new settings were applied; otherwise they were
	// rejected and the old ones stay. An invalid file's error is an *Error.
	Err error
	// Changed names the dependencies and servers whose settings changed.
	Changed []string
	// Warnings of the new file.
	Warnings []Diagnostic
}

// ReloadStats counts reloads, for the admin endpoint and metrics. A plain
// value.
type ReloadStats struct {
	Applied   uint64    `json:"applied"`
	Rejected  uint64    `json:"rejected"`
	LastError string    `json:"last_error,omitempty"`
	LastAt    time.Time `json:"last_at,omitzero"`
}

// Registry holds the guardrail values a policy file configures, by name.
// Each value it hands out is a handle whose settings a reload swaps
// atomically: calls started before the swap finish under the old
// settings, calls started after it run under the new. Breakers, budgets,
// bulkheads, throttlers and shedders whose settings did not change are
// kept across a reload, state included. One dependency has one throttler,
// shared by every client and policy handle of it.
//
// A Registry is safe for concurrent use.
type Registry struct {
	path string
	opts Options
	log  *slog.Logger

	mu      sync.Mutex // serialises reloads and handle creation
	checked atomic.Pointer[Checked]
	pool    map[string]any // reuse key -> breaker group, breaker, budget, bulkhead or shedder
	lastMod time.Time
	lastLen int64

	https    map[string]*httpHandle
	grpcs    map[string]*GRPC
	policies map[string]*Policy
	dls      map[string]*Deadline
	sheds    map[string]*Shedder
	idems    map[string][]*Idempotency
	limits   map[string][]*RateLimiter

	statsMu sync.Mutex // serialises updates of stats
	stats   atomic.Pointer[ReloadStats]
}

// Load reads the policy file at path and builds its values. It returns an
// *Error that Is ErrInvalidConfig, listing every error of the file with its line,
// when the file does not check.
func Load(path string, opts Options) (*Registry, error) {
	data, mod, size, err := readFile(path)
	if err != nil {
		return nil, err
	}
	r, err := New(path, data, opts)
	if err != nil {
		return nil, err
	}
	r.lastMod, r.lastLen = mod, size
	return r, nil
}

// New builds a Registry from the contents of a policy file; name names it
// in diagnostics and is the path Reload reads again.
func New(name string, data []byte, opts Options) (*Registry, error) {
	c, err := Parse(name, data)
	if err != nil {
		return nil, err
	}
	r := &Registry{path: name, opts: opts, log: opts.Logger, pool: map[string]any{},
		https: map[string]*httpHandle{}, grpcs: map[string]*GRPC{}, policies: map[string]*Policy{}, dls: map[string]*Deadline{},
		sheds: map[string]*Shedder{}, idems: map[string][]*Idempotency{},
		limits: map[string][]*RateLimiter{}}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.stats.Store(&ReloadStats{})
	if _, err := r.apply(c); err != nil {
		return nil, err
	}
	return r, nil
}

func readFile(path string) ([]byte, time.Time, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, time.Time{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, time.Time{}, 0, err
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	return data, st.ModTime(), st.Size(), err
}

// Checked returns the settings in force, as resolved from the file.
func (r *Registry) Checked() *Checked { return r.checked.Load() }

// Stats returns the reload counters.
func (r *Registry) Stats() ReloadStats { return *r.stats.Load() }

// Reload reads the file again and applies it to new calls. An invalid file
// is rejected: the old settings stay, the error is logged and returned,
// Options.Observer receives an event.ConfigReload with OutcomeError, and
// Options.OnReload hears of it.
func (r *Registry) Reload() error {
	data, mod, size, err := readFile(r.path)
	if err == nil {
		r.mu.Lock()
		r.lastMod, r.lastLen = mod, size
		r.mu.Unlock()
		err = r.ReloadBytes(data)
		return err
	}
	r.rejected(err, nil)
	return err
}

// ReloadBytes applies the contents of a policy file as Reload does.
func (r *Registry) ReloadBytes(data []byte) error {
	c, err := Parse(r.path, data)
	if err != nil {
		r.rejected(err, c)
		return err
	}
	changed, err := r.apply(c)
	if err != nil {
		r.rejected(err, c)
		return err
	}
	r.count(nil)
	r.observe(nil)
	r.log.Info("config: reloaded", "file", r.path, "changed", changed, "warnings", len(c.Warnings))
	for _, w := range c.Warnings {
		r.log.Warn("config: "+w.String(), "file", r.path)
	}
	if r.opts.OnReload != nil {
		r.opts.OnReload(ReloadResult{File: r.path, Changed: changed, Warnings: c.Warnings})
	}
	return nil
}

func (r *Registry) count(err error) {
	r.statsMu.Lock()
	defer r.statsMu.Unlock()
	st := *r.stats.Load()
	if err != nil {
		st.Rejected++
		st.LastError = err.Error()
	} else {
		st.Applied++
	}
	st.LastAt = time.Now()
	r.stats.Store(&st)
}

// observe reports one reload attempt to the Observer.
func (r *Registry) observe(err error) {
	if r.opts.Observer == nil {
		return
	}
	e := event.Event{Kind: event.ConfigReload, Outcome: event.OutcomeOK, Detail: r.path}
	if err != nil {
		e.Outcome, e.Err = event.OutcomeError, err
	}
	r.opts.Observer.Observe(context.Background(), e)
}

func (r *Registry) rejected(err error, c *Checked) {
	r.count(err)
	r.observe(err)
	r.log.Error("config: reload rejected; the settings in force stay", "file", r.path, "error", err)
	if r.opts.OnReload != nil {
		res := ReloadResult{File: r.path, Err: err}
		if c != nil {
			res.Warnings = c.Warnings
		}
		r.opts.OnReload(res)
	}
}

// reuse returns the pooled value under key, or builds one.
func reuse[T any](old, next map[string]any, key string, build func() (T, error)) (T, error) {
	if v, ok := next[key]; ok {
		return v.(T), nil
	}
	if v, ok := old[key]; ok {
		next[key] = v
		return v.(T), nil
	}
	v, err := build()
	if err == nil {
		next[key] = v
	}
	return v, err
}

// keyOfConfig renders a configuration without its callbacks, as the key
// under which the values it builds are reused.
func keyOfConfig(kind, name string, cfg any) string {
	return fmt.Sprintf("%s\x00%s\x00%+v", kind, name, cfg)
}

// values are one dependency's or server's built values.
type httpValue struct {
	t        *guardhttp.Transport
	deadline time.Duration
	cfg      guardhttp.Config
	throttle *guardrail.ThrottleConfig // cfg.Throttler's settings
	key      string
}

// apply builds the values c configures, reusing the pooled ones whose
// settings did not change, then swaps every handle to them.
func (r *Registry) apply(c *Checked) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := map[string]any{}
	obs := r.opts.Observer
	type swap func()
	var swaps []swap
	var changed []string

	for _, d := range c.Dependencies {
		d := d
		var b *budget.Budget
		if d.Budget == nil {
			b = budget.Unlimited()
		} else {
			var err error
			b, err = reuse(r.pool, next, keyOfConfig("budget", d.Name, *d.Budget), func() (*budget.Budget, error) { return budget.New(*d.Budget) })
			if err != nil {
				return nil, err
			}
		}
		var th *guardrail.Throttler
		if d.Throttle != nil {
			// One throttler per dependency, kept while its settings are:
			// its window is what it learnt of the dependency.
			var err error
			th, err = reuse(r.pool, next, keyOfConfig("throttle", d.Name, *d.Throttle), func() (*guardrail.Throttler, error) { return guardrail.NewThrottler(*d.Throttle) })
			if err != nil {
				return nil, err
			}
		}
		// breakers is the dependency's breaker group, kept while its
		// settings are; kind keeps an http and a grpc group apart.
		breakers := func(kind string) (*breaker.Group, error) {
			gc := d.Group
			return reuse(r.pool, next, keyOfConfig(kind, d.Name, gc), func() (*breaker.Group, error) {
				if obs != nil {
					name := d.Name
					gc.Config.Observer = event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
						if name != "" {
							e.Dependency = name // the dependency's name, not the key's
						}
						return obs.Observe(ctx, e)
					})
				}
				return breaker.NewGroup(gc)
			})
		}
		switch d.Kind {
		case KindHTTP:
			g, err := breakers("breakers")
			if err != nil {
				return nil, err
			}
			cfg := d.HTTP
			cfg.Budget, cfg.Breakers, cfg.Throttler, cfg.Observer = b, g, th, obs
			cfg.Hedge = cloneHedge(d.Hedge)
			plain := d.HTTP
			plain.Bulkhead, plain.Hedge = nil, nil // pointers: their settings are in the key below
			key := fmt.Sprintf("%p/%p/%p/%+v/%+v/%s/%v", b, g, th, plain, d.Bulkhead, hedgeKey(d.Hedge), d.Deadline)
			h := r.https[d.Name]
			if h != nil {
				if cur := h.cur.Load(); cur.key == key {
					continue
				}
			}
			cl, err := guardhttp.NewClient(cfg)
			if err != nil {
				return nil, err
			}
			v := &httpValue{t: cl.Transport.(*guardhttp.Transport), deadline: d.Deadline, cfg: cfg, throttle: d.Throttle, key: key}
			changed = append(changed, d.Name)
			name := d.Name
			swaps = append(swaps, func() {
				if h == nil {
					h = &httpHandle{name: name}
					r.https[name] = h
				}
				if old := h.cur.Swap(v); old != nil {
					old.t.CloseIdleConnections()
				}
			})
		case KindGRPC:
			g, err := breakers("grpc breakers")
			if err != nil {
				return nil, err
			}
			var bhs *bulkhead.Group
			if d.Bulkhead != nil {
				bhs, err = reuse(r.pool, next, keyOfConfig("grpc bulkheads", d.Name, *d.Bulkhead), func() (*bulkhead.Group, error) { return bulkhead.NewGroup(bulkhead.GroupConfig{Config: *d.Bulkhead}) })
				if err != nil {
					return nil, err
				}
			}
			plain := d.GRPC
			plain.Bulkhead, plain.Hedge, plain.Throttle = nil, nil, nil // pointers: their settings are bhs's, hedgeKey's and th's
			key := fmt.Sprintf("%p/%p/%p/%p/%+v/%s", b, g, bhs, th, plain, hedgeKey(d.Hedge))
			h := r.grpcs[d.Name]
			if h != nil && h.cur.Load().key == key {
				continue
			}
			gs := d.GRPC
			gs.IdempotentMethods = slices.Clone(gs.IdempotentMethods)
			if gs.Bulkhead != nil {
				bc := *gs.Bulkhead
				gs.Bulkhead = &bc
			}
			gs.Hedge = cloneHedge(gs.Hedge)
			if gs.Throttle != nil {
				tc := *gs.Throttle
				gs.Throttle = &tc
			}
			gs.Budget, gs.Breakers, gs.Bulkheads, gs.Throttler, gs.Observer = b, g, bhs, th, obs
			v := &grpcValue{s: &gs, key: key}
			changed = append(changed, d.Name)
			name := d.Name
			swaps = append(swaps, func() {
				if h == nil {
					h = &GRPC{name: name}
					r.grpcs[name] = h
				}
				h.cur.Store(v)
			})
		case KindPolicy:
			bc := d.Breaker
			bc.Observer = obs
			br, err := reuse(r.pool, next, keyOfConfig("breaker", d.Name, d.Breaker), func() (*breaker.Breaker, error) { return breaker.New(bc) })
			if err != nil {
				return nil, err
			}
			var bh *bulkhead.Bulkhead
			if d.Bulkhead != nil {
				bh, err = reuse(r.pool, next, keyOfConfig("bulkhead", d.Name, *d.Bulkhead), func() (*bulkhead.Bulkhead, error) { return bulkhead.New(*d.Bulkhead) })
				if err != nil {
					return nil, err
				}
			}
			pf := d.Policy
			key := fmt.Sprintf("%p/%p/%p/%p/%+v/%s/%v", b, br, bh, th, pf, hedgeKey(d.Hedge), d.Deadline)
			h := r.policies[d.Name]
			if h != nil && h.cur.Load().key == key {
				continue
			}
			p := &guardrail.Policy{Name: pf.Name, MaxAttempts: pf.MaxAttempts, AttemptTimeout: pf.AttemptTimeout,
				MinAttemptTime: pf.MinAttemptTime, Backoff: pf.Backoff, MaxRetryAfter: pf.MaxRetryAfter,
				Idempotent: pf.Idempotent, Budget: b, Breaker: br, Bulkhead: bh, Observer: obs,
				Hedge: cloneHedge(d.Hedge), Throttler: th}
			v := &policyValue{p: p, deadline: d.Deadline, throttle: d.Throttle, key: key}
			changed = append(changed, d.Name)
			name := d.Name
			swaps = append(swaps, func() {
				if h == nil {
					h = &Policy{name: name}
					r.policies[name] = h
				}
				h.cur.Store(v)
			})
		}
	}
	for _, s := range c.Servers {
		s := s
		if s.Deadline != nil {
			dc := *s.Deadline
			key := fmt.Sprintf("%+v", dc)
			h := r.dls[s.Name]
			if h == nil || h.key.Load() == nil || *h.key.Load() != key {
				srv, err := deadline.New(dc)
				if err != nil {
					return nil, err
				}
				changed = append(changed, "servers."+s.Name+".deadline")
				name := s.Name
				swaps = append(swaps, func() {
					if h == nil {
						h = &Deadline{}
						r.dls[name] = h
					}
					h.cur.Store(srv)
					h.key.Store(&key)
				})
			}
		}
		if s.Shed != nil {
			sc := *s.Shed
			sc.Observer = obs
			key := keyOfConfig("shed", s.Name, *s.Shed)
			sh, err := reuse(r.pool, next, key, func() (*shed.Shedder, error) { return shed.New(sc) })
			if err != nil {
				return nil, err
			}
			h := r.sheds[s.Name]
			if h == nil || h.cur.Load() != sh {
				changed = append(changed, "servers."+s.Name+".shed")
				name := s.Name
				swaps = append(swaps, func() {
					if h == nil {
						h = &Shedder{}
						r.sheds[name] = h
					}
					h.cur.Store(sh)
				})
			}
		}
		// Idempotency servers are rebuilt for every handle handed out, with
		// the store and scope it was given.
		if s.Idempotency != nil {
			for _, h := range r.idems[s.Name] {
				srv, err := h.build(*s.Idempotency, s.IdempotencyScopeCaller)
				if err != nil {
					return nil, err
				}
				swaps = append(swaps, func() { h.cur.Store(srv) })
			}
		}
		// Rate limiters are rebuilt, their buckets emptied, only when their
		// settings change; a limiter whose section is gone keeps its last
		// settings, as the handle's code still runs.
		if s.RateLimit != nil {
			key := keyOfConfig("rate_limit", s.Name, *s.RateLimit)
			for _, h := range r.limits[s.Name] {
				if h.key == key {
					continue
				}
				l, err := h.build(*s.RateLimit)
				if err != nil {
					return nil, err
				}
				changed = append(changed, "servers."+s.Name+".rate_limit")
				swaps = append(swaps, func() { h.cur.Store(l); h.key = key })
			}
		}
	}
	for _, sw := range swaps {
		sw()
	}
	r.pool = next
	r.checked.Store(c)
	sort.Strings(changed)
	return changed, nil
}

// hedgeKey renders a hedge configuration for a reuse key: its value, not
// its address, which is new on every parse.
func hedgeKey(h *guardrail.HedgeConfig) string {
	if h == nil {
		return "no hedge"
	}
	return fmt.Sprintf("%+v", *h)
}

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
	throttle *guardrail.ThrottleConfig // p.Throttler's settings
	key      string
}

// Policy is a policy dependency's handle: Current returns the
// guardrail.Policy in force, which a reload replaces. It is safe for
// concurrent use.
type Policy struct {
	name string
	cur  atomic.Pointer[policyValue]
}

// Current returns the policy in force now. Pass it to guardrail.Do for
// one call; take it again for the next, to follow reloads. Its deadline is
// not in it: use Do, or Deadline, to bound a call as the file says.
func (p *Policy) Current() *guardrail.Policy { return p.cur.Load().p }

// Deadline returns the dependency's deadline for a whole call, zero when
// none.
func (p *Policy) Deadline() time.Duration { return p.cur.Load().deadline }

// Do runs op under the policy in force when it starts, bounded by the
// dependency's deadline when the file sets one. It never hedges, whatever
// the file says: DoHedged does, for operations written to be.
func Do[T any](ctx context.Context, p *Policy, op func(context.Context) (T, error)) (T, error) {
	v := p.cur.Load()
	if v.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, v.deadline)
		defer cancel()
	}
	return guardrail.Do(ctx, v.p, op)
}

// DoHedged is Do for an operation written to be hedged: when the file
// gives the dependency a hedge section, an idempotent call that has not
// answered after the hedge delay gets another attempt alongside it, as
// guardrail.DoHedged does, so op must be safe to call concurrently with
// itself and must honour its context. Do never hedges, as guardrail.Do
// does not: a hedge section alone cannot make code run its operation twice
// at once. c refines the call as guardrail.Call does (Discard releases a
// losing attempt's value).
func DoHedged[T any](ctx context.Context, p *Policy, c guardrail.Call, op func(context.Context) (T, error)) (T, error) {
	v := p.cur.Load()
	if v.deadline > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, v.deadline)
		defer cancel()
	}
	return guardrail.DoHedged(ctx, v.p, c, op)
}

// Policy returns the handle of the policy dependency name.
func (r *Registry) Policy(name string) (*Policy, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.policies[name]
	if !ok {
		return nil, r.unknown("policy dependency", name)
	}
	return h, nil
}

// Deadline is a server's deadline.Server handle. It is safe for concurrent
// use.
type Deadline struct {
	cur atomic.Pointer[deadline.Server]
	key atomic.Pointer[string]
}

// Current returns the deadline.Server in force.
func (d *Deadline) Current() *deadline.Server { return d.cur.Load() }

// Middleware is deadline.Server.Middleware under the settings in force.
func (d *Deadline) Middleware(next http.Handler) http.Handler {
	return follow(&d.cur, (*deadline.Server).Middleware, next)
}

// Deadline returns the deadline handle of server name.
func (r *Registry) Deadline(name string) (*Deadline, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.dls[name]
	if !ok {
		return nil, r.unknown("server with a deadline section", name)
	}
	return h, nil
}

// Shedder is a server's shed.Shedder handle. It is safe for concurrent use.
type Shedder struct {
	cur atomic.Pointer[shed.Shedder]
}

// Current returns the shed.Shedder in force, for Acquire and Stats.
func (s *Shedder) Current() *shed.Shedder { return s.cur.Load() }

// Middleware is shed.Shedder.Middleware under the shedder in force.
func (s *Shedder) Middleware(next http.Handler) http.Handler {
	return follow(&s.cur, (*shed.Shedder).Middleware, next)
}

// Shedder returns the shedder handle of server name.
func (r *Registry) Shedder(name string) (*Shedder, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.sheds[name]
	if !ok {
		return nil, r.unknown("server with a shed section", name)
	}
	return h, nil
}

// Idempotency is a server's idempotency.Server handle, built with the
// store and scope given to Registry.Idempotency. It is safe for concurrent
// use.
type Idempotency struct {
	store idempotency.Store
	scope func(*http.Request) (string, error)
	log   *slog.Logger
	obs   event.Observer
	cur   atomic.Pointer[idempotency.Server]
}

func (h *Idempotency) build(cfg idempotency.Config, caller bool) (*idempotency.Server, error) {
	if caller {
		if h.scope == nil {
			return nil, errors.New("config: the idempotency scope is caller, and no Scope function was given")
		}
		cfg.Scope = h.scope
	} else if h.scope != nil {
		return nil, errors.New("config: the idempotency scope is single_tenant, and a Scope function was given; pass nil")
	}
	cfg.Logger, cfg.Observer = h.log, h.obs
	return idempotency.New(h.store, cfg)
}

// Current returns the idempotency.Server in force.
func (h *Idempotency) Current() *idempotency.Server { return h.cur.Load() }

// Middleware is idempotency.Server.Middleware under the settings in force.
func (h *Idempotency) Middleware(next http.Handler) http.Handler {
	return follow(&h.cur, (*idempotency.Server).Middleware, next)
}

// Idempotency builds the idempotency middleware of server name on store.
// scope is the Scope function when the file's scope is caller, and must be
// nil when it is single_tenant. A reload rebuilds it with the same store
// and scope.
func (r *Registry) Idempotency(name string, store idempotency.Store, scope func(*http.Request) (string, error)) (*Idempotency, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rs *ResolvedServer
	for _, s := range r.checked.Load().Servers {
		if s.Name == name && s.Idempotency != nil {
			rs = s
		}
	}
	if rs == nil {
		return nil, r.unknown("server with an idempotency section", name)
	}
	h := &Idempotency{store: store, scope: scope, log: r.opts.Logger, obs: r.opts.Observer}
	srv, err := h.build(*rs.Idempotency, rs.IdempotencyScopeCaller)
	if err != nil {
		return nil, err
	}
	h.cur.Store(srv)
	r.idems[name] = append(r.idems[name], h)
	return h, nil
}

// RateLimiter is a server's ratelimit.Limiter handle, built with the key
// function given to Registry.RateLimiter. It is safe for concurrent use.
type RateLimiter struct {
	keyFn func(*http.Request) (string, error)
	obs   event.Observer
	key   string // settings of cur; written under the Registry's mu
	cur   atomic.Pointer[ratelimit.Limiter]
}

func (h *RateLimiter) build(cfg ratelimit.Config) (*ratelimit.Limiter, error) {
	cfg.Key, cfg.Observer = h.keyFn, h.obs
	return ratelimit.New(cfg)
}

// Current returns the ratelimit.Limiter in force, for Allow and Len.
func (h *RateLimiter) Current() *ratelimit.Limiter { return h.cur.Load() }

// Middleware is ratelimit.Limiter.Middleware under the settings in force.
func (h *RateLimiter) Middleware(next http.Handler) http.Handler {
	return follow(&h.cur, (*ratelimit.Limiter).Middleware, next)
}

// RateLimiter builds the per-client rate limiter of server name. key says
// which client a request is charged to, as ratelimit.Config.Key: it cannot
// come from a file. Nil means the peer's address (ratelimit.RemoteAddr),
// which behind a proxy is the proxy's. A reload that changes the server's
// rate_limit section rebuilds the limiter with the same key function, and
// every client starts again with a full bucket; one that does not change
// it keeps the buckets.
func (r *Registry) RateLimiter(name string, key func(*http.Request) (string, error)) (*RateLimiter, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var rs *ResolvedServer
	for _, s := range r.checked.Load().Servers {
		if s.Name == name && s.RateLimit != nil {
			rs = s
		}
	}
	if rs == nil {
		return nil, r.unknown("server with a rate_limit section", name)
	}
	h := &RateLimiter{keyFn: key, obs: r.opts.Observer, key: keyOfConfig("rate_limit", name, *rs.RateLimit)}
	l, err := h.build(*rs.RateLimit)
	if err != nil {
		return nil, err
	}
	h.cur.Store(l)
	r.limits[name] = append(r.limits[name], h)
	return h, nil
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

// WatchSignal reloads the file on every SIGHUP until ctx is done. It is
// opt-in: call it from main. It returns at once; the watching goroutine
// ends with ctx.
func (r *Registry) WatchSignal(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				_ = r.Reload() // logged and counted by Reload
			}
		}
	}()
}

// Watch polls the file's modification time and size every interval and
// reloads it when either changes, until ctx is done. It returns at once;
// the watching goroutine ends with ctx. A zero interval means 2 s.
func (r *Registry) Watch(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = 2 * time.Second
	}
	go func() {
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				r.poll()
			}
		}
	}()
}

// poll reloads the file if it changed since it was last read.
func (r *Registry) poll() {
	st, err := os.Stat(r.path)
	if err != nil {
		return
	}
	r.mu.Lock()
	same := st.ModTime().Equal(r.lastMod) && st.Size() == r.lastLen
	r.mu.Unlock()
	if !same {
		_ = r.Reload()
	}
}
