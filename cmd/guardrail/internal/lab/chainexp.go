package lab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/respond"
)

// chainParams are the chain experiment's flags.
type chainParams struct {
	tiers    int           // services, the bottom one included
	attempts int           // attempts of every tier's client
	rps      float64       // user requests per second, open loop
	warmup   time.Duration // healthy load before the outage
	after    time.Duration // observation after it
	outages  string        // the sweep
	configs  string        // naive, guarded, markers
	deadline time.Duration // the user gives up after this long
	openFor  time.Duration // the breakers' open time, scaled for the lab
	step     time.Duration // goodput bucket
	// transport is what the tiers speak: http or grpc.
	transport string
	// shed is the shedding part's; overload 0 skips it.
	shed chainShedParams
}

// The chain experiment's configurations.
const (
	chainNaive         = "naive"             // every tier retries, no budget, no breaker
	chainBudget        = "budget"            // every tier retries through guardrail with a budget, no breaker
	chainBudgetMarkers = "budget+markers"    // the same, each tier behind chain.Server
	chainGuarded       = "guardrail"         // every tier retries through guardrail: budget and breaker
	chainMarkers       = "guardrail+markers" // the same, each tier behind chain.Server
)

// chainConfigs are the configurations, in the order they are reported.
var chainConfigs = []string{chainNaive, chainBudget, chainBudgetMarkers, chainGuarded, chainMarkers}

func chainMarked(cfg string) bool { return cfg == chainBudgetMarkers || cfg == chainMarkers }

func chainExp() Experiment {
	return bound(Experiment{
		Name:    "chain",
		Summary: "every tier of a call chain retries: the bottom's calls per user request with naive retries, with guardrail, and with guardrail's chain markers",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := chainParams{tiers: 4, attempts: 3, rps: 100, warmup: 500 * time.Millisecond, after: 1500 * time.Millisecond,
				outages: "500ms,1s,2s,4s,8s", configs: strings.Join(chainConfigs, ","), deadline: 2 * time.Second,
				openFor: 300 * time.Millisecond, step: 100 * time.Millisecond, transport: "http"}
			p.shed = chainShedParams{overload: 3, slots: 20, work: 100 * time.Millisecond, dur: 3 * time.Second, users: 10_000}
			if quick {
				p.outages = "500ms,2s"
				p.shed.dur = 2 * time.Second
			}
			fs.IntVar(&p.tiers, "tiers", p.tiers, "services in the chain, the bottom one (which fails) included")
			fs.IntVar(&p.attempts, "attempts", p.attempts, "attempts of every tier's client (1 call + retries)")
			fs.Float64Var(&p.rps, "rps", p.rps, "user requests per second, open loop")
			fs.DurationVar(&p.warmup, "warmup", p.warmup, "healthy load before the outage")
			fs.DurationVar(&p.after, "after", p.after, "observation after the outage ends")
			fs.StringVar(&p.outages, "outages", p.outages, "lengths of the bottom's outage, comma-separated")
			fs.StringVar(&p.configs, "configs", p.configs, "what to run, comma-separated: naive (plain retries at every tier), budget (guardrail with a retry budget, no breaker), guardrail (budget and breaker), and either with +markers (every tier behind chain.Server)")
			fs.DurationVar(&p.deadline, "deadline", p.deadline, "the user's deadline")
			fs.DurationVar(&p.openFor, "open", p.openFor, "breaker open time (scaled down from the production default so that a run fits the lab)")
			fs.DurationVar(&p.step, "step", p.step, "goodput bucket, for the recovery time")
			fs.Float64Var(&p.shed.overload, "overload", p.shed.overload, "shedding rows: offered load over a backend's capacity (0: no shedding rows)")
			fs.IntVar(&p.shed.slots, "shed-slots", p.shed.slots, "shedding rows: a backend's concurrent requests")
			fs.DurationVar(&p.shed.work, "shed-work", p.shed.work, "shedding rows: a backend's time per request")
			fs.DurationVar(&p.shed.dur, "shed-for", p.shed.dur, "shedding rows: how long each runs")
			fs.IntVar(&p.shed.users, "users", p.shed.users, "shedding rows: distinct users, whose keys give the cohorts")
			fs.StringVar(&p.transport, "transport", p.transport, "what the tiers speak: http (net/http servers, guardhttp clients) or grpc (gRPC servers, guardgrpc clients and interceptors)")
			return &p
		},
	})
}

