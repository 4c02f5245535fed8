package lab

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// ampParams are the amplification experiment's flags.
type ampParams struct {
	tiers    int
	attempts int
	users    int
	over     time.Duration
	ratio    float64
	base     time.Duration
	dbMode   string
	// transport is what the tiers speak: http or grpc.
	transport string
}

func amplification() Experiment {
	return bound(Experiment{
		Name:    "amplification",
		Summary: "retries at every tier of a call chain multiply the load on a dead database; retrying at one tier, a retry budget and a breaker do not",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := ampParams{tiers: 3, attempts: 4, users: 1000, over: 2 * time.Second, ratio: 0.1, base: time.Millisecond, dbMode: "reset", transport: "http"}
			if quick {
				p.users, p.over = 300, 600*time.Millisecond
			}
			fs.IntVar(&p.tiers, "tiers", p.tiers, "services between the user and the DB (BFF, order-service, data-service)")
			fs.IntVar(&p.attempts, "attempts", p.attempts, "attempts per tier when a tier retries (1 call + retries)")
			fs.IntVar(&p.users, "users", p.users, "user requests in the budget rows")
			fs.DurationVar(&p.over, "over", p.over, "spread the timed rows' user requests evenly over this long")
			fs.Float64Var(&p.ratio, "budget", p.ratio, "retry budget ratio at the tier nearest the DB")
			fs.DurationVar(&p.base, "base", p.base, "full-jitter backoff base (a longer one only makes the run slower: the counts do not depend on it)")
			fs.StringVar(&p.dbMode, "db", p.dbMode, "how the DB is down: reset (accepts and resets, counted by the DB) or refused (nothing listens, counted at the data-service's dialer)")
			fs.StringVar(&p.transport, "transport", p.transport, "what the tiers speak: http (net/http servers, guardhttp clients) or grpc (gRPC servers, guardgrpc clients)")
			return &p
		},
	})
}

// Bounds of the amplification experiment's flags.
const (
	ampMaxTiers = 10
	// ampMaxCalls bounds attempts^tiers, the DB calls of the row where
	// every tier retries: one user's request, sent once.
	ampMaxCalls = 1_000_000
	ampMaxUsers = 100_000
)

// checkFlags reports every flag the experiment cannot run with.
func (p ampParams) checkFlags() error {
	var c flagCheck
	if p.tiers < 1 || p.attempts < 1 || p.users < 1 {
		c.failf("--tiers, --attempts and --users must be at least 1, not %d, %d and %d", p.tiers, p.attempts, p.users)
	}
	notAbove(&c, "tiers", p.tiers, closed(1, ampMaxTiers))
	notAbove(&c, "attempts", p.attempts, closed(1, maxAttemptsFlag))
	notAbove(&c, "users", p.users, closed(1, ampMaxUsers))
	if p.tiers >= 1 && p.tiers <= ampMaxTiers && p.attempts >= 1 && p.attempts <= maxAttemptsFlag {
		if calls := pow(p.attempts, p.tiers); calls > ampMaxCalls {
			c.failf("--attempts ^ --tiers is %d^%d = %.0f DB calls for one user; want at most %d", p.attempts, p.tiers, calls, ampMaxCalls)
		}
	}
	within(&c, "over", p.over, closed(0, maxRun))
	// The spread rows start a goroutine per user, users/over a second.
	if p.over > 0 && p.over <= maxRun && p.users >= 1 && p.users <= ampMaxUsers {
		if rate := float64(p.users) / p.over.Seconds(); rate > maxRPS {
			c.failf("--users / --over is %.0f requests per second; want at most %d", rate, maxRPS)
		}
	}
	within(&c, "budget", p.ratio, closed(0, 1000.0)) // the budget package's bound; 0: no budget
	// The backoff's cap is 100x the base; a zero base would be the backoff
	// package's default.
	within(&c, "base", p.base, above(0, maxWait/100))
	if p.dbMode != "reset" && p.dbMode != "refused" {
		c.failf("--db must be reset or refused, not %q", p.dbMode)
	}
	if p.transport != "http" && p.transport != "grpc" {
		c.failf("--transport must be http or grpc, not %q", p.transport)
	}
	return c.err()
}

