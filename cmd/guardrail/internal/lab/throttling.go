package lab

import (
	"context"
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
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/throttle"
)

type throttlingParams struct {
	capacity float64 // requests per second the backend serves before the halving
	offered  float64 // requests per second the clients send
	phase    time.Duration
	settle   time.Duration
	k        float64
	window   time.Duration
	openFor  time.Duration
}

func throttling() Experiment {
	return bound(Experiment{
		Name:    "throttling",
		Summary: "a backend whose capacity halves mid-run: no protection, a breaker, client-side adaptive throttling",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := throttlingParams{capacity: 400, offered: 360, phase: 6 * time.Second, settle: 2 * time.Second, k: 1.05, window: 2 * time.Second, openFor: 500 * time.Millisecond}
			if quick {
				p.phase = 5 * time.Second
			}
			fs.Float64Var(&p.capacity, "capacity", p.capacity, "requests per second the backend serves, before it halves")
			fs.Float64Var(&p.offered, "offered", p.offered, "requests per second the clients send")
			fs.DurationVar(&p.phase, "phase", p.phase, "length of each phase (full capacity, then half)")
			fs.DurationVar(&p.settle, "settle", p.settle, "time after the halving left out of the second phase's numbers")
			fs.Float64Var(&p.k, "k", p.k, "the throttle's K: requests let through per accepted one")
			fs.DurationVar(&p.window, "window", p.window, "the throttle's window")
			fs.DurationVar(&p.openFor, "open-for", p.openFor, "how long the breaker stays open")
			return &p
		},
	})
}

// capacityServer serves capacity requests per second (a token bucket of
// a twentieth of a second's burst) and answers the rest 503 at once, as a
// server that sheds does; it counts what reached it per phase.
type capacityServer struct {
	mu       sync.Mutex
	rate     float64
	tokens   float64
	last     time.Time
	requests atomic.Int64
}

func (s *capacityServer) setRate(r float64) {
	s.mu.Lock()
	s.rate = r
	s.mu.Unlock()
}

func (s *capacityServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	now := time.Now()
	s.mu.Lock()
	burst := s.rate / 20
	s.tokens = min(burst, s.tokens+now.Sub(s.last).Seconds()*s.rate)
	s.last = now
	ok := s.tokens >= 1
	if ok {
		s.tokens--
	}
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	time.Sleep(2 * time.Millisecond)
	_, _ = w.Write([]byte("ok"))
}

type phaseCount struct {
	sent, ok, requests int64
	opens              int64
}

// throttleRun is one mode's run: its two phases, and what timing's rule
// needs to judge them.
type throttleRun struct {
	phases [2]phaseCount
	sched  schedule
	late   lateness
}

// throttleMaxLag is the most a send may start behind its schedule, at the
// 99th percentile, before the run counts as measuring this machine.
const throttleMaxLag = 50 * time.Millisecond

// throttleMaxPhase bounds --phase: a run is three modes of two phases.
const throttleMaxPhase = 10 * time.Minute

// checkFlags reports every flag the experiment cannot run with.
func (p throttlingParams) checkFlags() error {
	var c flagCheck
	// !(x > 0) rather than x <= 0: a NaN fails it.
	if !(p.capacity > 0) || !(p.offered > 0) || p.phase <= p.settle || !(p.k >= 1) || p.window <= 0 || p.settle < p.window {
		c.failf("--capacity and --offered must be positive, --phase longer than --settle, --settle at least --window (the throttle needs a window to forget the full capacity), --k at least 1, --window positive")
	}
	// The backend's rate, requests per second, and the gap between sends,
	// a second / --offered: at most maxRPS, so the gap stays at least
	// 50µs and the sending loop ends.
	notAbove(&c, "capacity", p.capacity, above(0, float64(maxRPS)))
	if p.offered > 0 {
		// Below one a second a phase may send nothing to measure.
		within(&c, "offered", p.offered, closed(1, float64(maxRPS)))
	}
	notAbove(&c, "phase", p.phase, above(0, throttleMaxPhase))
	notAbove(&c, "settle", p.settle, closed(0, throttleMaxPhase))
	notAbove(&c, "window", p.window, above(0, throttleMaxPhase))
	notAbove(&c, "k", p.k, closed(1, 1e6))
	within(&c, "open-for", p.openFor, above(0, maxWait))
	return c.err()
}

