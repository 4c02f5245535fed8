package lab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/shed"
)

// incParams are the incident experiment's flags. Every time constant is
// real time: nothing is scaled but the breaker's open time and window
// (production defaults of 30 s and 10 s would not fit a lab run), both by
// the same factor.
type incParams struct {
	rps          float64       // offered load, open loop
	workers      int           // DB worker pool
	service      time.Duration // time a query holds its worker
	userDeadline time.Duration // the user gives up after this long
	warmup       time.Duration // steady load before the trigger
	after        time.Duration // longest observation after the trigger
	outages      string        // the trigger sweep
	maxOutage    time.Duration // the sweep doubles up to this while naive has not tipped
	variants     string        // refuse, hang
	pool         int           // connections per host at each tier
	step         time.Duration // goodput bucket

	// naive
	naiveAttempts int
	naiveBackoff  time.Duration // first retry delay, doubling
	naiveJitter   time.Duration // plus a uniform 0..jitter
	bffTimeout    time.Duration
	svcTimeout    time.Duration
	dbTimeout     time.Duration
	naiveCancel   bool

	// guarded
	attempts       int
	attemptTimeout time.Duration
	budgetRatio    float64
	breakerOpen    time.Duration
	breakerWindow  time.Duration
	breakerMin     int
	dbShedLimit    int
	bffShedLimit   int

	// the proof that it is metastable
	reliefAfter time.Duration // how long after the trigger the load drops
	reliefFor   time.Duration
	reliefRate  float64 // fraction of rps during the relief

	// targets
	configs  string // naive, guarded
	timeline bool   // print every run's buckets
	repeats  int    // naive runs near the threshold, best of

	recoverFrac    float64
	holdFor        time.Duration
	recoveryTarget time.Duration
}

func incident() Experiment {
	return bound(Experiment{
		Name:    "incident",
		Summary: "a DB failover under retries at every tier stays an outage after the DB is back (metastable); guardrail makes it a short dip",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := incParams{rps: 300, workers: 10, service: 20 * time.Millisecond, userDeadline: time.Second,
				warmup: 500 * time.Millisecond, after: 2500 * time.Millisecond, outages: "500ms,1s,2s,4s", maxOutage: 8 * time.Second,
				variants: "refuse,hang", pool: 1024, step: 100 * time.Millisecond,
				naiveAttempts: 4, naiveBackoff: 100 * time.Millisecond, naiveJitter: 100 * time.Millisecond,
				bffTimeout: 2 * time.Second, svcTimeout: 5 * time.Second, dbTimeout: 30 * time.Second,
				attempts: 3, attemptTimeout: 250 * time.Millisecond, budgetRatio: 0.1,
				breakerOpen: 300 * time.Millisecond, breakerWindow: time.Second, breakerMin: 20,
				dbShedLimit: 20, bffShedLimit: 100,
				reliefAfter: time.Second, reliefFor: 10 * time.Second, reliefRate: 0,
				configs: "naive,guarded", repeats: 3, recoverFrac: 0.9, holdFor: time.Second, recoveryTarget: time.Second}
			if quick {
				// One outage past the threshold, the refused variant only (the
				// failover of the incident), and shorter observations: what
				// is left is the outage, the hold that confirms a recovery,
				// and the proof.
				p.outages, p.maxOutage, p.variants, p.after, p.repeats = "2s", 2*time.Second, "refuse", 1500*time.Millisecond, 1
			}
			fs.Float64Var(&p.rps, "rps", p.rps, "offered load, user requests per second, sent open-loop (keep it under the DB's capacity, workers / service)")
			fs.IntVar(&p.workers, "workers", p.workers, "DB worker pool: queries run at once")
			fs.DurationVar(&p.service, "service", p.service, "time a query holds its worker")
			fs.DurationVar(&p.userDeadline, "user-deadline", p.userDeadline, "each user gives up after this long; goodput counts answers within it")
			fs.DurationVar(&p.warmup, "warmup", p.warmup, "steady load before the trigger")
			fs.DurationVar(&p.after, "after", p.after, "longest observation after the trigger ends (a run stops earlier once its outcome is settled)")
			fs.StringVar(&p.outages, "outages", p.outages, "DB outage lengths of the sweep, comma-separated")
			fs.DurationVar(&p.maxOutage, "max-outage", p.maxOutage, "while the naive system has not tipped over, the sweep doubles its longest outage up to this")
			fs.StringVar(&p.variants, "variants", p.variants, "how the DB is down: refuse (nothing listens), hang (connections accepted, never answered), comma-separated")
			fs.IntVar(&p.pool, "pool", p.pool, "connections per host in each tier's client pool")
			fs.DurationVar(&p.step, "step", p.step, "goodput bucket")
			fs.IntVar(&p.naiveAttempts, "naive-attempts", p.naiveAttempts, "naive: attempts per call at every tier (1 call + retries)")
			fs.DurationVar(&p.naiveBackoff, "naive-backoff", p.naiveBackoff, "naive: first retry delay, doubled on each retry")
			fs.DurationVar(&p.naiveJitter, "naive-jitter", p.naiveJitter, "naive: a uniform 0..this added to each delay")
			fs.DurationVar(&p.bffTimeout, "bff-timeout", p.bffTimeout, "naive: BFF's timeout per call to order; guarded: BFF's deadline cap")
			fs.DurationVar(&p.svcTimeout, "service-timeout", p.svcTimeout, "naive: order's and data's timeout per call downstream; guarded: their deadline cap")
			fs.DurationVar(&p.dbTimeout, "db-timeout", p.dbTimeout, "naive: data's timeout per DB call; guarded: the DB's deadline cap")
			fs.BoolVar(&p.naiveCancel, "naive-cancel", p.naiveCancel, "naive: a tier stops calling downstream when its own caller hangs up (off: its retry helper runs on a context of its own, as http.Get does)")
			fs.IntVar(&p.attempts, "guarded-attempts", p.attempts, "guarded: attempts per DB call at data, the one tier that retries")
			fs.DurationVar(&p.attemptTimeout, "guarded-attempt-timeout", p.attemptTimeout, "guarded: data's timeout per DB attempt")
			fs.Float64Var(&p.budgetRatio, "budget", p.budgetRatio, "guarded: retry budget ratio at data")
			fs.DurationVar(&p.breakerOpen, "breaker-open", p.breakerOpen, "guarded: breaker open time (the 30 s default scaled down: it bounds the recovery)")
			fs.DurationVar(&p.breakerWindow, "breaker-window", p.breakerWindow, "guarded: breaker window (the 10 s default scaled down)")
			fs.IntVar(&p.breakerMin, "breaker-min", p.breakerMin, "guarded: calls in the window before the breaker may trip")
			fs.IntVar(&p.dbShedLimit, "db-shed-limit", p.dbShedLimit, "guarded: requests in flight at the DB before it sheds")
			fs.IntVar(&p.bffShedLimit, "bff-shed-limit", p.bffShedLimit, "guarded: requests in flight at the BFF before it sheds")
			fs.DurationVar(&p.reliefAfter, "relief-after", p.reliefAfter, "metastability proof: how long after the trigger the offered load drops")
			fs.DurationVar(&p.reliefFor, "relief-for", p.reliefFor, "metastability proof: the load stays dropped until the system has no backlog, for this long at most")
			fs.Float64Var(&p.reliefRate, "relief-rate", p.reliefRate, "metastability proof: the offered load meanwhile, as a fraction of --rps")
			fs.StringVar(&p.configs, "configs", p.configs, "configurations to run: naive, guarded, comma-separated")
			fs.IntVar(&p.repeats, "repeats", p.repeats, "run the naive system up to this many times at the outages on both sides of its threshold, and take the majority (1: once)")
			fs.BoolVar(&p.timeline, "timeline", p.timeline, "print every run's goodput and DB load per --step under the table")
			fs.Float64Var(&p.recoverFrac, "recover-at", p.recoverFrac, "recovered once goodput reaches this fraction of the offered load")
			fs.DurationVar(&p.holdFor, "hold", p.holdFor, "... and stays there this long")
			fs.DurationVar(&p.recoveryTarget, "recovery-target", p.recoveryTarget, "guarded must recover within this")
			return &p
		},
	})
}

func (p incParams) capacity() float64 { return float64(p.workers) / p.service.Seconds() }