func (p ampParams) run(ctx context.Context, env *Env) (*Result, error) {
	r := &Result{Experiment: "amplification", Title: fmt.Sprintf("%d tiers of services in front of a dead database: the database calls one user request costs", p.tiers)}
	scenario := p.scenario
	if p.transport == "grpc" {
		r.Title += ", over gRPC"
		scenario = p.grpcScenario
	}
	rows := []struct {
		label string
		all   bool    // every tier retries (else only the one nearest the DB)
		ratio float64 // 0: no budget
		users int
		over  time.Duration
		// breaker: the nearest tier keeps guardrail's default breaker.
		breaker bool
	}{
		{fmt.Sprintf("every tier 1+%d retries", p.attempts-1), true, 0, 1, 0, false},
		{"retry only at the tier nearest the DB", false, 0, 1, 0, false},
		{fmt.Sprintf("nearest tier + retry budget %g%%, one user at a time", p.ratio*100), false, p.ratio, p.users, 0, false},
		{fmt.Sprintf("nearest tier + retry budget %g%%, users spread over %v", p.ratio*100, p.over), false, p.ratio, p.users, p.over, false},
		{fmt.Sprintf("nearest tier, no budget, users spread over %v", p.over), false, 0, p.users, p.over, false},
		{fmt.Sprintf("nearest tier + budget %g%% + default breaker, users spread over %v", p.ratio*100, p.over), false, p.ratio, p.users, p.over, true},
	}
	var labels []string
	var perUser []float64
	budgetPer := 0.0
	for i, row := range rows {
		env.Progress("amplification: row %d/%d: %s, %d users", i+1, len(rows), row.label, row.users)
		var peak inFlight
		calls, err := scenario(ctx, row.all, row.ratio, row.users, row.over, row.breaker, &peak)
		if err != nil {
			return nil, err
		}
		per := float64(calls) / float64(row.users)
		cols := []Col{Str("transport", p.transport), Int("users", row.users)}
		if row.over > 0 {
			cols = append(cols, Ms("over_ms", row.over).As("over", "ms"))
		}
		cols = append(cols, Int("db_calls", int(calls)), Float("per_user", per, 2))
		if row.breaker {
			cols[len(cols)-1] = Float("per_user", per, 3)
		}
		r.add(row.label, cols...)
		labels = append(labels, fmt.Sprintf("%s (%s)", row.label, plural(row.users, "user")))
		perUser = append(perUser, per)

		want := float64(p.attempts)
		switch {
		case row.breaker:
			judgeBreakerRow(r, calls, per, budgetPer, peak.peak.Load())
		case row.all:
			want = pow(p.attempts, p.tiers)
			r.check(per == want, "retries at every tier multiply", "%.2f DB calls per user, want %d^%d = %.0f", per, p.attempts, p.tiers, want)
		case row.ratio == 0:
			r.check(per == want, "one retrying tier", "%.2f DB calls per user, want %d", per, p.attempts)
		default:
			budgetPer = per
			// The bucket starts with 10 tokens and earns ratio per user.
			ceiling := 1 + row.ratio + 10/float64(row.users) + 0.2
			r.check(per <= ceiling && per >= 1, "budget caps retries", "%.2f DB calls per user, want at most %.2f (1 + ratio + initial tokens, +0.2 margin)", per, ceiling)
		}
	}
	if p.dbMode == "reset" {
		r.note("db_calls are counted by the DB, which accepts and resets every connection; per_user = db_calls / users.")
	} else {
		r.note("db_calls are refused connections, counted at the data-service's dialer (nothing listens); per_user = db_calls / users.")
	}
	if p.transport == "grpc" {
		r.note("Over gRPC the data-service opens a connection of its own for each attempt, as the HTTP one does for each call: on one long-lived")
		r.note("connection grpc-go fails attempts at once, without dialing, while it backs off reconnecting to a dead DB, which would not hear the retries.")
		r.note("The bounds are HTTP's: an attempt whose connection was refused or reset before the handshake had no stream, so grpc-go's transparent retry adds no call.")
	}
	r.Charts = append(r.Charts, ampChart(labels, perUser))
	return r, nil
}

// ampMaxInFlight is the most user calls the data-service may hold at once
// for the breaker row to be judged: the breaker trips once it has seen
// its minimum volume of outcomes, and every call already in flight then
// still reaches the DB. With more than this many at once, the machine was
// too slow for the calls to end before the next users came.
const ampMaxInFlight = 2 * breaker.DefaultMinRequests

// ampBreakerCheck is the name of the breaker row's check.
const ampBreakerCheck = "the breaker stops calling a dead DB"

// judgeBreakerRow checks the breaker row: calls DB calls, per per user,
// against budgetPer, the budget row's, with at most peak user calls in
// the data-service at once.
func judgeBreakerRow(r *Result, calls int64, per, budgetPer float64, peak int64) {
	const name = ampBreakerCheck
	// The breaker trips after its minimum volume and refuses the rest
	// without touching the DB; calls already in flight when it trips (and
	// their budgeted retries) still land.
	limit := 4 * breaker.DefaultMinRequests
	ok := calls <= int64(limit) && per < budgetPer
	if !ok && peak > ampMaxInFlight {
		r.notJudged(name, "%d DB calls (%.3f per user) with up to %d user calls in the data-service at once, more than the %d the check is judged with: the calls did not end before the next users came",
			calls, per, peak, ampMaxInFlight)
		return
	}
	r.check(ok, name, "%d DB calls (%.3f per user), want at most %d and fewer than the budget alone (%.2f)", calls, per, limit, budgetPer)
}