// Bounds of the chain experiment's flags.
const (
	chainMaxTiers = 6
	// chainMaxCalls bounds attempts^(tiers-1), the bottom's calls for one
	// user request when every tier retries.
	chainMaxCalls = 10_000
	// chainMaxRPS bounds the user load: the naive rows multiply it.
	chainMaxRPS = 1000
)

func (p chainParams) checkFlags() error {
	var c flagCheck
	notAbove(&c, "tiers", p.tiers, closed(2, chainMaxTiers))
	notAbove(&c, "attempts", p.attempts, closed(1, maxAttemptsFlag))
	if p.tiers >= 2 && p.tiers <= chainMaxTiers && p.attempts >= 1 && p.attempts <= maxAttemptsFlag {
		if calls := pow(p.attempts, p.tiers-1); calls > chainMaxCalls {
			c.failf("--attempts ^ (--tiers - 1) is %.0f bottom calls for one user request; want at most %d", calls, chainMaxCalls)
		}
	}
	within(&c, "rps", p.rps, above(0, float64(chainMaxRPS)))
	within(&c, "warmup", p.warmup, closed(0, maxRun))
	within(&c, "after", p.after, above(0, maxRun))
	within(&c, "deadline", p.deadline, above(0, maxRun))
	within(&c, "open", p.openFor, above(0, maxRun))
	within(&c, "step", p.step, above(time.Millisecond, maxRun))
	outs, _, err := p.plan()
	if err != nil {
		c.failf("%v", err)
	}
	if p.transport != "http" && p.transport != "grpc" {
		c.failf("--transport must be http or grpc, not %q", p.transport)
	}
	within(&c, "overload", p.shed.overload, closed(0, 20.0))
	notAbove(&c, "shed-slots", p.shed.slots, closed(1, 1000))
	within(&c, "shed-work", p.shed.work, above(time.Millisecond, maxWait))
	within(&c, "shed-for", p.shed.dur, above(0, maxRun))
	notAbove(&c, "users", p.shed.users, closed(1, 10_000_000))
	if p.shed.overload > 0 && p.shed.slots >= 1 && p.shed.work > time.Millisecond && p.shed.work <= maxWait {
		if rps := p.shed.overload * p.shed.capacity(); rps > chainMaxRPS {
			c.failf("--overload x --shed-slots / --shed-work is %.0f requests per second; want at most %d", rps, chainMaxRPS)
		}
	}
	// Each outage runs warmup + outage + after, one after the other.
	var total time.Duration
	for _, out := range outs {
		total = addSat(total, addSat(addSat(p.warmup, out), p.after))
	}
	if total > maxRun {
		c.failf("--warmup, --outages and --after add up to %v of runs; want at most %v", total, maxRun)
	}
	return c.err()
}

// plan parses the sweep and the configurations.
func (p chainParams) plan() ([]time.Duration, []string, error) {
	for _, l := range []struct{ name, v string }{{"outages", p.outages}, {"configs", p.configs}} {
		if err := checkList(l.name, l.v); err != nil {
			return nil, nil, err
		}
	}
	var outs []time.Duration
	for part := range strings.SplitSeq(p.outages, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d <= 0 || d > maxRun {
			return nil, nil, fmt.Errorf("--outages: %q is not a duration in (0, %v]", part, maxRun)
		}
		outs = append(outs, d)
	}
	slices.Sort(outs)
	outs = slices.Compact(outs)
	var configs []string
	for part := range strings.SplitSeq(p.configs, ",") {
		c := strings.TrimSpace(part)
		if !slices.Contains(chainConfigs, c) {
			return nil, nil, fmt.Errorf("--configs: %q is none of %s", part, strings.Join(chainConfigs, ", "))
		}
		if !slices.Contains(configs, c) {
			configs = append(configs, c)
		}
	}
	return outs, configs, nil
}