// Bounds of the incident experiment's flags.
const (
	// incMaxRPS is where one process stops keeping an open-loop load of
	// three tiers on schedule.
	incMaxRPS = 5000
	// incMaxOutage bounds an outage of the sweep, and --max-outage.
	incMaxOutage = 10 * time.Minute
)

// checkFlags is validate without the plan.
func (p incParams) checkFlags() error {
	_, err := p.validate()
	return err
}

// validate reports every flag the experiment cannot run with, or returns
// what they ask to run.
func (p incParams) validate() (incPlan, error) {
	var c flagCheck
	bad := func(format string, args ...any) { c.failf(format, args...) }
	if !(p.rps > 0) || p.rps > incMaxRPS {
		bad("--rps is %g; want a value in (0, %d]", p.rps, incMaxRPS)
	}
	if p.workers < 1 {
		bad("--workers is %d; want at least 1", p.workers)
	}
	notAbove(&c, "workers", p.workers, closed(1, maxConcurrency))
	if p.service <= 0 || p.userDeadline <= 0 || p.after <= 0 || p.step <= 0 || p.warmup < 0 {
		bad("--service, --user-deadline, --after and --step must be positive, --warmup not negative")
	}
	notAbove(&c, "service", p.service, above(0, maxWait))
	notAbove(&c, "user-deadline", p.userDeadline, above(0, maxWait))
	notAbove(&c, "after", p.after, above(0, maxRun))
	notAbove(&c, "warmup", p.warmup, closed(0, maxRun))
	if p.step > p.after || p.step > time.Second {
		bad("--step is %v; want at most 1s and at most --after", p.step)
	}
	if p.repeats < 1 || p.repeats > incMaxRepeats {
		bad("--repeats is %d; want 1 to %d", p.repeats, incMaxRepeats)
	}
	if p.rps > 0 && p.step > 0 && p.rps*p.step.Seconds() < 5 {
		bad("--rps x --step is %.1f requests per bucket; want at least 5", p.rps*p.step.Seconds())
	}
	if p.pool < 1 {
		bad("--pool is %d; want at least 1", p.pool)
	}
	notAbove(&c, "pool", p.pool, closed(1, maxConcurrency))
	if p.naiveAttempts < 1 || p.attempts < 1 {
		bad("--naive-attempts and --guarded-attempts must be at least 1")
	}
	notAbove(&c, "naive-attempts", p.naiveAttempts, closed(1, maxAttemptsFlag))
	notAbove(&c, "guarded-attempts", p.attempts, closed(1, maxAttemptsFlag))
	if p.naiveBackoff < 0 || p.naiveJitter < 0 {
		bad("--naive-backoff and --naive-jitter must not be negative")
	}
	notAbove(&c, "naive-backoff", p.naiveBackoff, closed(0, maxWait))
	notAbove(&c, "naive-jitter", p.naiveJitter, closed(0, maxWait))
	if p.bffTimeout <= 0 || p.svcTimeout <= 0 || p.dbTimeout <= 0 || p.attemptTimeout <= 0 {
		bad("--bff-timeout, --service-timeout, --db-timeout and --guarded-attempt-timeout must be positive")
	}
	notAbove(&c, "bff-timeout", p.bffTimeout, above(0, maxWait))
	notAbove(&c, "service-timeout", p.svcTimeout, above(0, maxWait))
	notAbove(&c, "db-timeout", p.dbTimeout, above(0, maxWait))
	notAbove(&c, "guarded-attempt-timeout", p.attemptTimeout, above(0, maxWait))
	if !(p.budgetRatio > 0) || p.budgetRatio > 1000 {
		bad("--budget is %g; want a value in (0, 1000]", p.budgetRatio)
	}
	if p.breakerOpen <= 0 || p.breakerWindow <= 0 || p.breakerMin < 1 {
		bad("--breaker-open and --breaker-window must be positive, --breaker-min at least 1")
	}
	notAbove(&c, "breaker-open", p.breakerOpen, above(0, maxWait))
	notAbove(&c, "breaker-window", p.breakerWindow, above(0, maxWait))
	notAbove(&c, "breaker-min", p.breakerMin, closed(1, maxRequests))
	if p.dbShedLimit < 1 || p.bffShedLimit < 1 {
		bad("--db-shed-limit and --bff-shed-limit must be at least 1")
	}
	notAbove(&c, "db-shed-limit", p.dbShedLimit, closed(1, maxConcurrency))
	notAbove(&c, "bff-shed-limit", p.bffShedLimit, closed(1, maxConcurrency))
	if p.reliefAfter < 0 || p.reliefFor <= 0 || !(p.reliefRate >= 0 && p.reliefRate < 1) {
		bad("--relief-after must not be negative, --relief-for positive, --relief-rate in [0, 1)")
	}
	notAbove(&c, "relief-after", p.reliefAfter, closed(0, maxRun))
	notAbove(&c, "relief-for", p.reliefFor, above(0, maxRun))
	if !(p.recoverFrac > 0) || p.recoverFrac > 1 || p.holdFor < p.step || p.recoveryTarget <= 0 {
		bad("--recover-at must be in (0, 1], --hold at least --step, --recovery-target positive")
	}
	notAbove(&c, "hold", p.holdFor, closed(p.step, maxRun))
	notAbove(&c, "recovery-target", p.recoveryTarget, above(0, maxRun))
	within(&c, "max-outage", p.maxOutage, closed(0, incMaxOutage))
	if len(c.msgs) > 0 {
		return incPlan{}, c.err()
	}
	plan, err := p.parsePlan()
	if err != nil {
		return incPlan{}, err
	}
	// The longest run: a load dropped after the longest outage the sweep
	// can reach. Each term is at most an hour; their sum fits an int64,
	// and its load is allocated a schedule entry per request.
	longest := max(plan.outages[len(plan.outages)-1], p.maxOutage)
	_, _, _, end := p.schedule(true, longest, true)
	if end > maxRun {
		return incPlan{}, flagErrorf("--warmup, the longest outage, --relief-after, --relief-for and max(--after, --recovery-target + --hold + --step) add up to %v for the longest run; want at most %v", end, maxRun)
	}
	return plan, nil
}

// parsePlan parses the sweep's lists.
func (p incParams) parsePlan() (incPlan, error) {
	bad := func(format string, args ...any) (incPlan, error) {
		return incPlan{}, flagErrorf(format, args...)
	}
	for _, l := range []struct{ name, v string }{{"outages", p.outages}, {"variants", p.variants}, {"configs", p.configs}} {
		if err := checkList(l.name, l.v); err != nil {
			return incPlan{}, err
		}
	}
	var outs []time.Duration
	for part := range strings.SplitSeq(p.outages, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(part))
		if err != nil || d <= 0 || d > incMaxOutage {
			return bad("--outages: %q is not a duration in (0, 10m]", part)
		}
		outs = append(outs, d)
	}
	slices.Sort(outs)
	outs = slices.Compact(outs)
	var variants []string
	for part := range strings.SplitSeq(p.variants, ",") {
		v := strings.TrimSpace(part)
		if v != "refuse" && v != "hang" {
			return bad("--variants: %q is neither refuse nor hang", part)
		}
		if !slices.Contains(variants, v) {
			variants = append(variants, v)
		}
	}
	naive, guarded := false, false
	for part := range strings.SplitSeq(p.configs, ",") {
		switch strings.TrimSpace(part) {
		case "naive":
			naive = true
		case "guarded":
			guarded = true
		default:
			return bad("--configs: %q is neither naive nor guarded", part)
		}
	}
	return incPlan{outs, variants, naive, guarded}, nil
}

// incPlan is what the flags ask to run.
type incPlan struct {
	outages        []time.Duration
	variants       []string
	naive, guarded bool
}

// incRow is one run's outcome.
type incRow struct {
	variant  string
	guarded  bool
	outage   time.Duration
	relief   bool
	res      *incRun
	recovery time.Duration // -1: never before the run ended
	degraded time.Duration // -1: until the run ended
	tipped   bool          // naive: degraded for 5x the outage or until the run ended
	measured bool          // the load kept its schedule where it mattered, on a machine quiet enough to time it
}

func (row incRow) config() string {
	if row.guarded {
		return "guarded"
	}
	return "naive"
}

