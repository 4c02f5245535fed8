package lab

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/sim"
	"github.com/guardrail-go/guardrail/shed"
)

// capacityParams are the changing-capacity rows of the shedding experiment:
// the pool's capacity changes mid-run, and the adaptive limit is set against
// fixed ones at several overloads.
type capacityParams struct {
	phases    []int     // slots per phase
	overloads []float64 // offered load / the first phase's capacity
	fixed     []int     // fixed limits to compare
	phase     time.Duration
	timeout   time.Duration // the clients' timeout
}

// parseInts parses "10,5,20".
func parseInts(flagName, s string) ([]int, error) {
	if err := checkList(flagName, s); err != nil {
		return nil, err
	}
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || v < 1 || v > 10000 {
			return nil, flagErrorf("--%s: %q is not a whole number in [1, 10000]", flagName, part)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseOverloads parses "3,10,30", or "none" for no capacity rows.
func parseOverloads(s string) ([]float64, error) {
	if s == "none" || s == "" {
		return nil, nil
	}
	if err := checkList("capacity-overloads", s); err != nil {
		return nil, err
	}
	var out []float64
	for part := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil || !(v >= 0.1 && v <= 100) {
			return nil, flagErrorf("--capacity-overloads: %q is not a number in [0.1, 100] (or write none)", part)
		}
		out = append(out, v)
	}
	return out, nil
}

// parseCapacity parses the cap* flags into p.cap.
func (p *shedParams) parseCapacity() error {
	var err error
	if p.cap.overloads, err = parseOverloads(p.capOverloads); err != nil || len(p.cap.overloads) == 0 {
		return err
	}
	if p.cap.phases, err = parseInts("capacity-slots", p.capSlots); err != nil {
		return err
	}
	if p.cap.fixed, err = parseInts("capacity-fixed", p.capFixed); err != nil {
		return err
	}
	if p.cap.timeout <= 0 {
		return flagErrorf("--capacity-client-timeout must be positive, not %v", p.cap.timeout)
	}
	if p.cap.timeout > maxWait {
		return flagErrorf("--capacity-client-timeout is %v; want a value in %v", p.cap.timeout, above(0, maxWait))
	}
	if p.cap.phase < 500*time.Millisecond {
		return flagErrorf("--capacity-phase must be at least 500ms, not %v", p.cap.phase)
	}
	// A run lasts a phase per --capacity-slots entry; the comparison is
	// phase <= maxRun / entries rather than their product, which could
	// overflow.
	if n := len(p.cap.phases); p.cap.phase > maxRun/time.Duration(n) {
		return flagErrorf("--capacity-phase is %v with %d phases; want at most %v, so that a run lasts at most %v", p.cap.phase, n, maxRun/time.Duration(n), maxRun)
	}
	rps := slices.Max(append([]float64{0}, p.cap.overloads...)) * float64(p.cap.phases[0]) / p.service.Seconds()
	if rps > maxRPS {
		return flagErrorf("--capacity-overloads: %.0f rps is more than this lab sends (%d)", rps, maxRPS)
	}
	if n := rps * (p.cap.phase * time.Duration(len(p.cap.phases))).Seconds(); n > maxRequests {
		return flagErrorf("--capacity-overloads x --capacity-phase x phases is %.0f requests per run; want at most %d", n, maxRequests)
	}
	return nil
}

// capacityRun is one limiter at one overload.
type capacityRun struct {
	label    string
	limit    int // 0: adaptive
	overload float64
	res      shedResult
	limits   []int // the shedder's limit every limitStep
	phases   []capacityPhase
}

// capacityPhase is what one phase of a run measured.
type capacityPhase struct {
	slots      int
	goodputPct float64       // 200s answered in the phase within the timeout, per second / its capacity
	p99        time.Duration // of the 200s
	converge   time.Duration // after the change, until goodput is within 5 % of steady; -1 if never
	ok         int
}

const limitStep = 50 * time.Millisecond

// steadyLimit returns the median of the limit over the second half of
// phase k.
func (c *capacityRun) steadyLimit(k int, phase time.Duration) int {
	from, to := int((time.Duration(k)*phase+phase/2)/limitStep), int(time.Duration(k+1)*phase/limitStep)
	from, to = min(from, len(c.limits)), min(to, len(c.limits))
	if from >= to {
		return 0
	}
	s := slices.Clone(c.limits[from:to])
	slices.Sort(s)
	return s[len(s)/2]
}

// resizablePool is the database pool of the changing-capacity rows: a
// query holds one of its slots for the service time, first come first
// served; a waiter leaves when its client does; a query once started runs
// to its end. When the pool shrinks, running queries finish and no new one
// starts until fewer than the new size run, as a pool that loses a replica
// behaves.
type resizablePool struct {
	*sim.Pool
	service time.Duration
}

func newResizablePool(slots int, service time.Duration) *resizablePool {
	return &resizablePool{Pool: sim.NewPool(slots), service: service}
}

func (p *resizablePool) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if p.Acquire(r.Context()) != nil {
		return
	}
	time.Sleep(p.service)
	p.Release()
	if r.Context().Err() != nil {
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// capacity runs every limiter at every overload and adds its rows, checks,
// notes and charts to r.
func (p shedParams) capacity(ctx context.Context, env *Env, r *Result) error {
	cp := p.cap
	if len(cp.overloads) == 0 {
		return nil
	}
	capacity0 := float64(cp.phases[0]) / p.service.Seconds()
	var runs []*capacityRun
	for i, over := range cp.overloads {
		// The fixed limits run at the first overload only: an in-flight
		// limit admits the same requests however much more is offered
		// beyond it (its goodput and p99 agreed within a point and a few
		// ms at 3, 10 and 30x), so later overloads compare the adaptive
		// limit with the same fixed runs.
		limits := []int{0}
		if i == 0 {
			limits = append(limits, cp.fixed...)
		}
		// The limiters of one overload run at once, each with a pool and a
		// server of its own: together they send at most as much as one run
		// at the highest overload does alone, and each run's own schedule
		// and timer lateness still decide whether it was measured.
		group := make([]*capacityRun, len(limits))
		errs := make([]error, len(limits))
		var wg sync.WaitGroup
		for j, l := range limits {
			run := &capacityRun{limit: l, overload: over, label: "adaptive"}
			if l > 0 {
				run.label = fmt.Sprintf("fixed %d", l)
			}
			group[j] = run
			wg.Go(func() {
				for try := 1; ; try++ {
					env.Progress("shedding: capacity %s, %.0fx overload (%.0f rps), try %d", run.label, over, over*capacity0, try)
					res, trace, err := p.capacityScenario(ctx, l, over*capacity0)
					if err != nil {
						errs[j] = err
						return
					}
					if try == 1 || p.betterRun(res, run.res, over*capacity0) {
						run.res, run.limits = res, trace
					}
					if !p.unfit(res, over*capacity0) || try == shedTries {
						break
					}
				}
				run.phases = p.judgePhases(run.res)
			})
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
		runs = append(runs, group...)
	}

	// Rows, checks.
	for _, run := range runs {
		for k, ph := range run.phases {
			limit := Str("limit", "adaptive")
			if run.limit > 0 {
				limit = Int("limit", run.limit)
			}
			conv := Ms("converge_ms", ph.converge)
			if ph.converge < 0 {
				conv = Col{Key: "converge_ms", Value: nil}
			}
			p99 := Ms("p99_ok_ms", ph.p99).Named("p99_ok")
			if ph.ok == 0 {
				p99 = Col{Key: "p99_ok_ms", Name: "p99_ok", Value: nil}
			}
			r.add(fmt.Sprintf("capacity %s, %gx, phase %d (%d slots)", run.label, run.overload, k+1, ph.slots),
				limit, Float("overload", run.overload, 0), Int("phase", k+1), Int("slots", ph.slots),
				Float("goodput_pct_of_capacity", round1(ph.goodputPct), 1).As("goodput/capacity", "%.1f%%"),
				p99, conv.Named("converge"))
		}
	}
	p.capacityChecks(r, runs, capacity0)
	r.note("capacity rows: the pool has %v slots in %v phases of %v, at %s x its first capacity (%.0f rps), the fixed limits at the first overload only (an in-flight limit admits the same requests however much more is offered); goodput/capacity = 200s answered within the client timeout during the phase, per second, over the phase's capacity (it can pass 100%% by a point: requests admitted at the end of the previous phase are answered in this one); p99_ok_ms is over those 200s; converge_ms = time after the change until successes per 100 ms are back within 5%% of the median of the phase's second half.",
		cp.phases, len(cp.phases), cp.phase, joinFloats(cp.overloads), capacity0)
	r.Charts = append(r.Charts, p.capacityCharts(runs, capacity0)...)
	return nil
}

// capacityChecks judges every overload's runs: the adaptive limit and
// each fixed one, at capacity0 x the overload.
func (p shedParams) capacityChecks(r *Result, runs []*capacityRun, capacity0 float64) {
	for _, over := range p.cap.overloads {
		var adaptive *capacityRun
		var fixed []*capacityRun
		// Every check of an overload compares its runs' timings: each
		// run must have kept its schedule on a machine quiet enough to time.
		pre := &timing{}
		for _, run := range runs {
			if run.overload != over && run.limit == 0 {
				continue
			}
			what := fmt.Sprintf("%s at %gx", run.label, run.overload)
			pre.needSchedule(p.sched(run.res, run.overload*capacity0, what)).needQuiet(what, run.res.late)
			if run.limit == 0 {
				adaptive = run
			} else {
				fixed = append(fixed, run)
			}
		}
		name := func(what string) string { return fmt.Sprintf("capacity %gx: %s", over, what) }
		checks := []string{"the adaptive limit follows the pool", "adaptive keeps >= 85% goodput in every phase",
			"adaptive p99 within a fifth of the client timeout in every phase", "adaptive converges within 1 s", "no fixed limit does all that"}
		if !pre.held() {
			for _, what := range checks {
				r.timed(pre, false, name(what), "")
			}
			continue
		}
		okLimit, okGood, okP99, okConv := true, true, true, true
		var ls, gs, ps, cs, strict []string
		maxP99 := p.cap.timeout / 5
		for k, ph := range adaptive.phases {
			end := adaptive.steadyLimit(k, p.cap.phase)
			okLimit = okLimit && end >= ph.slots && end <= 2*ph.slots+2
			ls = append(ls, fmt.Sprintf("%d for %d slots", end, ph.slots))
			okGood = okGood && ph.goodputPct >= 85
			gs = append(gs, fmt.Sprintf("%.1f%%", ph.goodputPct))
			okP99 = okP99 && ph.ok > 0 && ph.p99 <= maxP99
			ps = append(ps, ph.p99.Round(time.Millisecond).String())
			if k > 0 {
				okConv = okConv && ph.converge >= 0 && ph.converge <= time.Second
				cs = append(cs, ph.converge.String())
			}
			best, bestLabel := 0.0, ""
			for _, f := range fixed {
				if g := f.phases[k].goodputPct; g > best {
					best, bestLabel = g, f.label
				}
			}
			verdict := "met"
			if ph.goodputPct < best-2 {
				verdict = fmt.Sprintf("missed by %.1f points", best-2-ph.goodputPct)
			}
			p99v := "met"
			if ph.p99 > 2*p.service {
				p99v = fmt.Sprintf("missed by %v", (ph.p99 - 2*p.service).Round(time.Millisecond))
			}
			strict = append(strict, fmt.Sprintf("phase %d: goodput %.1f%% against %.1f%% (%s), %s; p99 %v against %v, %s",
				k+1, ph.goodputPct, best, bestLabel, verdict, ph.p99.Round(time.Millisecond), 2*p.service, p99v))
		}
		r.check(okLimit, name(checks[0]), "median limit over the second half of each phase: %s (want slots..2x slots+2)", strings.Join(ls, ", "))
		r.check(okGood, name(checks[1]), "goodput per phase: %s", strings.Join(gs, ", "))
		r.check(okP99, name(checks[2]), "p99 per phase: %s (want <= %v)", strings.Join(ps, ", "), maxP99)
		r.check(okConv, name(checks[3]), "after each change: %s", strings.Join(cs, ", "))
		var fixedOK []string
		for _, f := range fixed {
			all := true
			for _, ph := range f.phases {
				all = all && ph.goodputPct >= 85 && ph.ok > 0 && ph.p99 <= maxP99
			}
			if all {
				fixedOK = append(fixedOK, f.label)
			}
		}
		r.check(len(fixedOK) == 0, name(checks[4]), "fixed limits that kept >= 85%% goodput and p99 <= %v in every phase: %d (%s)", maxP99, len(fixedOK), strings.Join(fixedOK, ", "))
		r.note("capacity %gx, the stricter targets (goodput within 2 points of the best fixed limit of the phase, p99 <= 2x the query time): %s.", over, strings.Join(strict, "; "))
	}
}

func joinFloats(v []float64) string {
	var s []string
	for _, f := range v {
		s = append(s, strconv.FormatFloat(f, 'g', -1, 64))
	}
	return strings.Join(s, ", ")
}

// capacityScenario serves a resizable pool behind a shedder with limit (0:
// adaptive) and sends it load open-loop at rps through every phase. It
// returns the run and the shedder's limit every limitStep.
func (p shedParams) capacityScenario(ctx context.Context, limit int, rps float64) (shedResult, []int, error) {
	cp := p.cap
	p.timeout = cp.timeout // shoot's
	cfg := shed.Config{Name: "lab", Shares: map[shed.Priority]float64{shed.Normal: 1}}
	if limit > 0 {
		cfg.Limit = limit
	}
	s, err := shed.New(cfg)
	if err != nil {
		return shedResult{}, nil, err
	}
	pool := newResizablePool(cp.phases[0], p.service)
	srv, err := serve(s.Middleware(pool))
	if err != nil {
		return shedResult{}, nil, err
	}
	defer srv.Close()
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxConnsPerHost, t.MaxIdleConns, t.MaxIdleConnsPerHost = 0, 0, 8192
	client := &http.Client{Transport: t}
	defer t.CloseIdleConnections()

	total := cp.phase * time.Duration(len(cp.phases))
	n := int(math.Round(rps * total.Seconds()))
	res := shedResult{shedder: s, shots: make([]shot, n)}
	var limits []int
	var wg sync.WaitGroup
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	start := time.Now()
	wg.Go(func() {
		for k := 1; k < len(cp.phases); k++ {
			if sleepUntil(rctx, start.Add(time.Duration(k)*cp.phase)) != nil {
				return
			}
			pool.Resize(cp.phases[k])
		}
	})
	var traceMu sync.Mutex
	wg.Go(func() {
		for k := 0; ; k++ {
			if sleepUntil(rctx, start.Add(time.Duration(k)*limitStep)) != nil {
				return
			}
			_, l := s.Load()
			traceMu.Lock()
			limits = append(limits, l)
			traceMu.Unlock()
			if time.Duration(k)*limitStep >= total {
				return
			}
		}
	})
	interval := float64(time.Second) / rps
	var shots sync.WaitGroup
	probe := probeQuiet(ctx)
	defer probe.stop()
	for i := range n {
		due := time.Duration(float64(i) * interval)
		if err := sleepUntil(ctx, start.Add(due)); err != nil {
			break
		}
		shots.Go(func() {
			o := &res.shots[i]
			o.sched = due
			p.shoot(ctx, client, srv.URL, start, o)
		})
	}
	shots.Wait()
	res.late = probe.stop()
	stop()
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return shedResult{}, nil, err
	}
	t.CloseIdleConnections()
	sctx, cancel := context.WithTimeout(ctx, p.service+5*time.Second)
	err = srv.srv.Shutdown(sctx)
	cancel()
	if err != nil {
		return shedResult{}, nil, fmt.Errorf("shedding: server did not drain: %w", err)
	}
	res.lagStats(n)
	traceMu.Lock()
	defer traceMu.Unlock()
	return res, limits, nil
}

// lagStats fills the achieved send rate and the start lag from the shots.
func (r *shedResult) lagStats(n int) {
	first, last := r.shots[0].sent, r.shots[0].sent
	var lags []time.Duration
	for _, o := range r.shots {
		first, last = min(first, o.sent), max(last, o.sent)
		lags = append(lags, max(0, o.sent-o.sched))
	}
	if last > first {
		r.sendRate = float64(n-1) / (last - first).Seconds()
	}
	r.lagP99, r.lagMax = quantile(lags, 0.99), slices.Max(lags)
}

// judgePhases computes each phase's goodput, p99 and time to converge.
func (p shedParams) judgePhases(res shedResult) []capacityPhase {
	cp := p.cap
	const bucket = 100 * time.Millisecond
	out := make([]capacityPhase, len(cp.phases))
	for k, slots := range cp.phases {
		from, to := time.Duration(k)*cp.phase, time.Duration(k+1)*cp.phase
		var lat []time.Duration
		nb := max(1, int(cp.phase/bucket))
		byDone := make([]float64, nb)
		for _, o := range res.shots {
			ok := !o.late && o.code == http.StatusOK
			if !ok {
				continue
			}
			if done := o.sent + o.took; done >= from && done < to {
				lat = append(lat, o.took)
				byDone[min(nb-1, int((done-from)/bucket))]++
			}
		}
		ph := capacityPhase{slots: slots, ok: len(lat), converge: -1}
		ph.goodputPct = 100 * float64(len(lat)) / cp.phase.Seconds() / (float64(slots) / p.service.Seconds())
		ph.p99 = quantile(lat, 0.99)
		ph.converge = convergence(byDone, bucket)
		out[k] = ph
	}
	return out
}

// convergence returns how long after the start of buckets the count is
// first within 5 % of the median of the second half, or -1 if never.
func convergence(buckets []float64, width time.Duration) time.Duration {
	steady := slices.Clone(buckets[len(buckets)/2:])
	slices.Sort(steady)
	med := steady[len(steady)/2]
	for b, v := range buckets {
		if math.Abs(v-med) <= 0.05*med {
			return time.Duration(b) * width
		}
	}
	return -1
}

// capacityCharts draws, at the first overload, successes over time and the
// p99 of each phase for every limiter, and the adaptive limit over time
// against the pool: a small fixed limit shows in the first, a large one in
// the second.
func (p shedParams) capacityCharts(runs []*capacityRun, capacity0 float64) []Chart {
	cp := p.cap
	if len(runs) == 0 {
		return nil
	}
	over := runs[0].overload
	// An overload's checks are judged only when every run of it could be
	// (capacityChecks): its series are drawn faded otherwise.
	judged := map[float64]bool{}
	for _, o := range cp.overloads {
		judged[o] = true
		for _, run := range runs {
			if (run.overload == o || run.limit != 0) && p.unfit(run.res, run.overload*capacity0) {
				judged[o] = false
			}
		}
	}
	step := 100 * time.Millisecond
	total := cp.phase * time.Duration(len(cp.phases))
	nt := int(total / step)
	good := Chart{Title: fmt.Sprintf("Capacity %v: successes over time at %gx", cp.phases, over), Kind: "line",
		XLabel: "seconds since the load started", YLabel: "200s per 100 ms (by time answered)"}
	for k := range nt {
		good.X = append(good.X, fmt.Sprintf("%.1f", (time.Duration(k)*step).Seconds()))
	}
	capSeries := make([]float64, nt)
	for k := range nt {
		ph := min(len(cp.phases)-1, int(time.Duration(k)*step/cp.phase))
		capSeries[k] = float64(cp.phases[ph]) / p.service.Seconds() * step.Seconds()
	}
	good.Series = append(good.Series, Series{Name: "pool capacity", Values: capSeries})
	lim := Chart{Title: fmt.Sprintf("Capacity %v: the adaptive limit follows the pool", cp.phases), Kind: "stepped",
		XLabel: "seconds since the load started", YLabel: "requests in flight allowed"}
	for _, run := range runs {
		if run.overload != over {
			continue
		}
		t := make([]float64, nt)
		for _, o := range run.res.shots {
			if o.late || o.code != http.StatusOK {
				continue
			}
			if k := int((o.sent + o.took) / step); k < nt {
				t[k]++
			}
		}
		good.Series = append(good.Series, Series{Name: run.label, Values: t}.notJudgedIf(judged[over]))
	}
	nl := int(total / limitStep)
	for k := range nl {
		lim.X = append(lim.X, fmt.Sprintf("%.2f", (time.Duration(k)*limitStep).Seconds()))
	}
	slots := make([]float64, nl)
	for k := range nl {
		slots[k] = float64(cp.phases[min(len(cp.phases)-1, int(time.Duration(k)*limitStep/cp.phase))])
	}
	lim.Series = append(lim.Series, Series{Name: "pool slots", Values: slots})
	for _, run := range runs {
		if run.limit != 0 {
			continue
		}
		v := make([]float64, nl)
		for k := range nl {
			if k < len(run.limits) {
				v[k] = float64(run.limits[k])
			}
		}
		lim.Series = append(lim.Series, Series{Name: fmt.Sprintf("adaptive limit at %gx", run.overload), Values: v}.notJudgedIf(judged[run.overload]))
	}
	tail := Chart{Title: fmt.Sprintf("Capacity %v: p99 of the successes per phase at %gx", cp.phases, over), Kind: "bar",
		YLabel: "p99 latency (ms)"}
	for k, slots := range cp.phases {
		tail.X = append(tail.X, fmt.Sprintf("phase %d (%d slots)", k+1, slots))
	}
	for _, run := range runs {
		if run.overload != over {
			continue
		}
		v := make([]float64, len(run.phases))
		for k, ph := range run.phases {
			v[k] = float64(ph.p99.Milliseconds())
		}
		tail.Series = append(tail.Series, Series{Name: run.label, Values: v}.notJudgedIf(judged[over]))
	}
	return []Chart{good, tail, lim}
}
