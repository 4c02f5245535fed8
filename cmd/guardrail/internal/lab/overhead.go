package lab

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"time"

	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/guardhttp"
)

type overheadParams struct {
	rounds int
	block  int
}

func overhead() Experiment {
	return bound(Experiment{
		Name:    "overhead",
		Summary: "what guarding costs: a plain http.Client and guardhttp.NewClient on one loopback server, in alternating blocks",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := overheadParams{rounds: 200, block: 50}
			if quick {
				p.rounds = 40
			}
			fs.IntVar(&p.rounds, "rounds", p.rounds, "rounds: each client sends one block per round")
			fs.IntVar(&p.block, "block", p.block, "requests per block")
			return &p
		},
	})
}

// overheadClient is one way of sending the same GET.
type overheadClient struct {
	label    string
	client   *http.Client
	ctx      context.Context
	headers  bool // the request carries the deadline headers, ready-made
	base     int  // index of the client it is compared with
	blocks   []time.Duration
	allocs   float64
	failures int
}

// overheadMaxRequests bounds --rounds x --block, the requests each of the
// four clients sends (the default sends 10,000).
const overheadMaxRequests = 10_000_000

// checkFlags reports every flag the experiment cannot run with.
func (p overheadParams) checkFlags() error {
	var c flagCheck
	if p.rounds < 1 || p.block < 1 {
		c.failf("--rounds and --block must be positive")
	}
	notAbove(&c, "rounds", p.rounds, closed(1, overheadMaxRequests))
	notAbove(&c, "block", p.block, closed(1, overheadMaxRequests))
	if len(c.msgs) == 0 && p.rounds*p.block > overheadMaxRequests { // both at most 1e7: no overflow
		c.failf("--rounds x --block is %d requests per client; want at most %d", p.rounds*p.block, overheadMaxRequests)
	}
	return c.err()
}

