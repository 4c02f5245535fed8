package lab

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fallback"
	"github.com/guardrail-go/guardrail/fault"
	"github.com/guardrail-go/guardrail/guardhttp"
)

type breakerParams struct {
	openFor        time.Duration
	attemptTimeout time.Duration
	hang           time.Duration
	outageMin      int
	requests       int
}

func breakerExp() Experiment {
	return bound(Experiment{
		Name:    "breaker",
		Light:   true,
		Summary: "a pricing service that fails, answers 404 and hangs, behind a breaker with a last-good-price fallback",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := breakerParams{openFor: time.Second, attemptTimeout: 1200 * time.Millisecond, hang: 5 * time.Second, outageMin: 4, requests: 30}
			fs.DurationVar(&p.openFor, "open-for", p.openFor, "how long the breaker stays open (1s keeps the run short; the breaker package's default is 30s)")
			fs.DurationVar(&p.attemptTimeout, "attempt-timeout", p.attemptTimeout, "per-attempt timeout, a little above pricing's p99 (800ms)")
			fs.DurationVar(&p.hang, "hang", p.hang, "how long the slow pricing service takes")
			fs.IntVar(&p.outageMin, "outage-min-requests", p.outageMin, "the outage rows' breaker minimum volume")
			fs.IntVar(&p.requests, "requests", p.requests, "requests in the 404 and outage rows")
			return &p
		},
	})
}

// pricing is the dependency: a price for any SKU, with faults injected in
// front of it; it counts the calls that reach it.
type pricing struct {
	inj   *fault.Injector
	calls atomic.Int64
	srv   *server
}

func newPricing() (*pricing, error) {
	inj, err := fault.New(fault.Config{})
	if err != nil {
		return nil, err
	}
	p := &pricing{inj: inj}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(w, `{"sku":%q,"price":100}`, r.URL.Query().Get("sku"))
	})
	counted := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.calls.Add(1)
		inj.Middleware(h).ServeHTTP(w, r)
	})
	if p.srv, err = serve(counted); err != nil {
		inj.Close()
		return nil, err
	}
	return p, nil
}

func (p *pricing) set(f fault.Fault) {
	if f == nil {
		_ = p.inj.Reconfigure(fault.Config{})
		return
	}
	_ = p.inj.Reconfigure(fault.Config{Rules: []fault.Rule{{Name: "pricing", Fault: f}}})
}

func (p *pricing) Close() {
	p.inj.Close()
	p.srv.Close()
}

type price struct {
	SKU   string `json:"sku"`
	Price int    `json:"price"`
}

// shop is the caller: pricing calls through guardhttp (one attempt, a
// breaker for pricing's host), answered from the last-good cache when they
// fail.
type shop struct {
	pricing *pricing
	client  *http.Client
	cache   *fallback.Cache[string, price]
}

func newShop(p *pricing, cfg breaker.Config, attemptTimeout time.Duration) (*shop, *breaker.Breaker) {
	group, err := breaker.NewGroup(breaker.GroupConfig{Config: cfg})
	if err != nil {
		panic(err) // the experiment's own constants
	}
	cache, err := fallback.NewCache[string, price](fallback.CacheConfig{TTL: time.Hour,
		// A 404 says the price is gone: serving the old one would lie.
		ShouldFallback: func(err error) bool { var se statusError; return !errors.As(err, &se) || se.code != 404 }})
	if err != nil {
		panic(err) // the config is a constant, and valid
	}
	s := &shop{
		pricing: p,
		client:  guarded(true, guardhttp.Config{Name: "pricing", Retry: guardrail.Retry{MaxAttempts: 1, AttemptTimeout: attemptTimeout}, Breakers: group}),
		cache:   cache,
	}
	// guardhttp keys breakers by host: this is the one pricing's calls use.
	return s, group.Get(strings.TrimPrefix(p.srv.URL, "http://"))
}

func (s *shop) price(ctx context.Context, sku string) (fallback.Result[price], error) {
	return s.cache.Do(ctx, sku, func(ctx context.Context) (price, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.pricing.srv.URL+"/price?sku="+sku, nil)
		resp, err := s.client.Do(req)
		if err != nil {
			return price{}, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return price{}, statusError{resp.StatusCode}
		}
		var p price
		return p, json.NewDecoder(resp.Body).Decode(&p)
	})
}

// breakerMaxRequests bounds --requests: the 404 row sends them one after
// another, each reaching pricing.
const breakerMaxRequests = 100_000

