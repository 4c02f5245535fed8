package lab

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/metastable"
	"github.com/guardrail-go/guardrail/shed"
)

// msParams are the metastable experiment's flags.
type msParams struct {
	rps         float64       // users' requests a second, open loop
	userTimeout time.Duration // each user attempt gives up after this long
	userTries   int           // attempts per user request, at once after a failure
	workers     int           // DB workers
	service     time.Duration // time a query holds its worker
	shedLimit   int           // the front's fixed shed limit
	warmup      time.Duration
	outage      time.Duration
	after       time.Duration
	step        time.Duration
	breakerOpen time.Duration
	variant     string // refuse, hang
	breaker     bool   // the front's breaker on
}

func metastableExp() Experiment {
	return bound(Experiment{
		Name:    "metastable",
		Summary: "callers that retry on their own keep a guarded service down after the DB is back; the metastability detector sees it and its actuator brings it back without removing load",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := &msParams{rps: 300, userTimeout: time.Second, userTries: 3, workers: 4, service: 10 * time.Millisecond,
				shedLimit: 1000, warmup: 2 * time.Second, outage: 2 * time.Second, after: 8 * time.Second,
				step: 250 * time.Millisecond, breakerOpen: time.Second}
			if quick {
				p.warmup, p.after = time.Second, 6*time.Second
			}
			fs.Float64Var(&p.rps, "rps", p.rps, "users' requests a second (open loop)")
			fs.DurationVar(&p.userTimeout, "user-timeout", p.userTimeout, "each user attempt gives up after this long")
			fs.IntVar(&p.userTries, "user-tries", p.userTries, "attempts per user request, sent at once after a failure (the users are not guardrail clients)")
			fs.IntVar(&p.workers, "workers", p.workers, "DB workers")
			fs.DurationVar(&p.service, "service", p.service, "time a query holds its worker")
			fs.IntVar(&p.shedLimit, "shed-limit", p.shedLimit, "the front's fixed shed limit")
			fs.DurationVar(&p.outage, "outage", p.outage, "how long the DB refuses connections")
			fs.DurationVar(&p.after, "after", p.after, "observation after the outage")
			fs.StringVar(&p.variant, "variant", "hang", "how the DB fails: hang (accepts and never answers) or refuse (refuses connections)")
			fs.BoolVar(&p.breaker, "breaker", true, "give the front a circuit breaker")
			return p
		},
	})
}

func (p *msParams) checkFlags() error {
	switch {
	case !(p.rps > 0 && p.rps <= 5000):
		return flagErrorf("metastable: --rps %v; want a value in (0, 5000]", p.rps)
	case p.userTimeout <= 0 || p.userTimeout > time.Minute:
		return flagErrorf("metastable: --user-timeout %v; want a duration in (0, 1m]", p.userTimeout)
	case p.userTries < 1 || p.userTries > 10:
		return flagErrorf("metastable: --user-tries %d; want 1 to 10", p.userTries)
	case p.workers < 1 || p.workers > 256:
		return flagErrorf("metastable: --workers %d; want 1 to 256", p.workers)
	case p.service <= 0 || p.service > time.Second:
		return flagErrorf("metastable: --service %v; want a duration in (0, 1s]", p.service)
	case p.shedLimit < 1 || p.shedLimit > 100000:
		return flagErrorf("metastable: --shed-limit %d; want 1 to 100000", p.shedLimit)
	case p.outage <= 0 || p.outage > time.Minute:
		return flagErrorf("metastable: --outage %v; want a duration in (0, 1m]", p.outage)
	case p.variant != "hang" && p.variant != "refuse":
		return flagErrorf("metastable: --variant %q; want hang or refuse", p.variant)
	case p.after < 5*time.Second || p.after > 5*time.Minute:
		return flagErrorf("metastable: --after %v; want a duration in [5s, 5m]", p.after)
	}
	return nil
}

// msRun is one configuration's run.
type msRun struct {
	relief     bool
	offered    []int64 // user requests per step, by when they were sent
	ok         []int64 // of them, answered 200 within the user's patience
	detectedAt time.Duration
	reliefOn   time.Duration // how long the actuator acted
	states     []string
	dbRan      int64
	dbLost     int64
	late       lateness
	lagP99     time.Duration
}