func (p throttlingParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "throttling", Title: fmt.Sprintf("%.0f req/s offered to a backend serving %.0f req/s, then %.0f: no protection, a breaker (open %v), adaptive throttling (K %.2f, window %v)",
		p.offered, p.capacity, p.capacity/2, p.openFor, p.k, p.window)}
	// The three modes run at once, each against a backend of its own: together
	// they offer three times --offered, a light load for the machine, and each
	// mode's numbers are rates the backend's token bucket decides, not
	// latencies; every mode's own schedule and timer lateness still decide
	// whether it was measured.
	modes := []string{"none", "breaker", "throttling"}
	env.Progress("throttling: %s at once", strings.Join(modes, ", "))
	results := make([]throttleRun, len(modes))
	errs := make([]error, len(modes))
	var wg sync.WaitGroup
	for i, mode := range modes {
		wg.Go(func() { results[i], errs[i] = p.runMode(ctx, mode) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for i, mode := range modes {
		run := results[i]
		ph := run.phases
		for j, name := range []string{"full", "halved"} {
			c := ph[j]
			capacity, length := p.capacity, p.phase
			if j == 1 {
				capacity, length = p.capacity/2, p.phase-p.settle
			}
			load := float64(c.requests) / (capacity * length.Seconds()) * 100
			succ := 0.0
			if c.sent > 0 {
				succ = float64(c.ok) / float64(c.sent) * 100
			}
			r.add(fmt.Sprintf("%s, %s capacity", mode, name), Str("mode", mode).jsonOnly(), Str("phase", name).jsonOnly(),
				Float("backend_load_pct_of_capacity", load, 0).Named("backend_load_%"),
				Float("client_success_pct", succ, 1).Named("success_%"),
				Int("breaker_flaps", int(c.opens)).Named("breaker_opens"))
		}
	}
	p.checks(r, results)
	r.note("the halved phase leaves out its first %v, while the throttle's window forgets the full-capacity accepts (breaker opens then are not counted either); the throttling run has the same breaker as the breaker run", p.settle)
	r.note("K = %.2f lets through %.2f requests per accepted one; the library's default, the SRE book's K = 2, keeps the backend at about twice its capacity (cheap 503s) in exchange for noticing a recovery sooner", p.k, p.k)
	return r, nil
}

// checks judges the three modes' runs (none, breaker, throttling): both
// checks are timings (a rate the backend saw, opens decided by answers in
// time), so each needs the run it reads, and the one it compares with, to
// have kept its schedule on a machine quiet enough to time.
func (p throttlingParams) checks(r *Result, results []throttleRun) {
	none, br, th := results[0], results[1], results[2]
	load := float64(th.phases[1].requests) / (p.capacity / 2 * (p.phase - p.settle).Seconds()) * 100
	pre := func(runs ...throttleRun) *timing {
		t := &timing{}
		for _, run := range runs {
			t.needSchedule(run.sched).needQuiet(run.sched.run, run.late)
		}
		return t
	}
	r.timed(pre(none, th), load <= 110, "throttling keeps the backend within 10 % of its capacity", "%.0f %% of capacity after the halving (none: %.0f %%)", load,
		float64(none.phases[1].requests)/(p.capacity/2*(p.phase-p.settle).Seconds())*100)
	r.timed(pre(br, th), th.phases[1].opens == 0, "throttling does not make the breaker flap", "%d breaker opens with throttling, %d with the breaker alone", th.phases[1].opens, br.phases[1].opens)
	var worst lateness
	for _, run := range results {
		worst = worst.worse(run.late)
	}
	r.note("load generator: %.0f req/s open loop in every mode; timer lateness alongside it %s (worst mode; a mode is timed when its p99 is <= %v and its CPU wait, where known, <= %.0f%%)", p.offered, worst, quietBound, 100*maxCPUWait)
}

// runMode offers the load for two phases, halving the backend's capacity
// between them, and counts each phase.
func (p throttlingParams) runMode(ctx context.Context, mode string) (throttleRun, error) {
	var run throttleRun
	out := &run.phases
	srv := &capacityServer{rate: p.capacity, tokens: p.capacity / 20, last: time.Now()}
	s, err := serve(srv)
	if err != nil {
		return run, err
	}
	defer s.Close()
	// Breaker opens are counted in the part of each phase that is
	// measured: the one open of the halving itself, before the throttle's
	// window has learnt the new capacity, is a transition, not a flap.
	var phase atomic.Int32 // 0 full, 1 the halving's settling time, 2 halved and measured
	var opens [3]atomic.Int64
	bcfg := breaker.Config{Mode: breaker.Disabled}
	if mode != "none" {
		bcfg = breaker.Config{Window: time.Second, MinRequests: 20, FailureRate: 0.3, OpenFor: p.openFor,
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if e.To == breaker.Open.String() {
					opens[phase.Load()].Add(1)
				}
				return ctx
			})}
	}
	group, err := breaker.NewGroup(breaker.GroupConfig{Config: bcfg})
	if err != nil {
		return run, err
	}
	cfg := guardhttp.Config{Name: "throttling", Retry: guardrail.Retry{MaxAttempts: 1}, Breakers: group}
	if mode == "throttling" {
		th, err := throttle.New(throttle.Config{K: p.k, Window: p.window})
		if err != nil {
			return run, err
		}
		cfg.Throttler = th
	}
	tr := mustTransport(newBaseTransport(true), cfg)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var counts [2]struct{ sent, ok atomic.Int64 }
	var lags []time.Duration
	var firstSend, lastSend time.Time
	var inFlight sync.WaitGroup
	gap := time.Duration(float64(time.Second) / p.offered)
	start := time.Now()
	end := start.Add(2 * p.phase)
	halved := start.Add(p.phase)
	measureFrom := halved.Add(p.settle)
	var reqAtHalving, reqAtMeasure int64
	limit := make(chan struct{}, 512)
	probe := probeQuiet(ctx)
	defer probe.stop()
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * gap)
		if !at.Before(end) || ctx.Err() != nil {
			break
		}
		if d := time.Until(at); d > 0 {
			time.Sleep(d)
		}
		now := time.Now()
		if phase.Load() == 0 && !now.Before(halved) {
			reqAtHalving = srv.requests.Load()
			srv.setRate(p.capacity / 2)
			phase.Store(1)
		}
		if reqAtMeasure == 0 && !now.Before(measureFrom) {
			reqAtMeasure = srv.requests.Load()
			phase.Store(2)
		}
		ph := min(phase.Load(), 1)
		measured := phase.Load() != 1
		limit <- struct{}{}
		if measured {
			// The lag counts the wait for a slot too: a send held back by
			// 512 requests in flight is behind its schedule.
			sentAt := time.Now()
			counts[ph].sent.Add(1)
			lags = append(lags, max(0, sentAt.Sub(at)))
			if firstSend.IsZero() {
				firstSend = sentAt
			}
			lastSend = sentAt
		}
		inFlight.Go(func() {
			defer func() { <-limit }()
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := get(cctx, client, s.URL)
			if err == nil && measured {
				counts[ph].ok.Add(1)
			}
		})
	}
	reqAtEnd := srv.requests.Load()
	run.late = probe.stop()
	inFlight.Wait()
	if err := ctx.Err(); err != nil {
		return run, err
	}
	for i := range out {
		out[i].sent, out[i].ok = counts[i].sent.Load(), counts[i].ok.Load()
	}
	// The measured sends span the whole run less the settling time.
	run.sched = schedule{run: mode, want: p.offered, lagP99: quantile(lags, 0.99), maxLag: throttleMaxLag}
	if d := lastSend.Sub(firstSend) - p.settle; len(lags) > 1 && d > 0 {
		run.sched.rate = float64(len(lags)-1) / d.Seconds()
	}
	out[0].opens, out[1].opens = opens[0].Load(), opens[2].Load()
	out[0].requests = reqAtHalving
	out[1].requests = reqAtEnd - reqAtMeasure
	return run, nil
}