// checkFlags reports every flag the experiment cannot run with. A zero
// --open-for or --outage-min-requests would be the breaker's default, not
// what was asked; a negative one, a breaker that cannot be built.
func (p breakerParams) checkFlags() error {
	var c flagCheck
	within(&c, "open-for", p.openFor, above(0, maxWait))
	within(&c, "attempt-timeout", p.attemptTimeout, above(0, maxWait))
	within(&c, "hang", p.hang, above(0, maxRun)) // a zero fault.Latency is invalid: no hang at all
	within(&c, "outage-min-requests", p.outageMin, closed(1, breakerMaxRequests))
	within(&c, "requests", p.requests, closed(1, breakerMaxRequests))
	return c.err()
}

func (p breakerParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "breaker", Title: "pricing behind a breaker and a last-good fallback: what opens the breaker, what does not, and what callers get"}
	pr, err := newPricing()
	if err != nil {
		return nil, err
	}
	defer pr.Close()
	def := breaker.DefaultConfig()
	r.note("guardrail defaults: window %v, min requests %d, failure rate %.0f%%, open %v + up to %.0f%% jitter, %d probe; for comparison, the defaults of opossum (the Node.js breaker): timeout 10s, errorThresholdPercentage 50%%, resetTimeout 30s, volumeThreshold 0",
		def.Window, def.MinRequests, def.FailureRate*100, def.OpenFor, def.OpenJitter*100, def.HalfOpenProbes)

	add := func(label string, o breakerOut) {
		r.add(label, Bool("opened", o.opened), Int("failures_counted", o.failures), Int("calls_reaching_dependency", o.calls),
			Ms("answered_ms", o.answered).Named("slowest_answer"), Int("stale", o.stale))
	}
	// ask sends n requests and measures them.
	ask := func(s *shop, n int) (o breakerOut) {
		before := pr.calls.Load()
		for range n {
			t0 := time.Now()
			res, _ := s.price(ctx, "p1")
			o.answered = max(o.answered, time.Since(t0))
			if res.Stale {
				o.stale++
			}
		}
		o.calls = int(pr.calls.Load() - before)
		return o
	}

	// 1-2. Low traffic: 1 success and 2 failures, without and with a minimum volume.
	for _, min := range []int{1, def.MinRequests} {
		env.Progress("breaker: low traffic, min requests %d", min)
		// failures counted when it tripped: the calls pricing failed until
		// then, the last one included (the Observer runs on the goroutine
		// whose failure tripped the breaker, after pricing answered it).
		tripped := -1
		var failingSince int64
		s, br := newShop(pr, breaker.Config{MinRequests: min, OpenFor: p.openFor,
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if e.To == breaker.Open.String() {
					tripped = int(pr.calls.Load() - failingSince)
				}
				return ctx
			})}, p.attemptTimeout)
		pr.set(nil)
		o := ask(s, 1)
		failingSince = pr.calls.Load()
		pr.set(fault.Status{Code: 503})
		o2 := ask(s, 2)
		o.calls += o2.calls
		o.opened = br.State() != breaker.Closed
		o.failures = br.Metrics().Failures
		if tripped >= 0 {
			o.failures = tripped
		}
		add(fmt.Sprintf("low traffic, MinRequests %d", min), o)
		if min == 1 {
			r.check(o.opened, "no minimum volume trips at low traffic", "1 success, then failures: opened after %d call(s): %v", o.calls, o.opened)
		} else {
			r.check(!o.opened, "a minimum volume holds at low traffic", "1 success + 2 failures opened the breaker: %v", o.opened)
		}
	}

	// 3. 404s are the request's fault: never counted.
	env.Progress("breaker: %d x 404", p.requests)
	s, br := newShop(pr, breaker.Config{MinRequests: p.outageMin, OpenFor: p.openFor}, p.attemptTimeout)
	pr.set(fault.Status{Code: 404})
	o := ask(s, p.requests)
	o.opened, o.failures = br.State() != breaker.Closed, br.Metrics().Failures
	add(fmt.Sprintf("%d x 404", p.requests), o)
	r.check(!o.opened && o.failures == 0, "4xx never counts", "%d 404s: opened %v, failures counted %d", p.requests, o.opened, o.failures)

	// 4. Outage: the breaker trips after the minimum volume, the rest is
	// answered stale at once. Its transitions make the state timeline.
	env.Progress("breaker: outage, %d requests", p.requests)
	var mu sync.Mutex
	t0 := time.Now()
	type point struct {
		at    time.Duration
		state breaker.State
	}
	timeline := []point{{0, breaker.Closed}}
	s, br = newShop(pr, breaker.Config{MinRequests: p.outageMin, OpenFor: p.openFor, OpenJitter: -1,
		Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			to := breaker.Closed
			for _, st := range []breaker.State{breaker.Open, breaker.HalfOpen} {
				if e.To == st.String() {
					to = st
				}
			}
			mu.Lock()
			timeline = append(timeline, point{time.Since(t0), to})
			mu.Unlock()
			return ctx
		})}, p.attemptTimeout)
	pr.set(nil)
	if _, err := s.price(ctx, "p1"); err != nil { // a last-good price
		return nil, fmt.Errorf("warming the cache: %w", err)
	}
	pr.set(fault.Status{Code: 503})
	o = ask(s, p.requests)
	o.opened = br.State() == breaker.Open
	o.failures = o.calls
	add(fmt.Sprintf("outage, %d requests", p.requests), o)
	r.check(o.stale == p.requests && o.calls <= p.outageMin, "outage answered from the fallback",
		"%d of %d answered stale, %d calls reached pricing (min requests %d, the warm-up success among them)", o.stale, p.requests, o.calls, p.outageMin)

	// 5. After OpenFor, one probe; pricing is back, so it closes.
	env.Progress("breaker: waiting %v for the probe", p.openFor)
	pr.set(nil)
	if err := sleepUntil(ctx, time.Now().Add(p.openFor)); err != nil {
		return nil, err
	}
	o = ask(s, 1)
	o.opened, o.failures = br.State() != breaker.Closed, br.Metrics().Failures
	add("after OpenFor, probe", o)
	r.check(!o.opened && o.stale == 0 && o.calls == 1, "probe closes the breaker", "state %v, fresh answer %v, %d call", br.State(), o.stale == 0, o.calls)

	// 6. Pricing hangs: answered stale at the attempt timeout.
	env.Progress("breaker: pricing hangs")
	pr.set(fault.Latency{Delay: p.hang})
	probe := probeQuiet(ctx)
	o = ask(s, 1)
	late := probe.stop()
	o.opened, o.failures = br.State() != breaker.Closed, br.Metrics().Failures
	add("slow pricing", o)
	p.hangCheck(r, o, late)

	mu.Lock()
	events := timeline[1:]
	timeline = append(timeline, point{time.Since(t0), br.State()})
	var at []time.Duration
	var states []breaker.State
	for _, pt := range timeline {
		at, states = append(at, pt.at), append(states, pt.state)
	}
	mu.Unlock()
	r.Charts = append(r.Charts, breakerChart(at, states))
	for _, pt := range events {
		r.note("[event] %v at %dms", pt.state, pt.at.Milliseconds())
	}
	return r, nil
}