func (p overheadParams) run(ctx context.Context, env *Env) (*Result, error) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	withDeadline, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	// The headers a plain client would send, made once: what sending them
	// costs, not what making them does.
	ready := http.Header{}
	deadline.Set(ready, time.Now(), time.Hour)
	newGuard := func() (*http.Client, error) { return guardhttp.NewClient(guardhttp.Config{}) }
	g1, err := newGuard()
	if err != nil {
		return nil, err
	}
	g2, err := newGuard()
	if err != nil {
		return nil, err
	}
	clients := []*overheadClient{
		{label: "plain http.Client", client: &http.Client{Transport: plainTransport()}, ctx: ctx},
		{label: "guardhttp.NewClient", client: g1, ctx: ctx},
		{label: "plain+headers (1h deadline)", client: &http.Client{Transport: plainTransport()}, ctx: withDeadline, headers: true},
		{label: "guardhttp (1h deadline)", client: g2, ctx: withDeadline, base: 2},
	}
	for _, c := range clients {
		defer c.client.CloseIdleConnections()
	}
	send := func(c *overheadClient, n int) error {
		for range n {
			req, err := http.NewRequestWithContext(c.ctx, http.MethodGet, srv.URL, nil)
			if err != nil {
				return err
			}
			if c.headers {
				req.Header = ready // read only, by the transport
			}
			resp, err := c.client.Do(req)
			if err != nil {
				c.failures++
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				c.failures++
			}
		}
		return nil
	}
	// Warm each client's connection and pools, then count what one request
	// allocates, the in-process server's share included (the same for all).
	const counted = 1000
	for _, c := range clients {
		if err := send(c, 500); err != nil {
			return nil, err
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		if err := send(c, counted); err != nil {
			return nil, err
		}
		runtime.ReadMemStats(&after)
		c.allocs = float64(after.Mallocs-before.Mallocs) / counted
	}
	// Rounds: each client sends one block in turn, so that all see the
	// machine at almost the same moment; a ratio per round, and their
	// median, is steadier than one between runs seconds apart.
	for i := range p.rounds {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		env.Progress("round %d/%d", i+1, p.rounds)
		for k := range clients {
			c := clients[(i+k)%len(clients)] // which goes first rotates
			start := time.Now()
			if err := send(c, p.block); err != nil {
				return nil, err
			}
			c.blocks = append(c.blocks, time.Since(start))
		}
	}

	r := &Result{Experiment: "overhead", Title: "what guarding a call costs, on loopback where a request is cheapest"}
	chart := Chart{Title: "time per request on loopback", Kind: "bar", YLabel: "µs per request"}
	series := Series{Name: "µs per request", NotJudged: make([]bool, len(clients))}
	per := func(d time.Duration) float64 { return float64(d) / float64(p.block) / 1e3 }
	var checks []Check // the guarded rows', after the table's
	for i, c := range clients {
		// The median block: a block that a GC cycle or another process
		// slowed would pull a mean up.
		pers := make([]float64, len(c.blocks))
		for j, b := range c.blocks {
			pers[j] = per(b)
		}
		slices.Sort(pers)
		us := pers[len(pers)/2]
		cols := []Col{Float("us_per_request", us, 1).Named("µs/request")}
		if i != c.base {
			base := clients[c.base]
			ratios := make([]float64, len(c.blocks))
			for j := range c.blocks {
				ratios[j] = per(c.blocks[j]) / per(base.blocks[j])
			}
			slices.Sort(ratios)
			slower := Float("slower_pct", 100*(ratios[len(ratios)/2]-1), 1).As("vs "+baseName(c.base), "%+.1f%%")
			extra := Float("extra_allocs", c.allocs-base.allocs, 1).As("allocs", "%+.1f")
			if i == 1 || i == 3 { // the guarded rows: held to the targets
				wall := wallCheck(c.label+" within "+overheadTarget+" of "+baseName(c.base)+" (wall time)", ratios)
				mem := allocCheck(c.label+" allocates at most 10 more per request than "+baseName(c.base), c.allocs, base.allocs)
				slower, extra = slower.judgedAs(wall.Verdict), extra.judgedAs(mem.Verdict)
				series.NotJudged[i] = wall.Verdict == NotJudged || mem.Verdict == NotJudged
				checks = append(checks, wall, mem)
			}
			cols = append(cols, slower, extra)
		}
		cols = append(cols, Float("allocs_per_request", c.allocs, 1).Named("allocs/request").jsonOnly(), Int("failed", c.failures).jsonOnly())
		r.add(c.label, cols...)
		chart.X = append(chart.X, c.label)
		series.Values = append(series.Values, us)
	}
	chart.Series = []Series{series}
	r.Charts = append(r.Charts, chart)
	r.Checks = append(r.Checks, checks...)

	failed := 0
	for _, c := range clients {
		failed += c.failures
	}
	r.check(failed == 0, "every request answered", "%d of %d failed", failed, len(clients)*(p.rounds*p.block+500+counted))

	r.note("µs/request: the median block's. vs: the median over rounds of the ratio of a round's block times (each round sends a block of %s with each client in turn; %s): on a shared machine the load drifts by more than the differences measured here, and single rounds swing by several points. allocs: the extra allocations per request over the same client.", plural(p.block, "request"), plural(p.rounds, "round"))
	r.note("guardhttp's row includes the whole guard: the retry engine, the per-host breaker, the retry budget, and the connect, TLS, write, response-header and body-idle timeouts (one timer per attempt, trace hooks and a cancellable context per attempt, see docs/http-client.md). The lab holds it to at most 1.25x of its baseline (it costs about 1.13x on loopback; the 1.25x guards against regressions, see docs/http-client.md) and at most 10 allocations more; the mark beside each number is its check's.")
	r.note("with a deadline, guardhttp also sends X-Request-Timeout and X-Request-Deadline; plain+headers sends the same two headers, made once, so that its row against plain is what the headers cost the wire and the server, and guardhttp's against it what making them per attempt costs (a copy of the request and of its header map, since the caller's is never modified, a clock read, two numbers formatted).")
	r.note("allocations are counted over %d sequential requests per client after a warm-up, the in-process server's included (the same for every client). A wall time is the median round's, judged with its uncertainty: it passes when 2 standard errors above it are within 1.25x, fails when 2 below it are over; in between the rounds are too noisy to tell, and it is not judged, as with fewer than %d rounds or a race-detector build.", counted, wallMinRounds)
	r.note("a request to a dependency one network round trip away costs hundreds of µs: the same absolute overhead is then well under 1%%.")
	return r, nil
}

