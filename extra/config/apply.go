package config

import (
	"context"
	"reflect"
	"slices"
	"sort"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/shed"
	"github.com/guardrail-go/guardrail/throttle"
)

// How a reload tells what changed. Settings are compared by value, with
// reflect.DeepEqual, rather than rendered to text or compared with ==:
// they hold slices (idempotent methods, stored headers, shares) and
// pointers to optional sections (bulkhead, hedge, throttle) whose
// contents, not their addresses (new at every parse), say whether they
// changed, and == does not compile on them. They are plain values: the
// functions and observers of a configuration are set on copies, never on
// what is compared, and DeepEqual never looks into a live object (a
// budget, a breaker and its window...). Live objects are compared by
// identity instead: the pool hands out the same one for as long as its
// own settings do not change.

// poolKey names a value the Registry keeps across reloads: its kind
// ("budget", "breakers", "shed", ...) and its dependency's or server's name.
type poolKey struct{ kind, name string }

// pooled is a kept value and the configuration it was built from.
type pooled struct {
	cfg any
	v   any
}

// reuse returns the value of kind and name built from cfg, a plain
// configuration: the one the last reload kept when its configuration is
// deeply equal to cfg, else a new one.
func reuse[T any](a *applying, kind, name string, cfg any, build func() (T, error)) (T, error) {
	k := poolKey{kind, name}
	if p, ok := a.next[k]; ok && reflect.DeepEqual(p.cfg, cfg) {
		return p.v.(T), nil
	}
	if p, ok := a.r.pool[k]; ok && reflect.DeepEqual(p.cfg, cfg) {
		a.next[k] = p
		return p.v.(T), nil
	}
	v, err := build()
	if err == nil {
		a.next[k] = pooled{cfg: cfg, v: v}
	}
	return v, err
}

// live are the values a dependency's handle shares with the pool,
// compared by identity.
type live struct {
	budget    *budget.Budget
	throttler *throttle.Throttler
	breakers  *breaker.Group
	bulkheads *bulkhead.Group
	breaker   *breaker.Breaker
	bulkhead  *bulkhead.Bulkhead
}

// origin is what the value of a dependency's handle was built from: plain
// settings and the live values of the pool.
type origin struct {
	settings any
	live     live
}

// same reports whether o and p build the same value.
func (o origin) same(p origin) bool {
	return o.live == p.live && reflect.DeepEqual(o.settings, p.settings)
}

// applying is one reload under way: the values kept so far, the swaps of
// the handles to their new values, made once every value has built, and
// the names of what changed.
type applying struct {
	r       *Registry
	obs     event.Observer
	next    map[poolKey]pooled
	swaps   []func()
	aborts  []func() // what undoes a build when the reload is rejected
	changed []string
}

// apply builds the values c configures, reusing the pooled ones whose
// settings did not change, then swaps every handle to them. Nothing is
// swapped unless everything built.
func (r *Registry) apply(c *checkedFile) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a := &applying{r: r, obs: r.opts.Observer, next: map[poolKey]pooled{}}
	for _, d := range c.Dependencies {
		if err := a.dependency(d); err != nil {
			a.abort()
			return nil, err
		}
	}
	for _, s := range c.Servers {
		if err := a.server(s); err != nil {
			a.abort()
			return nil, err
		}
	}
	for _, sw := range a.swaps {
		sw()
	}
	r.pool = a.next
	r.checked.Store(c)
	sort.Strings(a.changed)
	return a.changed, nil
}

// dependency builds the value of d's handle, unless it is unchanged.
func (a *applying) dependency(d *resolvedDep) error {
	var l live
	var err error
	l.budget, err = reuse(a, "budget", d.Name, d.Budget, func() (*budget.Budget, error) {
		if d.Budget == nil {
			return budget.Unlimited(), nil
		}
		return budget.New(*d.Budget)
	})
	if err != nil {
		return err
	}
	if d.Throttle != nil {
		// One throttler per dependency, kept while its settings are:
		// its window is what it learnt of the dependency.
		l.throttler, err = reuse(a, "throttle", d.Name, *d.Throttle, func() (*throttle.Throttler, error) { return throttle.New(*d.Throttle) })
		if err != nil {
			return err
		}
	}
	switch d.Kind {
	case kindHTTP:
		return a.http(d, l)
	case kindGRPC:
		return a.grpc(d, l)
	}
	return a.policy(d, l)
}