// breakerChart draws the breaker's state over time: state[i] from at[i]
// until at[i+1]. The x axis is linear in milliseconds, so a half-open state
// that lasts 1 ms is a sliver and an open one of 1,000 ms is wide, as they
// were.
func breakerChart(at []time.Duration, states []breaker.State) Chart {
	level := map[breaker.State]float64{breaker.Closed: 0, breaker.HalfOpen: 1, breaker.Open: 2}
	var xs, ys []float64
	for i, t := range at {
		xs = append(xs, float64(t.Microseconds())/1e3)
		ys = append(ys, level[states[i]])
	}
	return Chart{Title: "breaker state during the outage, the probe and the slow call", Kind: "stepped",
		XLabel: "ms since the outage began", YLabel: "state", XValues: xs, Series: []Series{{Name: "state", Values: ys}},
		YCategories: []string{"closed", "half-open", "open"}}
}

// hangCheck judges the slow call: a stale answer (a count) whatever the
// machine did; answered at the attempt timeout, not later, only on a
// machine quiet enough to time the call (late, measured alongside it).
func (p breakerParams) hangCheck(r *Result, o breakerOut, late lateness) {
	const name = "a hang is answered at the attempt timeout"
	detail := "answered in %v (stale %v), attempt timeout %v, pricing takes %v"
	args := []any{o.answered.Round(time.Millisecond), o.stale == 1, p.attemptTimeout, p.hang}
	if o.stale != 1 || o.answered < p.attemptTimeout {
		r.check(false, name, detail, args...) // neither is a busy machine's doing
		return
	}
	r.timed((&timing{}).needQuiet("slow pricing", late), o.answered < p.attemptTimeout+300*time.Millisecond, name, detail, args...)
}

// breakerOut is what one step of the breaker experiment measured.
type breakerOut struct {
	opened                 bool
	failures, calls, stale int
	answered               time.Duration
}