func (row incRow) label() string {
	l := fmt.Sprintf("%s %s %s", row.config(), row.variant, fmtSec(row.outage))
	if row.relief {
		l += " + load dropped"
	}
	return l
}

// name is the row's label, as notes and checks cite it.
func (row incRow) name() string { return row.label() }

func fmtSec(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }

// incTries is how many times a guarded run is made at most while its load
// generator falls behind its schedule.
const incTries = 2

// incParallel is how many guarded runs are made at once.
const incParallel = 2

// incMaxRepeats bounds --repeats.
const incMaxRepeats = 9

// tipCount counts the naive runs at one outage, and those that tipped over.
type tipCount struct{ tipped, runs int }

// decided reports whether a majority of n runs is reached, either way, or
// n runs were made.
func (t tipCount) decided(n int) bool {
	return t.runs >= n || 2*t.tipped > n || 2*(t.runs-t.tipped) > n
}

// most reports whether most of the runs tipped over.
func (t tipCount) most() bool { return 2*t.tipped > t.runs }

// tipThreshold is the shortest outage of the sweep from which every longer
// one tipped over in most of its runs, or -1.
func tipThreshold(sweep []time.Duration, tips []tipCount) time.Duration {
	th := time.Duration(-1)
	for i := len(tips) - 1; i >= 0 && tips[i].most(); i-- {
		th = sweep[i]
	}
	return th
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (p incParams) run(ctx context.Context, env *Env) (*Result, error) {
	plan, err := p.validate()
	if err != nil {
		return nil, err
	}
	outs, variants := plan.outages, plan.variants
	r := &Result{Experiment: "incident", Title: fmt.Sprintf(
		"BFF -> order -> data -> DB (%d workers x %v, %.0f rps), %.0f rps offered open-loop (%.0f%%); the DB fails over: naive retries at every tier vs guardrail",
		p.workers, p.service, p.capacity(), p.rps, 100*p.rps/p.capacity())}
	var rows []incRow
	var (
		mu                sync.Mutex // guards reruns and timelines
		reruns, timelines []string
	)
	runOne := func(variant string, guarded bool, outage time.Duration, relief bool) (incRow, error) {
		row := incRow{variant: variant, guarded: guarded, outage: outage, relief: relief}
		for try := 1; ; try++ {
			env.Progress("incident: %s (try %d)", row.name(), try)
			res, err := p.scenario(ctx, env, variant, guarded, outage, relief)
			if err != nil {
				return row, err
			}
			row.res = res
			p.judge(&row)
			mu.Lock()
			if p.timeline {
				timelines = append(timelines, fmt.Sprintf("timeline of %s (try %d):\n%s", row.name(), try, res.timeline()))
			}
			if !row.measured && guarded && try < incTries {
				reruns = append(reruns, fmt.Sprintf("%s (try %d: %.1f rps, p99 lag %v, timer lateness %v)", row.name(), try,
					res.sendRate, res.lagP99.Round(100*time.Microsecond), res.late))
			}
			mu.Unlock()
			if row.measured || !guarded || try == incTries {
				return row, nil
			}
		}
	}
	// The guarded runs are light (the offered load, well under the DB's
	// capacity, and a few retries), so incParallel of them run at once,
	// each on a system of its own; the naive ones run alone, because from
	// the trigger on their storm loads the machine by itself.
	runGuarded := func(v string, sweep []time.Duration) ([]incRow, error) {
		out := make([]incRow, len(sweep))
		errs := make([]error, len(sweep))
		slots := make(chan struct{}, incParallel)
		var wg sync.WaitGroup
		for i, T := range sweep {
			wg.Go(func() {
				slots <- struct{}{}
				defer func() { <-slots }()
				out[i], errs[i] = runOne(v, true, T, false)
			})
		}
		wg.Wait()
		return out, errors.Join(errs...)
	}
	threshold := map[string]time.Duration{}
	tipSpread := map[string]string{} // per variant: runs that tipped near the threshold
	tippedMost := map[string]bool{}  // per "variant outage": most of its runs tipped
	for _, v := range variants {
		sweep := slices.Clone(outs)
		var naive, guarded []incRow
		for i := 0; plan.naive && i < len(sweep); i++ {
			T := sweep[i]
			row, err := runOne(v, false, T, false)
			if err != nil {
				return nil, err
			}
			naive = append(naive, row)
			if i == len(sweep)-1 && !row.tipped && 2*T <= p.maxOutage {
				sweep = append(sweep, 2*T)
			}
		}
		// Near the threshold an outage tips the naive system over one time
		// and not the next, so the outages on both sides of the first
		// sweep's threshold are run again until two runs agree (best of
		// three); the threshold is then the shortest outage from which
		// every longer one tipped in most of its runs.
		tips := make([]tipCount, len(naive))
		for i, row := range naive {
			tips[i] = tipCount{b2i(row.tipped), 1}
		}
		first := len(naive)
		for first > 0 && naive[first-1].tipped {
			first--
		}
		near := naive[max(first-1, 0):min(first+1, len(naive))]
		for i := max(first-1, 0); i < max(first-1, 0)+len(near); i++ {
			for !tips[i].decided(p.repeats) {
				row, err := runOne(v, false, sweep[i], false)
				if err != nil {
					return nil, err
				}
				tips[i].tipped += b2i(row.tipped)
				tips[i].runs++
			}
		}
		threshold[v] = tipThreshold(sweep, tips)
		var spread []string
		for i := max(first-1, 0); i < max(first-1, 0)+len(near); i++ {
			spread = append(spread, fmt.Sprintf("%d of %d at %v", tips[i].tipped, tips[i].runs, sweep[i]))
		}
		tipSpread[v] = strings.Join(spread, ", ")
		for i, t := range tips {
			tippedMost[v+" "+sweep[i].String()] = t.most()
		}
		if plan.guarded {
			if guarded, err = runGuarded(v, sweep); err != nil {
				return nil, err
			}
		}
		for i := range sweep {
			if plan.naive {
				rows = append(rows, naive[i])
			}
			if plan.guarded {
				rows = append(rows, guarded[i])
			}
		}
	}
	// The proof that the naive system is metastable, not merely slow: after
	// the shortest outage that tipped it over, dropping the offered load for
	// a moment brings it back. The shortest, because its backlog is the
	// smallest: the retry chains of a longer one outlive a brief drop.
	//
	// Only for the refused variant: after a hung outage the calls made
	// during it hold their connections for their whole timeout, which no
	// drop in load releases.
	proofVariant := "refuse"
	var proof *incRow
	proofT := time.Duration(-1)
	for _, row := range rows {
		if row.variant == proofVariant && !row.guarded && row.tipped && (proofT < 0 || row.outage < proofT) {
			proofT = row.outage
		}
	}
	if proofT > 0 {
		row, err := runOne(proofVariant, false, proofT, true)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
		proof = &rows[len(rows)-1]
	}

	// The table.
	for _, row := range rows {
		res := row.res
		cols := []Col{
			Str("variant", row.variant).jsonOnly(),
			Str("config", row.config()).jsonOnly(),
			Ms("outage_ms", row.outage).jsonOnly(),
			optMs("recovery_ms", "recovery", row.recovery),
			optMs("degraded_ms", "degraded", row.degraded),
			Float("goodput_after_pct", round1(res.goodputPct(res.trigEnd, res.end)), 1).As("goodput_after", "%.1f%%"),
			Float("peak_db_calls_per_request", round2(res.peakDBPerRequest(p)), 2).Named("peak_db_per_req"),
			Float("db_calls_per_request", round2(res.dbPerRequest()), 2).Named("db_per_req"),
			Float("wasted_db_work_pct", round1(res.wastedPct()), 1).As("wasted", "%.1f%%"),
			Ms("run_ms", res.end).As("run", "s"),
			Int("requests", int(sum(res.offered))).jsonOnly(),
			Int("db_calls", int(sum(res.dbIn))).jsonOnly(),
			Float("send_rate_rps", round1(res.sendRate), 1).jsonOnly(),
			Ms("lag_p99_ms", res.lagP99).jsonOnly(),
			Bool("measured", row.measured).jsonOnly(),
			Ms("timer_lateness_p99_ms", res.late.p99).jsonOnly(),
		}
		if row.relief {
			cols = append(cols, Ms("relief_start_ms", res.reliefStart).jsonOnly(), Ms("relief_end_ms", res.reliefEnd).jsonOnly(),
				optMs("recovery_after_relief_ms", "recovery_after_relief", res.recoveryFrom(p, res.reliefEnd)))
		}
		r.add(row.label(), cols...)
	}

	// The threshold and the checks.
	for _, v := range variants {
		if !plan.naive {
			break
		}
		if th := threshold[v]; th > 0 {
			r.note("%s: the naive system stays degraded after an outage of >= %v (runs that tipped over, best of %d near the threshold: %s).", v, th, p.repeats, tipSpread[v])
		} else {
			r.note("%s: the naive system recovered after every outage of the sweep (up to %v): no threshold found.", v, maxOutageOf(rows, v))
		}
	}
	// The per-outage checks below hold by the threshold's definition; this
	// one is what can fail: the incident must reproduce, the naive system
	// tipping over after the longest outage of the sweep.
	for _, v := range variants {
		var longest *incRow
		for i := range rows {
			if rows[i].variant == v && !rows[i].guarded && !rows[i].relief && (longest == nil || rows[i].outage > longest.outage) {
				longest = &rows[i]
			}
		}
		if longest == nil {
			continue
		}
		name := fmt.Sprintf("the naive system tips over after the longest outage (%s %v)", v, longest.outage)
		if !longest.measured {
			r.notJudged(name, "%s (before the outage)", p.pre(*longest).reason())
			continue
		}
		observed := (longest.res.end - longest.res.trigEnd).Round(time.Millisecond)
		degraded := fmt.Sprintf("until the run ended, %v after the outage", observed)
		if longest.degraded >= 0 {
			degraded = fmt.Sprintf("for %v after the outage, then back over 50%%", longest.degraded.Round(time.Millisecond))
		}
		r.check(longest.tipped, name, "goodput under 50%% %s; want 5x the outage (%v) or until the run ended", degraded, 5*longest.outage)
	}
	p.checks(r, rows, threshold, tippedMost)

	// Notes.
	r.note("naive: every tier retries %d attempts (backoff %v doubling, plus 0-%v jitter), no budget, no breaker, no deadline sent; timeouts grow with depth: BFF->order %v, order->data %v, data->DB %v; a tier's retry helper %s.",
		p.naiveAttempts, p.naiveBackoff, p.naiveJitter, p.bffTimeout, p.svcTimeout, p.dbTimeout,
		map[bool]string{false: "runs on a context of its own and keeps going after its caller hangs up", true: "stops when its caller hangs up"}[p.naiveCancel])
	r.note("guarded: deadline middleware on every server (caps BFF %v, order and data %v, DB %v), the user's %v deadline propagated by guardhttp; only data retries (%d attempts, %v per attempt, budget %g), with a breaker per host (open %v, window %v, %d calls, 50%% failures: guardrail's 30 s and 10 s scaled down, the open time because it bounds the recovery, the window less, so that a stall of this machine of a few hundred ms does not trip it); BFF and order make one attempt; shedding at the BFF (%d in flight) and at the DB (%d in flight).",
		p.bffTimeout, p.svcTimeout, p.dbTimeout, p.userDeadline, p.attempts, p.attemptTimeout, p.budgetRatio, p.breakerOpen, p.breakerWindow, p.breakerMin, p.bffShedLimit, p.dbShedLimit)
	r.note("DB: %d workers x %v (%.0f queries/s), an unbounded FIFO queue that runs every query it took, whoever still waits for it; a failover loses the queue. refuse: nothing listens on its port; hang: connections are accepted and never answered (those made during the outage stay hung after it). Each tier's client pool holds %d connections per host.",
		p.workers, p.service, p.capacity(), p.pool)
	r.note("goodput = requests sent in each %v answered 200 within the user's %v; recovery = from the end of the outage until goodput is back to %.0f%% of the offered load for %v (none: not before the run ended); degraded = until goodput is back over 50%% for %v; peak_db_per_req = the most calls reaching the DB in one %v over the user requests offered in it, after the trigger; db_per_req = over the whole run; wasted = queries the DB ran after their user had given up.",
		p.step, p.userDeadline, 100*p.recoverFrac, p.holdFor, p.holdFor/2, p.step)
	if proof == nil && plan.naive && !slices.Contains(variants, "refuse") {
		r.note("the proof that the naive system is metastable (dropping the load) runs on the refused variant only, which was not asked for.")
	}
	if proof != nil {
		r.note("load dropped: the same naive run, with the offered load at %.0f%% from %v after the outage until no more requests were in flight in the whole system, nor queued at the DB, than the DB's %d workers, for %v (at most %v); recovery_after_relief counts from the load's return.",
			100*p.reliefRate, p.reliefAfter, p.workers, p.step, p.reliefFor)
	}
	worstRate, worstP99 := math.Inf(1), time.Duration(0)
	var worstLate lateness
	for _, row := range rows {
		worstRate, worstP99 = min(worstRate, row.res.sendRate/row.res.rateWanted), max(worstP99, row.res.lagP99)
		worstLate = worstLate.worse(row.res.late)
	}
	r.note("load generator: open loop, a goroutine per request; worst send rate %.1f%% of its schedule, worst p99 start lag %v; timer lateness alongside the load %s (worst run; a run is timed when its p99 is <= %v and its CPU wait, where known, <= %.0f%%). Judged over the whole run for guarded, before the trigger for naive: from then on the naive storm loads this machine by itself.",
		100*worstRate, worstP99.Round(100*time.Microsecond), worstLate, quietBound, 100*maxCPUWait)
	r.Notes = append(r.Notes, timelines...)
	if len(reruns) > 0 {
		r.note("rerun because the load generator fell behind its schedule or the machine was too busy to time the run: %s.", strings.Join(reruns, "; "))
	}
	r.Charts = p.charts(rows, variants, threshold)
	return r, nil
}

func maxOutageOf(rows []incRow, v string) time.Duration {
	var m time.Duration
	for _, row := range rows {
		if row.variant == v {
			m = max(m, row.outage)
		}
	}
	return m
}

func sum(v []int64) int64 {
	var t int64
	for _, x := range v {
		t += x
	}
	return t
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }

// optMs is a duration column that is null when d is negative.
func optMs(key, name string, d time.Duration) Col {
	if d < 0 {
		return Col{Key: key, Name: name, Value: nil}
	}
	return Ms(key, d).Named(name)
}

// judge computes a row's recovery, degradation and whether its load kept
// its schedule.
func (p incParams) judge(row *incRow) {
	res := row.res
	row.recovery = res.recoveryFrom(p, res.trigEnd)
	row.degraded = res.degradedFrom(p, res.trigEnd)
	want := min(5*row.outage, res.end-res.trigEnd)
	row.tipped = row.degraded < 0 || row.degraded >= want
	row.measured = p.pre(*row).held()
}

func (p incParams) checks(r *Result, rows []incRow, threshold map[string]time.Duration, tippedMost map[string]bool) {
	notJudged := func(name string, row incRow) {
		// A run whose load fell behind its schedule, or that ran on a
		// machine too busy to time it, measured this machine, not the
		// system: its check is not judged.
		r.notJudged(name, "%s", p.pre(row).reason())
	}
	for _, row := range rows {
		res := row.res
		switch {
		case row.relief:
			name := "dropping the load brings the naive system back (metastable)"
			if !row.measured {
				notJudged(name, row)
				continue
			}
			rec := res.recoveryFrom(p, res.reliefEnd)
			before := res.goodputPct(res.trigEnd, res.reliefStart)
			if before >= 50 {
				// Near the threshold an outage tips the system over one time
				// and not the next: this one came back by itself.
				r.notJudged(name, "this run was not degraded when the load dropped (goodput %.1f%% since the outage): it did not tip over this time", before)
				continue
			}
			r.check(rec >= 0, name, "%s: goodput %.1f%% from the outage's end until the load dropped; after %v at %.0f%% load, recovery %s from the load's return",
				row.name(), res.goodputPct(res.trigEnd, res.reliefStart), (res.reliefEnd - res.reliefStart).Round(time.Millisecond), 100*p.reliefRate, fmtOpt(rec))
		case !row.guarded:
			th := threshold[row.variant]
			if th <= 0 || row.outage < th {
				continue
			}
			name := fmt.Sprintf("naive stays degraded past the threshold (%s %v)", row.variant, row.outage)
			if !row.measured {
				notJudged(name, row)
				continue
			}
			want := min(5*row.outage, res.end-res.trigEnd)
			degraded := fmt.Sprintf("until the run ended, %v after the outage", (res.end - res.trigEnd).Round(time.Millisecond))
			if row.degraded >= 0 {
				degraded = "for " + row.degraded.Round(time.Millisecond).String() + " after the outage"
			}
			most := ""
			if !row.tipped && tippedMost[row.variant+" "+row.outage.String()] {
				most = "; most of the runs at this outage did"
			}
			r.check(row.tipped || most != "", name, "goodput under 50%% %s, want >= %v (5x the outage, or until the run ended)%s", degraded, want.Round(time.Millisecond), most)
		default:
			name := fmt.Sprintf("guarded recovers within %v (%s %v)", p.recoveryTarget, row.variant, row.outage)
			// Counts, whatever the machine did: only data retries, and its
			// budget starts with budget.DefaultMax tokens and earns ratio per
			// call.
			calls, reqs := sum(res.dbIn), sum(res.offered)
			ceiling := (1+p.budgetRatio)*float64(reqs) + budget.DefaultMax
			r.check(float64(calls) <= ceiling, fmt.Sprintf("guarded: the retry budget caps the calls reaching the DB (%s %v)", row.variant, row.outage),
				"%d calls for %d user requests, want at most %.0f ((1 + %g) x requests + %g initial tokens)", calls, reqs, ceiling, p.budgetRatio, float64(budget.DefaultMax))
			loadName := fmt.Sprintf("guarded keeps the DB's load within its capacity while it recovers (%s %v)", row.variant, row.outage)
			if !row.measured {
				notJudged(name, row)
				notJudged(loadName, row)
				continue
			}
			r.check(row.recovery >= 0 && row.recovery <= p.recoveryTarget, name, "recovery %s, want <= %v", fmtOpt(row.recovery), p.recoveryTarget)
			// While it recovers, and through the hold that confirms it.
			until := res.end
			if row.recovery >= 0 {
				until = min(res.end, res.trigEnd+row.recovery+p.holdFor)
			}
			peak := res.peakDBRate(p, res.trigEnd, until)
			r.check(peak <= p.capacity(), loadName, "at most %.0f calls/s reached the DB (in one %v), capacity %.0f/s", peak, p.step, p.capacity())
		}
	}
}

func fmtOpt(d time.Duration) string {
	if d < 0 {
		return "none before the run ended"
	}
	return d.Round(time.Millisecond).String()
}

// maxLag is the most a request may start behind its schedule (at the 99th
// percentile) before the run counts as measuring this machine rather than
// the system: a twentieth of the user's deadline, or one query's time if
// longer. A stall that long costs a request little of its deadline; longer
// ones decide by themselves who is answered in time.
func (p incParams) maxLag() time.Duration { return max(p.service, p.userDeadline/20) }

// incRun is what one run measured, in buckets of step since the load
// started.
type incRun struct {
	step        time.Duration
	trigStart   time.Duration // the DB goes down
	trigEnd     time.Duration // and comes back
	reliefStart time.Duration // the offered load drops (proof runs only)
	reliefEnd   time.Duration // and comes back
	end         time.Duration // the end of the last request's slot in the schedule

	offered, ok []int64 // requests sent, and answered 200 in time, by send bucket
	dbIn        []int64 // calls reaching the DB (before any middleware), by arrival
	dbRun       []int64 // queries the DB ran, by completion
	dbLost      []int64 // of those, queries whose user had given up

	sendRate   float64         // achieved, over the judged part of the run
	rateWanted float64         // scheduled, over the same part
	lagP99     time.Duration   // start behind schedule, over the same part
	late       lateness        // the machine's scheduling lateness, over the same part
	maxLag     []time.Duration // the worst start lag, by send bucket
}

func (res *incRun) bucket(d time.Duration) int { return int(d / res.step) }

// goodputPct is the share of the requests sent in [from, to) answered in time.
func (res *incRun) goodputPct(from, to time.Duration) float64 {
	var off, ok int64
	for k := res.bucket(from); k < min(res.bucket(to+res.step-1), len(res.offered)); k++ {
		off, ok = off+res.offered[k], ok+res.ok[k]
	}
	if off == 0 {
		return 0
	}
	return 100 * float64(ok) / float64(off)
}

func (res *incRun) good(k int, frac float64) bool {
	// The epsilon keeps 27 of 30 at 90 % (0.9 x 30 is a hair over 27).
	return res.offered[k] > 0 && float64(res.ok[k]) >= frac*float64(res.offered[k])-1e-9
}

// recoveryFrom is the time from `from` until the first bucket from which
// goodput stays at p.recoverFrac of the offered load for p.holdFor; -1 if
// none before the end of the run.
func (res *incRun) recoveryFrom(p incParams, from time.Duration) time.Duration {
	return res.sustained(from, p.recoverFrac, int(p.holdFor/res.step))
}

// degradedFrom is the time from `from` until goodput is back over half the
// offered load for half of p.holdFor; -1 if never before the run ended.
func (res *incRun) degradedFrom(p incParams, from time.Duration) time.Duration {
	return res.sustained(from, 0.5, max(1, int(p.holdFor/2/res.step)))
}

func (res *incRun) sustained(from time.Duration, frac float64, hold int) time.Duration {
	first := res.bucket(from + res.step - 1) // the first bucket starting at or after from
	n := res.bucket(res.end + res.step - 1)
	n = min(n, len(res.offered))
	run := 0
	for k := first; k < n; k++ {
		if !res.good(k, frac) {
			run = 0
			continue
		}
		run++
		if run == hold {
			return max(0, time.Duration(k-hold+1)*res.step-from)
		}
	}
	return -1
}

func (res *incRun) peakDBPerRequest(p incParams) float64 {
	perBucket := p.rps * res.step.Seconds()
	peak := 0.0
	for k := res.bucket(res.trigStart); k < len(res.dbIn); k++ {
		peak = max(peak, float64(res.dbIn[k])/perBucket)
	}
	return peak
}

// peakDBRate is the most calls per second that reached the DB in one bucket
// of [from, to).
func (res *incRun) peakDBRate(p incParams, from, to time.Duration) float64 {
	peak := 0.0
	for k := res.bucket(from); k < min(res.bucket(to+res.step-1), len(res.dbIn)); k++ {
		peak = max(peak, float64(res.dbIn[k])/res.step.Seconds())
	}
	return peak
}

func (res *incRun) dbPerRequest() float64 {
	in, off := sum(res.dbIn), sum(res.offered)
	if off == 0 {
		return 0
	}
	return float64(in) / float64(off)
}

func (res *incRun) wastedPct() float64 {
	var run, lost int64
	for k := range res.dbRun {
		run, lost = run+res.dbRun[k], lost+res.dbLost[k]
	}
	if run == 0 {
		return 0
	}
	return 100 * float64(lost) / float64(run)
}

// sched is the run's schedule, for timing's rule.
func (res *incRun) sched(p incParams, run string) schedule {
	return schedule{run: run, rate: res.sendRate, want: res.rateWanted, lagP99: res.lagP99, maxLag: p.maxLag()}
}

// pre is what a timing check of row needs: its load kept its schedule, on
// a machine quiet enough to time it, over the part of the run judged.
func (p incParams) pre(row incRow) *timing {
	t := &timing{}
	return t.needSchedule(row.res.sched(p, row.name())).needQuiet(row.name(), row.res.late)
}

// headerUserDeadline carries, from tier to tier, when the user who caused a
// call gives up (unix nanoseconds), so the DB can count the work it does for
// users already gone. It is the lab's instrument, not part of either
// configuration.
const headerUserDeadline = "X-Lab-User-Deadline"

// counters are per-bucket counters that goroutines add to.
type counters struct {
	start time.Time
	step  time.Duration
	v     []atomic.Int64
}

func newCounters(start time.Time, step, span time.Duration) *counters {
	return &counters{start: start, step: step, v: make([]atomic.Int64, int(span/step)+2)}
}

func (c *counters) addAt(t time.Time) {
	k := int(t.Sub(c.start) / c.step)
	if k >= 0 && k < len(c.v) {
		c.v[k].Add(1)
	}
}

func (c *counters) snapshot(n int) []int64 {
	out := make([]int64, n)
	for k := range min(n, len(c.v)) {
		out[k] = c.v[k].Load()
	}
	return out
}

// incDB is the database: workers running queries from an unbounded FIFO
// queue, with no idea whether anyone still waits for a query it runs. It
// fails over as told: its queue is lost, and it refuses or hangs until the
// outage ends.
type incDB struct {
	p       incParams
	runCtx  context.Context
	addr    atomic.Pointer[string] // the listener of the primary now; a new one after each refusal
	handler http.Handler           // what the DB's server runs: h, maybe under middleware
	mu      sync.Mutex
	cond    *sync.Cond
	queue   []*dbJob
	epoch   int
	hanging bool
	closed  bool
	srv     *http.Server
	srvWG   sync.WaitGroup
	workers sync.WaitGroup
	in      *counters // calls reaching the DB, before any middleware
	ran     *counters
	lost    *counters // queries run after their user had given up
}

type dbJob struct {
	epoch        int
	userDeadline time.Time
	done         chan struct{}
}

// ServeHTTP is the DB's own handler (under the guarded configuration's
// middleware, if any).
func (db *incDB) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/health" {
		db.health(w, r)
		return
	}
	job := &dbJob{done: make(chan struct{})}
	if ns, err := strconv.ParseInt(r.Header.Get(headerUserDeadline), 10, 64); err == nil {
		job.userDeadline = time.Unix(0, ns)
	}
	db.mu.Lock()
	job.epoch = db.epoch
	hanging := db.hanging
	if !hanging {
		db.queue = append(db.queue, job)
		db.cond.Signal()
	}
	db.mu.Unlock()
	select {
	case <-job.done:
		_, _ = w.Write([]byte("ok"))
	case <-r.Context().Done():
	case <-db.runCtx.Done():
	}
}