// chainRun is what one run of one configuration measured.
type chainRun struct {
	offered, ok []int64 // user requests sent and answered 200, by send bucket
	outUsers    int64   // user requests sent during the outage
	outBottom   int64   // calls that reached the bottom during the outage
	outTiers    int64   // calls that reached any tier during the outage, the bottom included
	sched       schedule
}

// Targets of the chain experiment.
const (
	// chainMaxPerRequest is the most bottom calls per user request the
	// markers may let through during an outage.
	chainMaxPerRequest = 1.3
	// chainRecoveryTarget is how soon after the outage's end the users'
	// requests must succeed again.
	chainRecoveryTarget = time.Second
	// chainRecoveredFrac is the share of a bucket's requests that must
	// succeed for it to count as recovered.
	chainRecoveredFrac = 0.95
	// chainMinNaiveOutage is the shortest outage the naive floor is
	// judged on: in a shorter one, the retries of the requests sent in it
	// mostly land after it.
	chainMinNaiveOutage = 500 * time.Millisecond
	// chainNaiveShare is the fraction of the load the naive rows run at.
	chainNaiveShare = 4
)

func (p chainParams) run(ctx context.Context, env *Env) (*Result, error) {
	outs, configs, err := p.plan()
	if err != nil {
		return nil, err
	}
	r := &Result{Experiment: "chain", Title: fmt.Sprintf("%d tiers that all retry (%d attempts) in front of a bottom that fails: what reaches the bottom", p.tiers, p.attempts)}
	if p.transport == "grpc" {
		r.Title += ", over gRPC"
	}
	naiveWant := pow(p.attempts, p.tiers-1)
	var labels []string
	perCfg := map[string][]float64{}
	for i, out := range outs {
		env.Progress("chain: outage %d/%d: %v, %s at once", i+1, len(outs), out, strings.Join(configs, ", "))
		probe := probeQuiet(ctx)
		runs := make([]*chainRun, len(configs))
		errs := make([]error, len(configs))
		var wg sync.WaitGroup
		for k, cfg := range configs {
			rps := p.rps
			if cfg == chainNaive {
				// Its counts do not depend on the load, and at full load
				// its multiplied calls would take the CPU the others'
				// timings need.
				rps /= chainNaiveShare
			}
			wg.Go(func() { runs[k], errs[k] = p.runOne(ctx, cfg, out, rps) })
		}
		wg.Wait()
		quiet := probe.stop()
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
		labels = append(labels, fmtDur(out))
		for k, cfg := range configs {
			res := runs[k]
			per, all := 0.0, 0.0
			if res.outUsers > 0 {
				per = float64(res.outBottom) / float64(res.outUsers)
				all = float64(res.outTiers) / float64(res.outUsers)
			}
			rec, recovered := res.recovery(p, out)
			good := res.goodput()
			recCol := Ms("recovery_ms", rec).As("recovery", "ms")
			if !recovered {
				recCol = Str("recovery_ms", "never").Named("recovery")
			}
			r.add(fmt.Sprintf("%s, outage %s", cfg, fmtDur(out)),
				Str("transport", p.transport).jsonOnly(), Str("config", cfg).jsonOnly(), Ms("outage_ms", out).As("outage", "ms"),
				Float("bottom_calls_per_request", per, 2).Named("bottom/request"),
				Float("chain_calls_per_request", all, 2).Named("all tiers/request"),
				recCol, Float("goodput_pct", good, 1).Named("goodput %"))
			perCfg[cfg] = append(perCfg[cfg], per)

			switch cfg {
			case chainNaive:
				// A floor on a count that a slow machine lowers: the
				// user's deadline then cuts the retries short.
				name := "naive retries multiply at every tier"
				switch {
				case out < chainMinNaiveOutage:
					r.notJudged(name, "%s: %.2f bottom calls per request; an outage shorter than %v ends before most requests sent in it have made their retries",
						fmtDur(out), per, chainMinNaiveOutage)
				case !res.sched.kept():
					r.notJudged(name, "%s: %.2f bottom calls per request; %s", fmtDur(out), per, res.sched.reason())
				case !quiet.quiet():
					r.notJudged(name, "%s: %.2f bottom calls per request; %s", fmtDur(out), per, quiet.reason(""))
				default:
					r.check(per >= naiveWant/2, name,
						"%s: %.2f bottom calls per request, want about %d^%d = %.0f (at least half)", fmtDur(out), per, p.attempts, p.tiers-1, naiveWant)
				}
			case chainMarkers:
				// The target, or for an outage too short to spread the
				// budget's initial tokens over enough requests, the
				// budget's own bound.
				bound := max(chainMaxPerRequest, budgetBound(res.outUsers))
				r.check(per <= bound, "the markers keep the bottom near one call per request",
					"%s: %.2f bottom calls per request, want at most %.2f", fmtDur(out), per, bound)
			case chainBudgetMarkers:
				// Only the tier next to the bottom retries, within its
				// budget: its ratio, and its initial tokens spread over
				// the outage's requests.
				bound := budgetBound(res.outUsers)
				r.check(per <= bound, "with the markers only the tier next to the failure retries",
					"%s: %.2f bottom calls per request, want at most %.2f (1 + the budget's ratio and initial tokens, +0.05)", fmtDur(out), per, bound)
			}
			if cfg == chainNaive {
				continue
			}
			name := "recovery within 1 s of the outage's end"
			switch {
			case !res.sched.kept():
				r.notJudged(name, "%s, %s: %s", cfg, fmtDur(out), res.sched.reason())
			case !quiet.quiet():
				r.notJudged(name, "%s, %s: %s", cfg, fmtDur(out), quiet.reason(""))
			default:
				r.check(recovered && rec <= chainRecoveryTarget, name, "%s, %s: recovered after %s, want at most %v", cfg, fmtDur(out), recText(rec, recovered), chainRecoveryTarget)
			}
		}
	}
	if p.shed.overload > 0 {
		if err := p.runShedding(ctx, env, r); err != nil {
			return nil, err
		}
	}
	var series []Series
	for _, cfg := range configs {
		series = append(series, Series{Name: cfg, Values: perCfg[cfg]})
	}
	r.Charts = append(r.Charts, Chart{Title: "Bottom calls per user request during the outage (log scale)", Kind: "bar", X: labels,
		YLabel: "bottom calls per user request", LogY: true, Series: series})
	r.note("naive: every tier retries %d times, no budget, no breaker; budget: every tier a guardrail client (guardhttp, or guardgrpc over gRPC) with its default retry budget, no breaker;", p.attempts)
	r.note("guardrail: budget and a breaker (open %v, scaled down for the lab); +markers: every tier behind chain.Server, so an answer produced after retries is not retried above.", p.openFor)
	r.note("bottom calls per request = calls that reached the bottom during the outage / user requests sent during it; all tiers counts the calls every tier received.")
	r.note("The configurations run at once, each on its own servers; naive at 1/%d of the load (%.0f rps), since its counts do not depend on it.", chainNaiveShare, p.rps/chainNaiveShare)
	return r, nil
}