func (p *msParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "metastable",
		Title: fmt.Sprintf("Users (not guardrail clients: %d tries at once, %v each) at %.0f/s in front of a guarded service and a DB of %.0f queries/s that %s for %v",
			p.userTries, fmtDur(p.userTimeout), p.rps, float64(p.workers)/p.service.Seconds(), map[string]string{"hang": "hangs", "refuse": "refuses connections"}[p.variant], fmtDur(p.outage))}
	var runs []*msRun
	for _, relief := range []bool{false, true} {
		env.Progress("metastable: relief=%v", relief)
		run, err := p.scenario(ctx, relief)
		if err != nil {
			return nil, err
		}
		runs = append(runs, run)
	}
	outageEnd := p.warmup + p.outage
	tailFrom, tailTo := outageEnd+p.after-2*time.Second, outageEnd+p.after
	base, rel := runs[0], runs[1]
	for _, run := range runs {
		label := "guardrail"
		if run.relief {
			label = "guardrail + relief"
		}
		detected := Col{Key: "detected_ms", Name: "detected", Value: nil}
		if run.detectedAt >= 0 {
			detected = Ms("detected_ms", run.detectedAt-outageEnd).Named("detected")
		}
		rc := Col{Key: "recovery_ms", Name: "recovery", Value: nil}
		if rec := run.recovery(p, outageEnd); rec >= 0 {
			rc = Ms("recovery_ms", rec)
		}
		r.add(label, Str("config", label).jsonOnly(), Ms("outage_ms", p.outage).jsonOnly(), detected, rc,
			Float("goodput_last_2s_pct", run.goodput(p, tailFrom, tailTo), 1).As("goodput_last_2s", "%.1f%%"),
			Float("wasted_pct", run.wastedPct(), 1).As("db_work_wasted", "%.1f%%"),
			Ms("relief_ms", run.reliefOn).Named("relief_on"),
			Float("offered_rps", run.offeredRate(p), 0).As("offered", "%.0f/s"))
	}
	const (
		nameStuck    = "without relief the service stays down after the DB is back (metastable)"
		nameSeen     = "the detector sees the metastable state within 2s of the outage's end"
		nameRecovers = "relief brings goodput back within 5s of the outage's end, under the same offered load"
	)
	quiet := base.late.worse(rel.late)
	lag := max(base.lagP99, rel.lagP99)
	baseTail := base.goodput(p, tailFrom, tailTo)
	var why string
	switch {
	case !quiet.quiet():
		why = quiet.reason("")
	case lag > 100*time.Millisecond:
		why = fmt.Sprintf("the load generator ran %s behind its schedule (p99): the machine could not offer the load", fmtDur(lag))
	}
	switch {
	case why != "":
		for _, n := range []string{nameStuck, nameSeen, nameRecovers} {
			r.notJudged(n, "%s", why)
		}
	case baseTail >= 50:
		r.notJudged(nameStuck, "it came back on its own (goodput %.1f%% over the last 2s): this run did not tip, so relief had nothing to prove", baseTail)
		r.notJudged(nameSeen, "the run did not tip")
		r.notJudged(nameRecovers, "the run did not tip")
	default:
		r.check(true, nameStuck, "goodput %.1f%% over the last 2s of %s after the outage; %.1f%% of the DB's work was for users who had left", baseTail, fmtDur(p.after), base.wastedPct())
		seen := func(run *msRun) bool { return run.detectedAt >= 0 && run.detectedAt-outageEnd <= 2*time.Second }
		r.check(seen(base) && seen(rel), nameSeen, "metastable %s and %s after the outage's end",
			fmtOpt(base.detectedAt-outageEnd), fmtOpt(rel.detectedAt-outageEnd))
		rec := rel.recovery(p, outageEnd)
		same := math.Abs(rel.offeredRate(p)-base.offeredRate(p)) <= 0.05*base.offeredRate(p)
		r.check(rec >= 0 && rec <= 5*time.Second && same, nameRecovers, "recovered %s after the outage's end with %.0f requests/s offered (%.0f without relief); the actuator was on for %s",
			fmtOpt(rec), rel.offeredRate(p), base.offeredRate(p), fmtDur(rel.reliefOn))
	}
	r.note("The users are not guardrail clients: each tries %d times, at once after any failure, and ignores Retry-After; they never slow down. The front has a fixed shed limit of %d and a guarded client to the DB (3 attempts, retry budget%s). The DB runs every query it took, whether or not anyone still waits for it.", p.userTries, p.shedLimit, map[bool]string{true: ", breaker", false: ", no breaker"}[p.breaker])
	r.note("Relief removes none of the users' load: it empties the front's retry budget, halves its shed limit (again every window goodput is not back), drops its queue and answers a longer Retry-After; once goodput has been back for two windows it gives the limit back, a doubling a window.")
	chart := Chart{Title: "Goodput per 250 ms, the DB down for " + fmtDur(p.outage), XLabel: "s since start", YLabel: "% answered in time, by send time"}
	n := len(base.ok)
	for _, run := range runs {
		n = min(n, len(run.ok))
	}
	for k := range n {
		chart.XValues = append(chart.XValues, (time.Duration(k) * p.step).Seconds())
	}
	for _, run := range runs {
		var ys []float64
		for k := range n {
			ys = append(ys, run.pct(k))
		}
		name := "no relief"
		if run.relief {
			name = "relief"
		}
		chart.Series = append(chart.Series, Series{Name: name, Values: ys})
	}
	var band []float64
	for _, x := range chart.XValues {
		v := 0.0
		if x >= p.warmup.Seconds() && x < outageEnd.Seconds() {
			v = 100
		}
		band = append(band, v)
	}
	chart.Kind = "line"
	chart.Series = append(chart.Series, Series{Name: "DB down", Values: band, Fill: true})
	r.Charts = append(r.Charts, chart)
	return r, nil
}