// health answers at once, without a worker, unless the DB hangs: a
// health check on a connection of its own, which does not queue behind
// the load.
func (db *incDB) health(w http.ResponseWriter, r *http.Request) {
	db.mu.Lock()
	hanging := db.hanging
	db.mu.Unlock()
	if hanging {
		select {
		case <-r.Context().Done():
		case <-db.runCtx.Done():
		}
		return
	}
	_, _ = w.Write([]byte("ok"))
}

// backlog is the number of queries waiting for a worker.
func (db *incDB) backlog() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return len(db.queue)
}

func (db *incDB) work() {
	for {
		db.mu.Lock()
		for len(db.queue) == 0 && !db.closed {
			db.cond.Wait()
		}
		if db.closed {
			db.mu.Unlock()
			return
		}
		job := db.queue[0]
		db.queue[0] = nil
		db.queue = db.queue[1:]
		db.mu.Unlock()
		time.Sleep(db.p.service)
		now := time.Now()
		db.ran.addAt(now)
		if !job.userDeadline.IsZero() && now.After(job.userDeadline) {
			db.lost.addAt(now)
		}
		db.mu.Lock()
		current := job.epoch == db.epoch
		db.mu.Unlock()
		if current {
			close(job.done)
		}
	}
}

// dbHost is the name the tiers call the DB by. Their transports dial it
// to the DB's current listener: a primary that comes back after refusing
// listens on a new port, as a failed-over database comes back at a new
// address behind a stable name, and no port is ever bound twice (another
// process may have taken it meanwhile).
const dbHost = "incident-db.invalid:80"