// budgetBound is the most bottom calls per request one retrying tier's
// default budget allows over an outage in which users requests were
// sent: 1, its ratio, and its initial tokens spread over them, +0.05.
func budgetBound(users int64) float64 {
	return 1 + budget.DefaultRatio + float64(budget.DefaultMax)/float64(max(users, 1)) + 0.05
}

func recText(d time.Duration, ok bool) string {
	if !ok {
		return "never"
	}
	return fmtDur(d)
}

// goodput is the share of user requests answered 200, in percent.
func (res *chainRun) goodput() float64 {
	off, ok := sum(res.offered), sum(res.ok)
	if off == 0 {
		return 0
	}
	return 100 * float64(ok) / float64(off)
}

// recovery returns how long after the outage's end the users' requests
// succeeded again: the start of the first bucket from which every bucket
// that was offered requests saw at least chainRecoveredFrac succeed, less
// the outage's end. It reports false if that never happened.
func (res *chainRun) recovery(p chainParams, out time.Duration) (time.Duration, bool) {
	end := p.warmup + out
	first := int(end / p.step)
	for k := first; k < len(res.offered); k++ {
		good := true
		for j := k; j < len(res.offered); j++ {
			if res.offered[j] > 0 && float64(res.ok[j]) < chainRecoveredFrac*float64(res.offered[j]) {
				good = false
				break
			}
		}
		if good {
			return max(0, time.Duration(k)*p.step-end), true
		}
	}
	return 0, false
}