// offeredRate is the users' requests a second over the run.
func (run *msRun) offeredRate(p *msParams) float64 {
	return float64(sum(run.offered)) / (time.Duration(len(run.offered)) * p.step).Seconds()
}

func (run *msRun) pct(k int) float64 {
	if run.offered[k] == 0 {
		return 100
	}
	return 100 * float64(run.ok[k]) / float64(run.offered[k])
}

func (run *msRun) goodput(p *msParams, from, to time.Duration) float64 {
	var off, ok int64
	for k := int(from / p.step); k < int(to/p.step) && k < len(run.ok); k++ {
		off += run.offered[k]
		ok += run.ok[k]
	}
	if off == 0 {
		return 0
	}
	return 100 * float64(ok) / float64(off)
}

// recovery is the time from `from` to the first step after which goodput
// stays at 90 % or more for the rest of the run's last 2 s at least; -1
// when it never does.
func (run *msRun) recovery(p *msParams, from time.Duration) time.Duration {
	hold := int(2 * time.Second / p.step)
	first := int(from / p.step)
	n := len(run.ok) - 1 // the last step may be partial
	for k := first; k+hold <= n; k++ {
		good := true
		for j := k; j < n; j++ {
			if run.pct(j) < 90 {
				good = false
				break
			}
		}
		if good {
			return time.Duration(k)*p.step - from
		}
	}
	return -1
}

func (run *msRun) wastedPct() float64 {
	if run.dbRan == 0 {
		return 0
	}
	return 100 * float64(run.dbLost) / float64(run.dbRan)
}