// listen starts a new primary on a new loopback port.
func (db *incDB) listen() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("incident: the DB could not listen: %w", err)
	}
	addr := ln.Addr().String()
	db.addr.Store(&addr)
	srv := &http.Server{Handler: db.handler, ReadHeaderTimeout: 10 * time.Second}
	db.srv = srv
	db.srvWG.Go(func() { _ = srv.Serve(ln) })
	return nil
}

// dial is a transport's DialContext: dbHost goes to the DB's current
// listener, any other address to next.
func (db *incDB) dial(next func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == dbHost {
			if cur := db.addr.Load(); cur != nil {
				addr = *cur
			}
		}
		return next(ctx, network, addr)
	}
}

// fail starts an outage: the queue is lost, and the DB refuses connections
// or hangs on them.
func (db *incDB) fail(variant string) {
	db.mu.Lock()
	db.epoch++
	db.queue = nil
	if variant == "hang" {
		db.hanging = true
	}
	db.mu.Unlock()
	if variant == "refuse" {
		_ = db.srv.Close()
		db.srvWG.Wait()
	}
}

// recover ends the outage: a fresh primary, behind the same name.
func (db *incDB) recover(variant string) error {
	db.mu.Lock()
	db.epoch++
	db.hanging = false
	db.mu.Unlock()
	if variant != "refuse" {
		return nil
	}
	return db.listen()
}