// plainTransport is the plain client's pool: what NewClient builds for
// itself (HTTP/2 when offered, 64 idle connections per host, proxies from
// the environment, a bounded dial and TLS handshake), without the guard.
func plainTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: guardhttp.DefaultConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * guardhttp.DefaultMaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   guardhttp.DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   guardhttp.DefaultTLSHandshakeTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// overheadTarget is the wall time a guarded row may take against its
// baseline, wallTarget as the tables write it. It guards against
// regressions: guardhttp costs about 1.13x a plain client on loopback
// (docs/http-client.md, Performance, says why the 1.10x design target is
// not met without leaning on net/http's internals), so the lab fails
// only when it is clearly past 1.25x.
const (
	overheadTarget = "1.25x"
	wallTarget     = 1.25
	// wallMinRounds is the fewest rounds whose ratios can judge a wall
	// time: with fewer, one slow round moves a quartile.
	wallMinRounds = 20
)

// wallCheck holds a guarded row's per-round time ratios against its
// baseline (sorted) to the target. Loopback times on a shared machine
// swing by several points between rounds, so the median is judged with
// its uncertainty: it passes when even two standard errors above it are
// within the target, fails when two below it are over, and is not judged
// in between, where the rounds cannot tell. The standard error of a median
// is about 1.25 sigma / sqrt(n), sigma estimated from the interquartile
// range (1.35 sigma for a normal spread), which a few wild rounds do not
// inflate. A race build is not judged either: its instrumentation is not
// a normal build's cost; nor are too few rounds to have quartiles.
func wallCheck(name string, ratios []float64) Check {
	c := Check{Name: name}
	n := len(ratios)
	if n == 0 {
		c.Verdict, c.Detail = NotJudged, "no rounds"
		return c
	}
	med, lo, hi := ratios[n/2], ratios[n/4], ratios[(3*n)/4]
	se := 1.2533 * (hi - lo) / 1.349 / math.Sqrt(float64(n))
	pct := func(r float64) string { return fmt.Sprintf("%+.1f%%", 100*(r-1)) } // as the table writes it
	c.Detail = fmt.Sprintf("median round %s ± %.1f points (2 standard errors; quartiles %s..%s over %s); want at most +%.0f%%",
		pct(med), 200*se, pct(lo), pct(hi), plural(n, "round"), 100*(wallTarget-1))
	switch {
	case raceEnabled:
		c.Verdict, c.Detail = NotJudged, "built with the race detector, which slows every client by its own amount: "+c.Detail
	case n < wallMinRounds:
		c.Verdict, c.Detail = NotJudged, fmt.Sprintf("fewer than %d rounds: ", wallMinRounds)+c.Detail
	case med+2*se <= wallTarget:
		c.Verdict = Pass
	case med-2*se > wallTarget:
		c.Verdict = Fail
	default:
		c.Verdict, c.Detail = NotJudged, "too noisy to tell against the target: "+c.Detail
	}
	return c
}

// allocCheck holds a guarded row's allocations per request to at most 10
// more than its baseline's.
func allocCheck(name string, allocs, base float64) Check {
	c := Check{Name: name, Verdict: Fail, Detail: fmt.Sprintf("%.1f allocations per request against %.1f", allocs, base)}
	switch {
	case raceEnabled:
		c.Verdict = NotJudged
		c.Detail = "built with the race detector, which drops sync.Pool's objects at random: " + c.Detail + " are not a normal build's"
	case allocs-base <= 10:
		c.Verdict = Pass
	}
	return c
}

func baseName(i int) string {
	if i == 0 {
		return "plain"
	}
	return "plain+headers"
}