// scenario runs the users, the front and the DB once.
func (p *msParams) scenario(ctx context.Context, relief bool) (*msRun, error) {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	end := p.warmup + p.outage + p.after
	span := end + 2*p.userTimeout*time.Duration(p.userTries)
	start := time.Now().Add(50 * time.Millisecond)
	ip := incParams{workers: p.workers, service: p.service}
	db := &incDB{p: ip, runCtx: runCtx, in: newCounters(start, p.step, span), ran: newCounters(start, p.step, span), lost: newCounters(start, p.step, span)}
	db.cond = sync.NewCond(&db.mu)
	db.handler = db
	if err := db.listen(); err != nil {
		return nil, err
	}
	for range p.workers {
		db.workers.Go(db.work)
	}
	defer db.close()

	bud, err := budget.New(budget.Config{})
	if err != nil {
		return nil, err
	}
	sh, err := shed.New(shed.Config{Name: "front", Limit: p.shedLimit, Shares: map[shed.Priority]float64{shed.Normal: 1}})
	if err != nil {
		return nil, err
	}
	brk := noBreakers()
	if p.breaker {
		if brk, err = breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{OpenFor: p.breakerOpen, Window: 2 * time.Second}}); err != nil {
			return nil, err
		}
	}
	run := &msRun{relief: relief, detectedAt: -1}
	var reliefSince time.Time
	var reliefMu sync.Mutex
	htr := newBaseTransport(true)
	htr.DialContext = db.dial((&net.Dialer{Timeout: 30 * time.Second}).DialContext)
	health := &http.Client{Transport: htr}
	defer htr.CloseIdleConnections()
	det, err := metastable.New(metastable.Config{Name: "db", Window: 500 * time.Millisecond, Hold: 2,
		Healthy: func(ctx context.Context) error { // its own client: does not queue behind the load
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+dbHost+"/health", nil)
			if err != nil {
				return err
			}
			resp, err := health.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			return nil
		},
		Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.Metastable {
				at := time.Since(start)
				run.states = append(run.states, fmt.Sprintf("%s %s>%s", fmtDur(at), e.From, e.To))
				if e.To == "metastable" && run.detectedAt < 0 {
					run.detectedAt = at
				}
			}
			return ctx
		}),
		Relief: metastable.Relief{Act: relief, Budgets: []*budget.Budget{bud}, Shedders: []*shed.Shedder{sh},
			OnChange: func(on bool) {
				reliefMu.Lock()
				defer reliefMu.Unlock()
				if on {
					reliefSince = time.Now()
				} else if !reliefSince.IsZero() {
					run.reliefOn += time.Since(reliefSince)
					reliefSince = time.Time{}
				}
			}},
	})
	if err != nil {
		return nil, err
	}
	tr := newBaseTransport(true)
	tr.DialContext = db.dial((&net.Dialer{Timeout: 30 * time.Second}).DialContext)
	tr.MaxIdleConnsPerHost = 1024
	front := &http.Client{Transport: mustTransport(tr, guardhttp.Config{Name: "db", Observer: det,
		Retry: guardrail.Retry{Budget: bud}, Breakers: brk})}
	defer tr.CloseIdleConnections()
	srv, err := serve(sh.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, "http://"+dbHost+"/query", nil)
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		req.Header.Set(headerUserDeadline, r.Header.Get(headerUserDeadline))
		resp, err := front.Do(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
	})))
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	var detWG sync.WaitGroup
	detCtx, stopDet := context.WithCancel(runCtx)
	detWG.Go(func() { det.Run(detCtx) })
	defer func() { stopDet(); detWG.Wait() }()

	// The trigger.
	var trig sync.WaitGroup
	var trigErr error
	trig.Go(func() {
		if sleepUntil(runCtx, start.Add(p.warmup)) != nil {
			return
		}
		db.fail(p.variant)
		if sleepUntil(runCtx, start.Add(p.warmup+p.outage)) != nil {
			return
		}
		trigErr = db.recover(p.variant)
	})

	nb := int(span/p.step) + 1
	offered := make([]atomic.Int64, nb)
	okc := make([]atomic.Int64, nb)
	user := newHTTPClient(true)
	user.Transport.(*http.Transport).MaxIdleConnsPerHost = 4096
	defer user.CloseIdleConnections()
	probe := probeQuiet(runCtx)
	defer probe.stop()
	count := int(math.Ceil(end.Seconds() * p.rps))
	lags := make([]time.Duration, 0, count)
	var shots sync.WaitGroup
	for i := range count {
		due := time.Duration(float64(i) / p.rps * float64(time.Second))
		if err := sleepUntil(runCtx, start.Add(due)); err != nil {
			break
		}
		lags = append(lags, max(0, time.Since(start)-due))
		k := int(due / p.step)
		offered[k].Add(1)
		shots.Go(func() {
			t0 := time.Now()
			patience := t0.Add(p.userTimeout * time.Duration(p.userTries))
			for range p.userTries {
				actx, acancel := context.WithTimeout(runCtx, p.userTimeout)
				req, err := http.NewRequestWithContext(actx, http.MethodGet, srv.URL+"/", nil)
				if err != nil {
					acancel()
					return
				}
				req.Header.Set(headerUserDeadline, strconv.FormatInt(time.Now().Add(p.userTimeout).UnixNano(), 10))
				resp, err := user.Do(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				acancel()
				if err == nil && resp.StatusCode == http.StatusOK {
					if time.Now().Before(patience) {
						okc[k].Add(1)
					}
					return
				}
				if runCtx.Err() != nil {
					return
				}
			}
		})
	}
	shots.Wait()
	stopDet()
	detWG.Wait()
	cancel()
	trig.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if trigErr != nil {
		return nil, trigErr
	}
	run.late = probe.before(start.Add(end))
	run.lagP99 = quantile(lags, 0.99)
	used := int(end / p.step)
	for k := range used {
		run.offered = append(run.offered, offered[k].Load())
		run.ok = append(run.ok, okc[k].Load())
	}
	run.dbRan, run.dbLost = sum(db.ran.snapshot(nb)), sum(db.lost.snapshot(nb))
	return run, nil
}