// close stops the DB and its workers; the queries still queued are dropped.
// It may be called more than once.
func (db *incDB) close() {
	db.mu.Lock()
	db.closed = true
	db.cond.Broadcast()
	db.mu.Unlock()
	if db.srv != nil {
		_ = db.srv.Close()
	}
	db.srvWG.Wait()
	db.workers.Wait()
}

// handlerSet tracks the handlers running at every tier: a run returns only
// once all of them have, and a relief lasts until almost none is left.
type handlerSet struct {
	wg       sync.WaitGroup
	inFlight atomic.Int64
}

func (hs *handlerSet) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs.wg.Add(1)
		hs.inFlight.Add(1)
		defer hs.wg.Done()
		defer hs.inFlight.Add(-1)
		h.ServeHTTP(w, r)
	})
}

// naiveHelper is the classic retry helper every naive tier uses: a fixed
// number of attempts, exponential backoff with a little jitter, a timeout
// per attempt, nothing else.
type naiveHelper struct {
	client   *http.Client
	attempts int
	backoff  time.Duration
	jitter   time.Duration
	rand     func() float64
}

func (h naiveHelper) get(ctx context.Context, url string, userDeadline string) int {
	for a := range h.attempts {
		if a > 0 {
			// Saturating: a delay that wrapped negative would be no wait.
			d := addSat(shiftSat(h.backoff, a-1), time.Duration(h.rand()*float64(h.jitter)))
			if sleepCtx(ctx, d) != nil {
				return 0
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0
		}
		req.Header.Set(headerUserDeadline, userDeadline)
		resp, err := h.client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return resp.StatusCode
			}
		}
		if ctx.Err() != nil {
			return 0
		}
	}
	return http.StatusBadGateway
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p incParams) pooled() *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxConnsPerHost = p.pool
	t.MaxIdleConnsPerHost = p.pool
	t.MaxIdleConns = 0
	return t
}

// schedule returns when a run's trigger starts and ends, when its relief
// starts (proof runs), and the end of its schedule, since the load started.
func (p incParams) schedule(guarded bool, outage time.Duration, relief bool) (trigStart, trigEnd, reliefStart, end time.Duration) {
	trigStart = p.warmup
	trigEnd = trigStart + outage
	// A run whose check is a recovery lasts long enough to decide it: a
	// recovery at the target, then the hold that confirms it. It stops as
	// soon as it has both.
	decide := max(p.after, p.recoveryTarget+p.holdFor+p.step)
	switch {
	case relief:
		reliefStart = trigEnd + p.reliefAfter
		end = reliefStart + p.reliefFor + decide
	case guarded:
		end = trigEnd + decide
	default:
		end = trigEnd + p.after
	}
	return trigStart, trigEnd, reliefStart, end
}

// incSystem is one configuration's servers on loopback.
type incSystem struct {
	db         *incDB
	handlers   handlerSet
	servers    []*server
	transports []*http.Transport
	bff        string // the URL users call
}

// close stops the servers and the DB and waits for every handler. Cancel
// the run's context first: the naive tiers' retry loops run on it, and
// hold their handlers until it ends. It may be called more than once.
func (sys *incSystem) close() {
	for _, s := range sys.servers {
		s.Close()
	}
	sys.servers = nil
	sys.db.close()
	sys.handlers.wg.Wait()
	for _, t := range sys.transports {
		t.CloseIdleConnections()
	}
}