// chainProbe is what a chain's servers share with the run: whether the
// bottom is down now, and the calls they saw during the outage.
type chainProbe struct {
	start               atomic.Pointer[time.Time]
	warmup, out         time.Duration
	outBottom, outTiers atomic.Int64
}

// down reports whether the bottom is down now.
func (c *chainProbe) down() bool {
	t0 := c.start.Load()
	if t0 == nil {
		return false
	}
	since := time.Since(*t0)
	return since >= c.warmup && since < c.warmup+c.out
}

// tierSaw counts a call a tier above the bottom received.
func (c *chainProbe) tierSaw() {
	if c.down() {
		c.outTiers.Add(1)
	}
}

// bottomFails counts a call the bottom received and reports whether it
// fails it.
func (c *chainProbe) bottomFails() bool {
	if !c.down() {
		return false
	}
	c.outBottom.Add(1)
	c.outTiers.Add(1)
	return true
}

// runOne builds the chain for cfg on loopback, offers the users' load
// with the bottom down for out after the warm-up, and returns what it
// measured.
func (p chainParams) runOne(ctx context.Context, cfg string, out time.Duration, rps float64) (*chainRun, error) {
	total := p.warmup + out + p.after
	buckets := int(total/p.step) + 1
	res := &chainRun{offered: make([]int64, buckets), ok: make([]int64, buckets)}
	probe := &chainProbe{warmup: p.warmup, out: out}
	build := p.httpChain
	if p.transport == "grpc" {
		build = p.grpcChain
	}
	call, closeAll, err := build(cfg, probe)
	if closeAll != nil {
		defer closeAll()
	}
	if err != nil {
		return nil, err
	}

	n := int(rps * total.Seconds())
	var wg sync.WaitGroup
	lags := make([]time.Duration, 0, n)
	t0 := time.Now()
	probe.start.Store(&t0)
	for u := range n {
		at := t0.Add(time.Duration(float64(u) / rps * float64(time.Second)))
		if err := sleepUntil(ctx, at); err != nil {
			wg.Wait()
			return nil, err
		}
		sent := time.Since(t0)
		lags = append(lags, max(0, sent-at.Sub(t0)))
		k := min(int(sent/p.step), buckets-1)
		atomic.AddInt64(&res.offered[k], 1)
		if sent >= p.warmup && sent < p.warmup+out {
			res.outUsers++
		}
		wg.Go(func() {
			uctx, cancel := context.WithTimeout(ctx, p.deadline)
			defer cancel()
			if call(uctx) == nil {
				atomic.AddInt64(&res.ok[k], 1)
			}
		})
	}
	elapsed := time.Since(t0)
	wg.Wait()
	res.outBottom, res.outTiers = probe.outBottom.Load(), probe.outTiers.Load()
	slices.Sort(lags)
	res.sched = schedule{run: cfg, rate: float64(n) / max(elapsed.Seconds(), 1e-9), want: rps,
		lagP99: lags[min(len(lags)-1, len(lags)*99/100)], maxLag: 50 * time.Millisecond}
	return res, ctx.Err()
}

// httpChain builds the chain over HTTP: the bottom, then the tiers above
// it, each calling the next through a guardhttp client. It returns the
// user's call to the top, and what closes the servers.
func (p chainParams) httpChain(cfg string, probe *chainProbe) (func(context.Context) error, func(), error) {
	var servers []*server
	closeAll := func() {
		for _, s := range servers {
			s.Close()
		}
	}
	bottom, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if probe.bottomFails() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	if err != nil {
		return nil, closeAll, err
	}
	servers = append(servers, bottom)
	next := bottom.URL + "/"
	for i := 1; i < p.tiers; i++ {
		hc := p.tierConfig(cfg, i)
		client := &http.Client{Transport: mustTransport(newBaseTransport(true), guardhttp.Config{Name: hc.Name, Retry: hc.Retry, Breakers: hc.Breakers})}
		target := next
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			probe.tierSaw()
			code, err := get(r.Context(), client, target)
			switch {
			case err == nil:
				_, _ = w.Write([]byte("ok"))
			case code != 0:
				w.WriteHeader(http.StatusServiceUnavailable) // downstream answered a failure
			default:
				respond.Error(w, err)
			}
		})
		if chainMarked(cfg) {
			cs, err := chain.New(chain.Config{Name: hc.Name})
			if err != nil {
				return nil, closeAll, err
			}
			h = cs.Middleware(h)
		}
		s, err := serve(h)
		if err != nil {
			return nil, closeAll, err
		}
		servers = append(servers, s)
		next = s.URL + "/"
	}
	user := newHTTPClient(true)
	return func(ctx context.Context) error {
		_, err := get(ctx, user, next)
		return err
	}, closeAll, nil
}

