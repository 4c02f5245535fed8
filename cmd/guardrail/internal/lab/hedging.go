package lab

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// hedgeWarmup is how many calls each row makes before it measures.
const hedgeWarmup = 50

type hedgingParams struct {
	calls      int
	workers    int
	fast       time.Duration
	slow       time.Duration
	slowPct    float64
	percentile float64
	minDelay   time.Duration
	overPct    float64
	overSlow   time.Duration
}

func hedging() Experiment {
	return bound(Experiment{
		Name:    "hedging",
		Summary: "a dependency with a slow tail: hedged reads cut p99 for a few extra requests, and stop when it is overloaded",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := hedgingParams{calls: 2000, workers: 32, fast: 10 * time.Millisecond, slow: 500 * time.Millisecond, slowPct: 5,
				percentile: 0.9, minDelay: 20 * time.Millisecond, overPct: 30, overSlow: 100 * time.Millisecond}
			if quick {
				// Not fewer: the calls whose hedge is refused or slow too are
				// 4 to 7 whatever the row's length (most of them while the
				// budget and the delay settle), and a p99 of 600 calls would
				// sit on the 6th slowest.
				p.calls = 1200
			}
			fs.IntVar(&p.calls, "calls", p.calls, "calls per row")
			fs.IntVar(&p.workers, "workers", p.workers, "concurrent callers")
			fs.DurationVar(&p.fast, "fast", p.fast, "the dependency's usual latency (its p50)")
			fs.DurationVar(&p.slow, "slow", p.slow, "the latency of its slow tail")
			fs.Float64Var(&p.slowPct, "slow-pct", p.slowPct, "percent of calls in the slow tail")
			fs.Float64Var(&p.percentile, "percentile", p.percentile, "hedge after this percentile of recent latency")
			fs.DurationVar(&p.minDelay, "min-delay", p.minDelay, "least hedge delay (a floor under the percentile)")
			fs.Float64Var(&p.overPct, "overload-503-pct", p.overPct, "overloaded: percent of calls answered 503 with Retry-After")
			fs.DurationVar(&p.overSlow, "overload-latency", p.overSlow, "overloaded: the latency of the calls it still serves")
			return &p
		},
	})
}

// tailServer answers after fast, or slow for slowPct of calls; overloaded,
// it refuses overPct of calls with 503 and Retry-After at once and serves
// the rest after overSlow (or slow, in its tail).
type tailServer struct {
	p          hedgingParams
	overloaded bool
	mu         sync.Mutex
	rnd        *rand.Rand
	requests   atomic.Int64
}

func (s *tailServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.requests.Add(1)
	s.mu.Lock()
	u, v := s.rnd.Float64()*100, s.rnd.Float64()
	s.mu.Unlock()
	d := time.Duration(float64(s.p.fast) * (0.8 + 0.4*v)) // fast ± 20 %
	if s.overloaded {
		if u < s.p.overPct {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		d = s.p.overSlow
		u -= s.p.overPct
	}
	if u < s.p.slowPct {
		d = s.p.slow
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		_, _ = w.Write([]byte("ok"))
	case <-r.Context().Done():
	}
}

type hedgingRow struct {
	hedging, overloaded bool
	p50, p99            time.Duration
	extraPct            float64
	calls, requests     int64
	late                lateness // the machine's scheduling lateness while the calls ran
}

// hedgeMaxCalls bounds --calls: each row records one latency per call, and
// sends them at --workers at a time.
const hedgeMaxCalls = 1_000_000

// checkFlags reports every flag the experiment cannot run with.
func (p hedgingParams) checkFlags() error {
	var c flagCheck
	// !(x > lo && x < hi) rather than x <= lo || x >= hi: a NaN fails it.
	if p.calls < 100 || p.workers < 1 || !(p.slowPct > 0 && p.slowPct < 50) || !(p.percentile > 0 && p.percentile < 1) {
		c.failf("--calls must be at least 100, --workers at least 1, --slow-pct in (0, 50), --percentile in (0, 1)")
	}
	notAbove(&c, "calls", p.calls, closed(100, hedgeMaxCalls))
	notAbove(&c, "workers", p.workers, closed(1, 10_000))
	within(&c, "fast", p.fast, above(0, maxWait))
	within(&c, "slow", p.slow, above(0, maxWait))
	within(&c, "min-delay", p.minDelay, closed(0, maxWait))
	within(&c, "overload-503-pct", p.overPct, closed(0, 100.0))
	within(&c, "overload-latency", p.overSlow, above(0, maxWait))
	return c.err()
}

func (p hedgingParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "hedging", Title: fmt.Sprintf("a dependency answering in %v, %.0f %% of calls in %v: hedged after p%.0f (at least %v), then overloaded (%.0f %% 503 with Retry-After, the rest in %v)",
		p.fast, p.slowPct, p.slow, p.percentile*100, p.minDelay, p.overPct, p.overSlow)}
	var rows []hedgingRow
	for i, c := range []struct{ hedge, over bool }{{false, false}, {true, false}, {false, true}, {true, true}} {
		env.Progress("hedging: row %d/4", i+1)
		row, err := p.runRow(ctx, env.Seed+uint64(i), c.hedge, c.over)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
		label := "plain"
		if c.hedge {
			label = "hedged"
		}
		if c.over {
			label += ", overloaded"
		}
		r.add(label, Bool("hedging", c.hedge).jsonOnly(), Bool("overloaded", c.over).jsonOnly(),
			Ms("p50_ms", row.p50).Named("p50"), Ms("p99_ms", row.p99).Named("p99"),
			Float("extra_requests_pct", row.extraPct, 1).Named("extra_requests_%"),
			Int("calls", int(row.calls)), Int("server_requests", int(row.requests)),
			Ms("timer_lateness_p99_ms", row.late.p99).jsonOnly())
	}
	p.checks(r, rows)
	r.note("the delay is p90, not p95: with exactly 5 %% of calls in the tail, p95 sits on the tail's edge (500ms) and a hedge sent then is too late to help")
	r.note("each row starts with %d calls it does not measure, so that the hedge delay has a percentile to start from", hedgeWarmup)
	var worst lateness
	for _, row := range rows {
		worst = worst.worse(row.late)
	}
	r.note("timer lateness alongside the calls %s (worst row; a row is timed when its p99 is <= %v and its CPU wait, where known, <= %.0f%%)", worst, quietBound, 100*maxCPUWait)
	r.note("hedges spend the retry budget (10 %%) and pause for 10 s after a 503 or a Retry-After; calls are not retried (1 attempt), so every extra request is a hedge")
	return r, nil
}