// build starts the DB and the three tiers above it in one configuration.
// The DB counts in buckets of p.step from start, over span.
func (p incParams) build(runCtx context.Context, guarded bool, start time.Time, span time.Duration, rng *rand.Rand, jrand func() float64) (*incSystem, error) {
	db := &incDB{p: p, runCtx: runCtx, in: newCounters(start, p.step, span), ran: newCounters(start, p.step, span), lost: newCounters(start, p.step, span)}
	db.cond = sync.NewCond(&db.mu)
	var dbH http.Handler = db
	sys := &incSystem{db: db}
	fail := func(err error) (*incSystem, error) {
		sys.close() // nothing has served a request yet
		return nil, err
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second} // http.DefaultTransport's
	newTransport := func() *http.Transport {
		t := p.pooled()
		t.DialContext = db.dial(dialer.DialContext)
		sys.transports = append(sys.transports, t)
		return t
	}

	type caller func(r *http.Request, url string) int
	var tierClient func(tier int) (caller, error)
	if guarded {
		dl := func(max time.Duration) (func(http.Handler) http.Handler, error) {
			s, err := deadline.New(deadline.Config{Max: max})
			if err != nil {
				return nil, err
			}
			return s.Middleware, nil
		}
		dbDL, err := dl(p.dbTimeout)
		if err != nil {
			return fail(err)
		}
		dbShed, err := shed.New(shed.Config{Name: "db", Limit: p.dbShedLimit, Shares: map[shed.Priority]float64{shed.Normal: 1}})
		if err != nil {
			return fail(err)
		}
		dbH = dbDL(dbShed.Middleware(db))
		brk, err := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{OpenFor: p.breakerOpen, Window: p.breakerWindow,
			MinRequests: p.breakerMin, Rand: jrand}})
		if err != nil {
			return fail(err)
		}
		bud, err := budget.New(budget.Config{Ratio: p.budgetRatio})
		if err != nil {
			return fail(err)
		}
		tierClient = func(tier int) (caller, error) {
			cfg := guardhttp.Config{Name: fmt.Sprintf("tier%d", tier), Retry: guardrail.Retry{MaxAttempts: 1, Budget: budget.Unlimited()}, Breakers: noBreakers()}
			if tier == 0 { // data, nearest the DB
				cfg.MaxAttempts, cfg.AttemptTimeout, cfg.Breakers, cfg.Budget = p.attempts, p.attemptTimeout, brk, bud
				cfg.Backoff = backoff.FullJitter(backoff.DefaultBase, 100*backoff.DefaultBase)
			}
			gt, err := guardhttp.NewTransport(newTransport(), cfg)
			if err != nil {
				return nil, err
			}
			c := &http.Client{Transport: gt}
			return func(r *http.Request, url string) int {
				req, err := http.NewRequestWithContext(r.Context(), http.MethodGet, url, nil)
				if err != nil {
					return 0
				}
				req.Header.Set(headerUserDeadline, r.Header.Get(headerUserDeadline))
				resp, err := c.Do(req)
				if err != nil {
					return 0
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				return resp.StatusCode
			}, nil
		}
	} else {
		timeouts := []time.Duration{p.dbTimeout, p.svcTimeout, p.bffTimeout}
		tierClient = func(tier int) (caller, error) {
			h := naiveHelper{client: &http.Client{Transport: newTransport(), Timeout: timeouts[tier]},
				attempts: p.naiveAttempts, backoff: p.naiveBackoff, jitter: p.naiveJitter, rand: jrand}
			return func(r *http.Request, url string) int {
				ctx := runCtx
				if p.naiveCancel {
					ctx = r.Context()
				}
				return h.get(ctx, url, r.Header.Get(headerUserDeadline))
			}, nil
		}
	}
	db.handler = sys.handlers.track(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		db.in.addAt(time.Now())
		dbH.ServeHTTP(w, r)
	}))
	if err := db.listen(); err != nil {
		return fail(err)
	}
	for range p.workers {
		db.workers.Go(db.work)
	}

	// The tiers, from the DB up: data, order, BFF.
	next := "http://" + dbHost + "/query"
	for tier := range 3 {
		call, err := tierClient(tier)
		if err != nil {
			return fail(err)
		}
		target := next
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			code := call(r, target)
			if code != http.StatusOK {
				if code == http.StatusServiceUnavailable {
					w.Header().Set("Retry-After", "1")
				}
				w.WriteHeader(max(code, http.StatusBadGateway))
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
		if guarded {
			capAt := p.svcTimeout
			if tier == 2 {
				capAt = p.bffTimeout
				s, err := shed.New(shed.Config{Name: "bff", Limit: p.bffShedLimit, Shares: map[shed.Priority]float64{shed.Normal: 1}})
				if err != nil {
					return fail(err)
				}
				h = s.Middleware(h)
			}
			d, err := deadline.New(deadline.Config{Max: capAt})
			if err != nil {
				return fail(err)
			}
			h = d.Middleware(h)
		}
		s, err := serve(sys.handlers.track(h))
		if err != nil {
			return fail(err)
		}
		sys.servers = append(sys.servers, s)
		next = s.URL + "/"
	}
	sys.bff = next
	return sys, nil
}