// chainHealth is a tier of the gRPC chain: its Check calls the next
// tier's; the bottom's (next nil) fails during the outage.
type chainHealth struct {
	healthpb.UnimplementedHealthServer
	next  healthpb.HealthClient
	probe *chainProbe
}

func (h *chainHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.next == nil {
		if h.probe.bottomFails() {
			return nil, status.Error(codes.Unavailable, "down")
		}
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	h.probe.tierSaw()
	if _, err := h.next.Check(ctx, req); err != nil {
		return nil, status.Error(codes.Unavailable, "downstream failed")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// grpcChain is httpChain over gRPC: guardgrpc clients, and for the marked
// configurations guardgrpc servers with the chain's Server.
func (p chainParams) grpcChain(cfg string, probe *chainProbe) (func(context.Context) error, func(), error) {
	var closers []func()
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	bottom, err := serveGRPC(&chainHealth{probe: probe})
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, bottom.Close)
	next := bottom.Addr
	for i := 1; i < p.tiers; i++ {
		tc := p.tierConfig(cfg, i)
		client, err := guardgrpc.NewClient(guardgrpc.ClientConfig{Name: tc.Name, Retry: tc.Retry, Breakers: tc.Breakers, IdempotentMethods: []string{ampGRPCService}})
		if err != nil {
			return nil, closeAll, err
		}
		cc, err := dialGRPC(next, client.DialOptions()...)
		if err != nil {
			return nil, closeAll, err
		}
		closers = append(closers, func() { _ = cc.Close() })
		var opts []grpc.ServerOption
		if chainMarked(cfg) {
			cs, err := chain.New(chain.Config{Name: tc.Name})
			if err != nil {
				return nil, closeAll, err
			}
			gs, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Chain: cs, MaxTimeout: -1})
			if err != nil {
				return nil, closeAll, err
			}
			opts = gs.ServerOptions()
		}
		s, err := serveGRPC(&chainHealth{next: healthpb.NewHealthClient(cc), probe: probe}, opts...)
		if err != nil {
			return nil, closeAll, err
		}
		closers = append(closers, s.Close)
		next = s.Addr
	}
	userConn, err := dialGRPC(next, grpc.WithDisableRetry())
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, func() { _ = userConn.Close() })
	user := healthpb.NewHealthClient(userConn)
	return func(ctx context.Context) error {
		_, err := user.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}, closeAll, nil
}

// chainTier is a tier's client settings, whatever its transport.
type chainTier struct {
	Name     string
	Retry    guardrail.Retry
	Breakers *breaker.Group
}

// tierConfig is the client of tier i (1 is next to the bottom) under cfg.
func (p chainParams) tierConfig(cfg string, i int) chainTier {
	c := chainTier{
		Name: fmt.Sprintf("tier%d", i),
		Retry: guardrail.Retry{
			MaxAttempts: p.attempts,
			Backoff:     backoff.FullJitter(5*time.Millisecond, 100*time.Millisecond),
		},
	}
	switch cfg {
	case chainNaive:
		c.Retry.Budget = budget.Unlimited()
		c.Breakers = noBreakers()
		return c
	case chainBudget, chainBudgetMarkers:
		c.Breakers = noBreakers()
		return c
	}
	g, err := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{OpenFor: p.openFor, MaxOpenFor: p.openFor, Window: 2 * p.openFor}})
	if err != nil {
		panic("lab: " + err.Error()) // the flags were checked
	}
	c.Breakers = g
	return c
}