// breakers returns d's breaker group, kept while its settings are; kind
// keeps an HTTP and a gRPC group apart.
func (a *applying) breakers(kind string, d *resolvedDep) (*breaker.Group, error) {
	return reuse(a, kind, d.Name, d.Group, func() (*breaker.Group, error) {
		gc := d.Group
		if obs := a.obs; obs != nil {
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

// httpSettings are what an HTTP dependency's Transport is built from,
// besides its live values.
type httpSettings struct {
	cfg      guardhttp.Config // without Budget, Breakers, Throttler and Observer
	deadline time.Duration
}

// httpValue is an HTTP dependency's Transport in force, and what it was
// built from.
type httpValue struct {
	t        *guardhttp.Transport
	deadline time.Duration
	cfg      guardhttp.Config
	throttle *throttle.Config // cfg.Throttler's settings
	origin   origin
}

func (a *applying) http(d *resolvedDep, l live) error {
	var err error
	if l.breakers, err = a.breakers("breakers", d); err != nil {
		return err
	}
	o := origin{settings: httpSettings{cfg: d.HTTP, deadline: d.Deadline}, live: l}
	h := a.r.https[d.Name]
	if h != nil && h.cur.Load().origin.same(o) {
		return nil
	}
	cfg := d.HTTP
	cfg.Budget, cfg.Breakers, cfg.Throttler, cfg.Observer = l.budget, l.breakers, l.throttler, a.obs
	cfg.Hedge = cloneHedge(d.Hedge)
	cl, err := guardhttp.NewClient(cfg)
	if err != nil {
		return err
	}
	v := &httpValue{t: cl.Transport.(*guardhttp.Transport), deadline: d.Deadline, cfg: cfg, throttle: d.Throttle, origin: o}
	a.changed = append(a.changed, d.Name)
	name := d.Name
	a.swaps = append(a.swaps, func() {
		if h == nil {
			h = &httpHandle{name: name}
			a.r.https[name] = h
		}
		if old := h.cur.Swap(v); old != nil {
			old.t.CloseIdleConnections()
		}
	})
	return nil
}

func (a *applying) grpc(d *resolvedDep, l live) error {
	var err error
	if l.breakers, err = a.breakers("grpc breakers", d); err != nil {
		return err
	}
	if d.Bulkhead != nil {
		l.bulkheads, err = reuse(a, "grpc bulkheads", d.Name, *d.Bulkhead, func() (*bulkhead.Group, error) {
			return bulkhead.NewGroup(bulkhead.GroupConfig{Config: *d.Bulkhead})
		})
		if err != nil {
			return err
		}
	}
	o := origin{settings: d.GRPC, live: l}
	h := a.r.grpcs[d.Name]
	if h != nil && h.cur.Load().origin.same(o) {
		return nil
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
	gs.Budget, gs.Breakers, gs.Bulkheads, gs.Throttler, gs.Observer = l.budget, l.breakers, l.bulkheads, l.throttler, a.obs
	v := &grpcValue{s: &gs, origin: o}
	a.changed = append(a.changed, d.Name)
	name := d.Name
	a.swaps = append(a.swaps, func() {
		if h == nil {
			h = &GRPCHandle{}
			a.r.grpcs[name] = h
		}
		h.cur.Store(v)
	})
	return nil
}

// policySettings are what a policy dependency's guardrail.Policy is built
// from, besides its live values.
type policySettings struct {
	retry      guardrail.Retry // without Budget
	idempotent bool
	hedge      *guardrail.HedgeConfig
	deadline   time.Duration
}

func (a *applying) policy(d *resolvedDep, l live) error {
	bc := d.Breaker
	bc.Observer = a.obs
	var err error
	l.breaker, err = reuse(a, "breaker", d.Name, d.Breaker, func() (*breaker.Breaker, error) { return breaker.New(bc) })
	if err != nil {
		return err
	}
	if d.Bulkhead != nil {
		l.bulkhead, err = reuse(a, "bulkhead", d.Name, *d.Bulkhead, func() (*bulkhead.Bulkhead, error) { return bulkhead.New(*d.Bulkhead) })
		if err != nil {
			return err
		}
	}
	o := origin{settings: policySettings{retry: d.Retry, idempotent: d.Idempotent, hedge: d.Hedge, deadline: d.Deadline}, live: l}
	h := a.r.policies[d.Name]
	if h != nil && h.cur.Load().origin.same(o) {
		return nil
	}
	rt := d.Retry
	rt.Budget = l.budget
	p := &guardrail.Policy{Name: d.Name, Retry: rt, Idempotent: d.Idempotent, Breaker: l.breaker, Bulkhead: l.bulkhead,
		Observer: a.obs, Hedge: cloneHedge(d.Hedge), Throttler: l.throttler}
	v := &policyValue{p: p, deadline: d.Deadline, throttle: d.Throttle, origin: o}
	a.changed = append(a.changed, d.Name)
	name := d.Name
	a.swaps = append(a.swaps, func() {
		if h == nil {
			h = &PolicyHandle{}
			a.r.policies[name] = h
		}
		h.cur.Store(v)
	})
	return nil
}

// server builds the values of s's handles that changed.
func (a *applying) server(s *resolvedServer) error {
	if err := a.deadline(s); err != nil {
		return err
	}
	if err := a.shed(s); err != nil {
		return err
	}
	// Idempotency servers are rebuilt for every handle handed out, with
	// the store and scope it was given.
	if s.Idempotency != nil {
		for _, e := range a.r.idems[s.Name] {
			srv, err := e.build(*s.Idempotency, s.IdempotencyScopeCaller)
			if err != nil {
				return err
			}
			a.swaps = append(a.swaps, func() { e.h.cur.Store(srv) })
		}
	}
	return a.rateLimit(s)
}

func (a *applying) deadline(s *resolvedServer) error {
	if s.Deadline == nil {
		return nil
	}
	dc := *s.Deadline
	e := a.r.dls[s.Name]
	if e != nil && reflect.DeepEqual(e.cfg, dc) {
		return nil
	}
	srv, err := deadline.New(dc)
	if err != nil {
		return err
	}
	a.changed = append(a.changed, "servers."+s.Name+".deadline")
	name := s.Name
	a.swaps = append(a.swaps, func() {
		if e == nil {
			e = &deadlineEntry{h: newHandle((*deadline.Server).Middleware)}
			a.r.dls[name] = e
		}
		e.h.cur.Store(srv)
		e.cfg = dc
	})
	return nil
}

func (a *applying) shed(s *resolvedServer) error {
	if s.Shed == nil {
		return nil
	}
	sc := *s.Shed
	sc.Observer = a.obs
	sh, err := reuse(a, "shed", s.Name, *s.Shed, func() (*shed.Shedder, error) { return shed.New(sc) })
	if err != nil {
		return err
	}
	h := a.r.sheds[s.Name]
	if h != nil && h.cur.Load() == sh {
		return nil
	}
	a.changed = append(a.changed, "servers."+s.Name+".shed")
	name := s.Name
	a.swaps = append(a.swaps, func() {
		if h == nil {
			h = newHandle((*shed.Shedder).Middleware)
			a.r.sheds[name] = h
		}
		h.cur.Store(sh)
	})
	return nil
}

// rateLimit rebuilds the rate limiters of s, their buckets emptied, only
// when their settings change; a limiter whose section is gone keeps its
// last settings, as the handle's code still runs.
func (a *applying) rateLimit(s *resolvedServer) error {
	if s.RateLimit == nil {
		return nil
	}
	rc, shared := *s.RateLimit, s.RateLimitShared
	for _, e := range a.r.limits[s.Name] {
		if reflect.DeepEqual(e.cfg, rc) && reflect.DeepEqual(e.shared, shared) {
			continue
		}
		l, fl, err := e.build(rc, shared)
		if err != nil {
			return err
		}
		a.changed = append(a.changed, "servers."+s.Name+".rate_limit")
		if fl != nil {
			a.aborts = append(a.aborts, func() { _ = fl.Close() })
		}
		a.swaps = append(a.swaps, func() {
			old := e.fleet
			e.h.cur.Store(l)
			e.cfg, e.shared, e.fleet = rc, shared, fl
			retire(old)
		})
	}
	return nil
}

// abort undoes what the builds of a rejected reload started: the fleet
// limiters of shared rate limits, which would otherwise keep their
// goroutines.
func (a *applying) abort() {
	for _, f := range a.aborts {
		f()
	}
}