// scenario builds the system in one configuration, sends the load, fails
// the DB for outage and returns what it measured.
func (p incParams) scenario(ctx context.Context, env *Env, variant string, guarded bool, outage time.Duration, relief bool) (*incRun, error) {
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	rng := rand.New(rand.NewPCG(env.Seed, uint64(outage)))
	var jitterMu sync.Mutex
	jrand := func() float64 { jitterMu.Lock(); defer jitterMu.Unlock(); return rng.Float64() }

	trigStart, trigEnd, reliefStart, end := p.schedule(guarded, outage, relief)
	span := end + p.userDeadline + 2*time.Second
	start := time.Now().Add(50 * time.Millisecond) // the servers start meanwhile

	sys, err := p.build(runCtx, guarded, start, span, rng, jrand)
	if err != nil {
		return nil, err
	}
	defer func() {
		cancelRun()
		sys.close()
	}()
	db, bff := sys.db, sys.bff

	// The schedule: the offered rate (dropped during a relief, below).
	interval := time.Duration(float64(time.Second) / p.rps)
	due := make([]time.Duration, int(math.Ceil(end.Seconds()*p.rps-1e-9)))
	for i := range due {
		due[i] = time.Duration(float64(i) * float64(time.Second) / p.rps)
	}
	nb := int(span / p.step)
	offered := make([]atomic.Int64, nb)
	okc := make([]atomic.Int64, nb)
	finished := make([]atomic.Int64, nb)
	sent := make([]time.Duration, len(due))
	user := newHTTPClient(true)
	user.Transport.(*http.Transport).MaxIdleConnsPerHost = 1024
	defer user.CloseIdleConnections()

	// The trigger, on its own timeline.
	var trig sync.WaitGroup
	var trigErr error
	trig.Go(func() {
		if sleepUntil(runCtx, start.Add(trigStart)) != nil {
			return
		}
		db.fail(variant)
		if sleepUntil(runCtx, start.Add(trigEnd)) != nil {
			return
		}
		trigErr = db.recover(variant)
	})

	// The load. A run stops early once its outcome is settled: recovered
	// (and held), or degraded for 5x the outage.
	res := &incRun{trigStart: trigStart, trigEnd: trigEnd, reliefStart: reliefStart, step: p.step}
	settledFrom := trigEnd
	settled := func(now time.Duration) bool {
		// The buckets the load has left behind and whose every request has
		// its answer (or gave up): in a healthy stretch that is almost at
		// once, in a degraded one after the user's deadline.
		k := 0
		for k < res.bucket(now) && finished[k].Load() == offered[k].Load() {
			k++
		}
		if k == 0 {
			return false
		}
		snap := &incRun{step: p.step, end: time.Duration(k) * p.step, offered: make([]int64, k), ok: make([]int64, k)}
		for i := range k {
			snap.offered[i], snap.ok[i] = offered[i].Load(), okc[i].Load()
		}
		if relief && res.reliefEnd == 0 {
			return false
		}
		if snap.end <= settledFrom {
			return false
		}
		if snap.recoveryFrom(p, settledFrom) >= 0 {
			return true
		}
		return !guarded && !relief && snap.degradedFrom(p, trigEnd) < 0 && snap.end-trigEnd >= 5*outage
	}
	var shots sync.WaitGroup
	probe := probeQuiet(runCtx)
	defer probe.stop()
	n := len(due)
	nextCheck := trigEnd
	drainedSince := time.Duration(-1)
	for i, d := range due {
		if d >= nextCheck {
			nextCheck = d + p.step
			if settled(d) {
				n = i
				break
			}
		}
		if err := sleepUntil(runCtx, start.Add(d)); err != nil {
			n = i
			break
		}
		if relief && d >= reliefStart && res.reliefEnd == 0 {
			// The load stays dropped until the backlog is gone: for a whole
			// step, no more requests in flight in the whole system, and no
			// more queued at the DB, than the DB has workers (a retry chain
			// holds a handler at its tier for as long as it runs). Or for
			// --relief-for at most.
			switch {
			case sys.handlers.inFlight.Load() > int64(p.workers) || db.backlog() > p.workers:
				drainedSince = -1
			case drainedSince < 0:
				drainedSince = d
			}
			if d-reliefStart >= p.reliefFor || (drainedSince >= 0 && d-drainedSince >= p.step) {
				res.reliefEnd, settledFrom = d, d
			} else if p.reliefRate == 0 || jrand() >= p.reliefRate {
				continue
			}
		}
		k := int(d / p.step)
		offered[k].Add(1)
		shots.Go(func() {
			t0 := time.Now()
			sent[i] = t0.Sub(start)
			rctx, cancel := context.WithTimeout(runCtx, p.userDeadline)
			defer cancel()
			req, err := http.NewRequestWithContext(rctx, http.MethodGet, bff, nil)
			if err == nil {
				deadline.Set(req.Header, t0, p.userDeadline)
				req.Header.Set(headerUserDeadline, strconv.FormatInt(t0.Add(p.userDeadline).UnixNano(), 10))
				var resp *http.Response
				if resp, err = user.Do(req); err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode == http.StatusOK && time.Since(t0) <= p.userDeadline {
						okc[k].Add(1)
					}
				}
			}
			finished[k].Add(1)
		})
	}
	shots.Wait()
	cancelRun()
	trig.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if trigErr != nil {
		return nil, trigErr
	}
	sys.close()

	full := len(due)
	due, sent = due[:n], sent[:n]
	res.end = end
	if n < full && n > 0 {
		res.end = due[n-1] + interval
	}
	nbUsed := res.bucket(res.end + p.step - 1)
	res.offered, res.ok = make([]int64, nbUsed), make([]int64, nbUsed)
	for k := range nbUsed {
		res.offered[k], res.ok[k] = offered[k].Load(), okc[k].Load()
	}
	res.dbIn, res.dbRun, res.dbLost = db.in.snapshot(nbUsed), db.ran.snapshot(nbUsed), db.lost.snapshot(nbUsed)

	// Did the load keep its schedule? For naive, only before the trigger:
	// from then on the storm itself loads this machine (a refused DB call
	// costs a dial, and every tier makes four), which is part of what is
	// measured.
	judgeTo := res.end
	if !guarded {
		judgeTo = trigStart
	}
	var lags []time.Duration
	first, last, cnt := time.Duration(-1), time.Duration(0), 0
	for i, d := range due {
		if d >= judgeTo {
			break
		}
		lags = append(lags, max(0, sent[i]-d))
		if first < 0 || sent[i] < first {
			first = sent[i]
		}
		last = max(last, sent[i])
		cnt++
	}
	res.rateWanted = p.rps
	if relief && judgeTo > reliefStart {
		res.rateWanted = float64(cnt) / judgeTo.Seconds()
	}
	if last > first && cnt > 1 {
		res.sendRate = float64(cnt-1) / (last - first).Seconds()
	}
	res.lagP99 = quantile(lags, 0.99)
	res.late = probe.before(start.Add(judgeTo))
	res.maxLag = make([]time.Duration, nbUsed)
	for i, d := range due {
		if k := res.bucket(d); k < nbUsed {
			res.maxLag[k] = max(res.maxLag[k], sent[i]-d)
		}
	}
	return res, nil
}

// charts: goodput over time for both configurations at the threshold (or
// the longest outage) per variant, with the outage drawn as a band, the
// recovery time against the outage, and the metastability proof.
func (p incParams) charts(rows []incRow, variants []string, threshold map[string]time.Duration) []Chart {
	var out []Chart
	perBucket := p.rps * p.step.Seconds()
	// A run stops once its outcome is settled, so the runs of one chart
	// last differently: the chart ends with the shortest.
	timeline := func(title string, rs ...incRow) Chart {
		n := len(rs[0].res.offered)
		for _, r := range rs {
			n = min(n, len(r.res.offered))
		}
		c := Chart{Title: title, Kind: "line", XLabel: "seconds since the load started (by send time)", YLabel: fmt.Sprintf("answered in time per %v", p.step)}
		for k := range n {
			c.X = append(c.X, fmt.Sprintf("%.1f", (time.Duration(k)*p.step).Seconds()))
		}
		band := make([]float64, n)
		for k := range n {
			t := time.Duration(k) * p.step
			if t >= rs[0].res.trigStart && t < rs[0].res.trigEnd {
				band[k] = perBucket
			}
		}
		c.Series = append(c.Series, Series{Name: "DB down (outage)", Values: band, Fill: true})
		for _, r := range rs {
			v := make([]float64, n)
			for k := range v {
				v[k] = float64(r.res.ok[k])
			}
			c.Series = append(c.Series, Series{Name: r.config(), Values: v}.notJudgedIf(r.measured))
		}
		offered := make([]float64, n)
		for k := range offered {
			offered[k] = float64(rs[0].res.offered[k])
		}
		c.Series = append(c.Series, Series{Name: "offered (" + rs[0].config() + ")", Values: offered})
		return c
	}
	for _, v := range variants {
		T := threshold[v]
		if T <= 0 {
			T = maxOutageOf(rows, v)
		}
		var pair []incRow
		for _, r := range rows {
			if r.variant == v && r.outage == T && !r.relief {
				pair = append(pair, r)
			}
		}
		if len(pair) > 0 {
			out = append(out, timeline(fmt.Sprintf("Goodput over time, DB %s for %v (until the shorter run ended)", v, T), pair...))
		}
		rec := Chart{Title: fmt.Sprintf("Recovery time against outage length (%s)", v),
			Kind: "bar", XLabel: "outage", YLabel: "recovery (ms)"}
		naive, guarded := Series{Name: "naive"}, Series{Name: "guarded"}
		for _, r := range rows {
			if r.variant != v || r.relief {
				continue
			}
			s := &naive
			if r.guarded {
				s = &guarded
			} else {
				rec.X = append(rec.X, fmtSec(r.outage))
			}
			s.Values = append(s.Values, float64(r.recovery.Milliseconds()))
			s.Never = append(s.Never, r.recovery < 0) // never recovered: a marker, not a bar of the run's length
			s.NotJudged = append(s.NotJudged, !r.measured)
		}
		rec.Series = []Series{naive, guarded}
		out = append(out, rec)
	}
	for _, r := range rows {
		if r.relief {
			c := timeline(fmt.Sprintf("Metastable: naive, DB %s for %v, offered load dropped for %v", r.variant, r.outage, (r.res.reliefEnd-r.res.reliefStart).Round(time.Millisecond)), r)
			out = append(out, c)
		}
	}
	return out
}

// timeline lists the run's buckets, one a line.
func (res *incRun) timeline() string {
	var b strings.Builder
	for k := range res.offered {
		t := time.Duration(k) * res.step
		mark := " "
		switch {
		case t >= res.trigStart && t < res.trigEnd:
			mark = "x" // the DB is down
		case res.reliefEnd > 0 && t >= res.reliefStart && t < res.reliefEnd:
			mark = "-" // the load is dropped
		}
		fmt.Fprintf(&b, "    %s %5.1fs offered=%3d ok=%3d db_in=%4d db_ran=%3d db_wasted=%3d max_lag=%v\n", mark, t.Seconds(),
			res.offered[k], res.ok[k], res.dbIn[k], res.dbRun[k], res.dbLost[k], res.maxLag[k].Round(time.Millisecond))
	}
	return strings.TrimSuffix(b.String(), "\n")
}