// inFlight counts the calls in a handler and keeps the most at once. It is
// safe for concurrent use.
type inFlight struct {
	now, peak atomic.Int64
}

// enter records a call's start and returns the function that records its
// end.
func (f *inFlight) enter() func() {
	n := f.now.Add(1)
	for {
		p := f.peak.Load()
		if n <= p || f.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return func() { f.now.Add(-1) }
}

// ampChart draws the DB calls per user of each row on a log scale: they
// span four decades, from 64 for retries at every tier down to a few
// hundredths behind a breaker.
func ampChart(labels []string, perUser []float64) Chart {
	return Chart{Title: "DB calls per user request (log scale)", Kind: "bar", X: labels, YLabel: "DB calls per user", LogY: true,
		Series: []Series{{Name: "per user", Values: perUser}}}
}

// plural returns n and noun, with an s unless n is 1.
// tierRetry is the retry settings of tier i (0 is nearest the DB), the
// same over HTTP and gRPC: one attempt, unless every tier retries or it
// is tier 0; an unlimited budget, unless ratio sets tier 0's; backoff
// from --base.
func (p ampParams) tierRetry(i int, allTiers bool, ratio float64) (guardrail.Retry, error) {
	r := guardrail.Retry{
		MaxAttempts:    1,
		MinAttemptTime: -1,
		Backoff:        backoff.FullJitter(p.base, 100*p.base),
		Budget:         budget.Unlimited(),
	}
	if allTiers || i == 0 {
		r.MaxAttempts = p.attempts
	}
	if ratio > 0 && i == 0 {
		var err error
		if r.Budget, err = budget.New(budget.Config{Ratio: ratio}); err != nil {
			return r, err
		}
	}
	return r, nil
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func pow(b, e int) float64 {
	v := 1.0
	for range e {
		v *= float64(b)
	}
	return v
}

// scenario builds tiers -> DB on loopback, sends users requests to the top
// tier and returns the DB calls the DB saw; peak counts the calls in the
// data-service.
func (p ampParams) scenario(ctx context.Context, allTiers bool, ratio float64, users int, over time.Duration, withBreaker bool, peak *inFlight) (int64, error) {
	var dbURL string
	var count func() int64
	var dialer *countingDialer
	switch p.dbMode {
	case "reset":
		db, err := listenReset()
		if err != nil {
			return 0, err
		}
		defer db.Close()
		dbURL, count = "http://"+db.Addr+"/query", db.calls.Load
	case "refused":
		addr, err := closedPort()
		if err != nil {
			return 0, err
		}
		dialer = &countingDialer{}
		dbURL, count = "http://"+addr+"/query", dialer.dials.Load
	}

	next := dbURL
	var servers []*server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	// Build from the DB up: tier 0 is the data-service, nearest the DB.
	for i := 0; i < p.tiers; i++ {
		cfg := guardhttp.Config{
			Name: fmt.Sprintf("tier%d", i),
			// The rows measure retries alone: breakers off unless the row
			// asks for guardrail's default one.
			Breakers: noBreakers(),
		}
		var err error
		if cfg.Retry, err = p.tierRetry(i, allTiers, ratio); err != nil {
			return 0, err
		}
		if withBreaker && i == 0 {
			cfg.Breakers = nil // guardhttp's default: one breaker per host
		}
		base := newBaseTransport(i != 0) // the DB gets a fresh connection per call
		if i == 0 && dialer != nil {
			base.DialContext = dialer.DialContext
		}
		client := &http.Client{Transport: mustTransport(base, cfg)}
		target := next
		var flight *inFlight
		if i == 0 {
			flight = peak
		}
		s, err := serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if flight != nil {
				defer flight.enter()()
			}
			if _, err := get(r.Context(), client, target); err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			_, _ = w.Write([]byte("ok"))
		}))
		if err != nil {
			return 0, err
		}
		servers = append(servers, s)
		next = s.URL + "/"
	}

	user := newHTTPClient(true)
	var wg sync.WaitGroup
	start := time.Now()
	for u := range users {
		if over > 0 {
			at := start.Add(time.Duration(int64(over) * int64(u) / int64(users)))
			if err := sleepUntil(ctx, at); err != nil {
				wg.Wait()
				return 0, err
			}
			wg.Go(func() { _, _ = get(ctx, user, next) })
			continue
		}
		if _, err := get(ctx, user, next); ctx.Err() != nil {
			return 0, err
		}
	}
	wg.Wait()
	return count(), ctx.Err()
}

// sleepUntil waits until t or until ctx ends.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