// checks judges the four rows: plain, hedged, plain overloaded, hedged
// overloaded.
func (p hedgingParams) checks(r *Result, rows []hedgingRow) {
	plain, hedged, hedgedOver := rows[0], rows[1], rows[3]
	// The tail and the hedges it sends are timings: on a machine too busy
	// to time, they measure the scheduler, not the hedge (a late timer
	// fires a hedge as a slow answer does). The extra requests under
	// overload are judged whatever the machine did: the 503s pause the
	// hedges, however late.
	pre := (&timing{}).needQuiet("plain", plain.late).needQuiet("hedged", hedged.late)
	ratio := float64(plain.p99) / float64(max(hedged.p99, 1))
	r.timed(pre, ratio >= 3, "p99 at least 3x lower with hedging", "p99 %s plain, %s hedged: %.1fx lower", fmtDur(plain.p99), fmtDur(hedged.p99), ratio)
	r.timed(pre, hedged.extraPct <= 10, "at most 10 % extra requests", "%.1f %% extra requests (%d requests for %d calls)", hedged.extraPct, hedged.requests, hedged.calls)
	r.check(hedgedOver.extraPct <= 1, "at most 1 % extra requests under overload", "%.1f %% extra requests (%d requests for %d calls): hedging paused on the 503s",
		hedgedOver.extraPct, hedgedOver.requests, hedgedOver.calls)
}

func (p hedgingParams) runRow(ctx context.Context, seed uint64, hedge, overloaded bool) (hedgingRow, error) {
	srv := &tailServer{p: p, overloaded: overloaded, rnd: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	s, err := serve(srv)
	if err != nil {
		return hedgingRow{}, err
	}
	defer s.Close()
	cfg := guardhttp.Config{Name: "hedging", Retry: guardrail.Retry{MaxAttempts: 1}, Breakers: noBreakers()}
	if hedge {
		cfg.Hedge = &guardrail.HedgeConfig{Percentile: p.percentile, Delay: p.minDelay}
	}
	tr := mustTransport(newBaseTransport(true), cfg)
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	// drive makes n calls, --workers at a time, and records each one's
	// latency in lat, when it is not nil.
	drive := func(n int, lat []time.Duration) {
		var next atomic.Int64
		var wg sync.WaitGroup
		for range min(p.workers, n) {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= n || ctx.Err() != nil {
						return
					}
					start := time.Now()
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, _ = get(cctx, client, s.URL)
					cancel()
					if lat != nil {
						lat[i] = time.Since(start)
					}
				}
			})
		}
		wg.Wait()
	}
	// Warm up first, unmeasured: an adaptive delay knows no percentile
	// before it has seen 20 answers, and a long-running service is past
	// that.
	drive(hedgeWarmup, nil)
	warm := srv.requests.Load()

	lat := make([]time.Duration, p.calls)
	probe := probeQuiet(ctx)
	defer probe.stop()
	drive(p.calls, lat)
	late := probe.stop()
	if err := ctx.Err(); err != nil {
		return hedgingRow{}, err
	}
	slices.Sort(lat)
	row := hedgingRow{hedging: hedge, overloaded: overloaded, calls: int64(p.calls), requests: srv.requests.Load() - warm, late: late}
	row.p50 = lat[len(lat)/2]
	row.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	row.extraPct = float64(row.requests-row.calls) / float64(row.calls) * 100
	return row, nil
}
