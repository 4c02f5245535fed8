package lab

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/sim"
)

type jitterParams struct {
	clients, capacity, attempts int
	slot, base, cap, plus       time.Duration
	fineSlot                    time.Duration
	strategies                  string
	seed                        uint64
}

func jitter() Experiment {
	return bound(Experiment{
		Name:    "jitter",
		Light:   true,
		Summary: "1,000 clients failing together against a server of limited capacity: which backoff breaks the herd (a simulation)",
		bind: func(fs *flag.FlagSet, quick bool) flagged {
			p := jitterParams{clients: sim.DefaultClients, capacity: sim.DefaultCapacity, attempts: sim.DefaultMaxAttempts,
				slot: sim.DefaultSlot, base: 100 * time.Millisecond, cap: 10 * time.Second, plus: 100 * time.Millisecond,
				fineSlot: 10 * time.Millisecond, strategies: strings.Join(sim.Strategies(), ",")}
			fs.IntVar(&p.clients, "clients", p.clients, "clients failing together at t=0")
			fs.IntVar(&p.capacity, "capacity", p.capacity, "requests the server serves per slot; it answers 503 beyond")
			fs.DurationVar(&p.slot, "slot", p.slot, "the server's capacity slot")
			fs.DurationVar(&p.fineSlot, "fine-slot", p.fineSlot, "slot of the second table, at the same rate (0: no second table)")
			fs.IntVar(&p.attempts, "max-attempts", p.attempts, "attempts per client, counting the first")
			fs.DurationVar(&p.base, "base", p.base, "backoff base")
			fs.DurationVar(&p.cap, "cap", p.cap, "backoff cap")
			fs.DurationVar(&p.plus, "plus-jitter", p.plus, "the additive jitter of the '+0..100ms' helper")
			fs.StringVar(&p.strategies, "strategies", p.strategies, "comma-separated rows: "+strings.Join(sim.Strategies(), ", "))
			fs.Uint64Var(&p.seed, "seed", 0, "seed of the draws (0: the lab's --seed)")
			return &p
		},
	})
}

// Bounds of the jitter experiment's flags.
const (
	// jitterMaxClients bounds --clients: the simulation holds each
	// client's state, about 200 bytes (10 million took 2 GB).
	jitterMaxClients = 1_000_000
	// jitterMaxCalls bounds clients x attempts, the calls a row can
	// simulate at most: each is an event of the simulation (a million
	// clients of 10 attempts took 30 s for the five strategies).
	jitterMaxCalls = 10_000_000
	// jitterMaxSlots bounds the slots a row can span, (attempts - 1) x
	// (cap + plus-jitter) / slot: the charts have a point per slot.
	jitterMaxSlots = 1_000_000
	// jitterMaxSlot bounds --slot: times --capacity it must fit in an
	// int64 (the second table's capacity), with room.
	jitterMaxSlot = time.Minute
)

// checkFlags reports every flag the simulation cannot run with.
func (p jitterParams) checkFlags() error {
	var c flagCheck
	// sim.Config reads zero as its default; a flag of 0 means 0, which
	// the simulation cannot run.
	if p.clients < 1 || p.capacity < 1 || p.attempts < 1 {
		c.failf("--clients, --capacity and --max-attempts must be at least 1, not %d, %d and %d", p.clients, p.capacity, p.attempts)
	}
	notAbove(&c, "clients", p.clients, closed(1, jitterMaxClients))
	notAbove(&c, "capacity", p.capacity, closed(1, sim.ClientsLimit))
	notAbove(&c, "max-attempts", p.attempts, closed(1, sim.AttemptsLimit))
	if p.slot <= 0 || p.base <= 0 || p.cap <= 0 {
		c.failf("--slot, --base and --cap must be positive, not %v, %v and %v", p.slot, p.base, p.cap)
	}
	notAbove(&c, "slot", p.slot, above(0, jitterMaxSlot))
	notAbove(&c, "base", p.base, above(0, maxRun))
	notAbove(&c, "cap", p.cap, above(0, maxRun))
	if p.fineSlot < 0 {
		c.failf("--fine-slot must not be negative, not %v", p.fineSlot)
	}
	notAbove(&c, "fine-slot", p.fineSlot, closed(0, jitterMaxSlot))
	within(&c, "plus-jitter", p.plus, closed(0, maxRun)) // 0: sim's default
	if len(c.msgs) > 0 {
		return c.err() // the products below need the factors in range
	}
	if calls := float64(p.clients) * float64(p.attempts); calls > jitterMaxCalls {
		c.failf("--clients x --max-attempts is %.0f calls; want at most %d", calls, jitterMaxCalls)
	}
	plus := p.plus
	if plus == 0 {
		plus = sim.DefaultPlusJitter
	}
	horizon := float64(p.attempts-1) * float64(max(p.cap, p.base)+plus)
	for _, s := range []struct {
		name string
		slot time.Duration
	}{{"slot", p.slot}, {"fine-slot", p.fineSlot}} {
		if s.slot > 0 && horizon/float64(s.slot) > jitterMaxSlots {
			c.failf("--%s is %v; want at least %v, so that a run of (--max-attempts - 1) x (--cap + --plus-jitter) spans at most %d slots",
				s.name, s.slot, time.Duration(math.Ceil(horizon/jitterMaxSlots)), jitterMaxSlots)
		}
	}
	if err := checkList("strategies", p.strategies); err != nil {
		c.failf("%s", err)
		return c.err()
	}
	for name := range strings.SplitSeq(p.strategies, ",") {
		if _, _, err := sim.NewStrategy(name, p.base, p.cap, p.plus); err != nil {
			c.failf("--strategies: %s", strings.TrimPrefix(err.Error(), "sim: "))
		}
	}
	return c.err()
}

func (p jitterParams) run(ctx context.Context, env *Env) (*Result, error) {
	seed := p.seed
	if seed == 0 {
		seed = env.Seed
	}
	names := strings.Split(p.strategies, ",")
	cfg := sim.JitterConfig{
		Config: sim.Config{Clients: p.clients, Slot: p.slot, Capacity: p.capacity, MaxAttempts: p.attempts, Seed: seed},
		Base:   p.base, Cap: p.cap, PlusJitter: p.plus, Strategies: names,
	}
	r := &Result{Experiment: "jitter", Title: fmt.Sprintf("%d clients failing together at t=0 against a server of %d requests per %v slot: the herd each backoff makes (simulation)", p.clients, p.capacity, p.slot)}
	env.Progress("jitter: simulating %d strategies", len(names))
	rows, err := sim.Jitter(ctx, cfg)
	if errors.Is(err, sim.ErrConfig) {
		return nil, flagErrorf("%s", strings.TrimPrefix(err.Error(), "sim: "))
	}
	if err != nil {
		return nil, err
	}
	p.table(r, rows, "", p.slot)
	byName := map[string]sim.Result{}
	for _, row := range rows {
		byName[row.Strategy] = row.Result
	}

	if none, ok := byName[sim.StrategyNone]; ok {
		// Without jitter every wave lands in one slot: calls and finish time
		// follow from arithmetic, and the simulation must agree.
		wantCalls, waves, done := 0, 0, time.Duration(0)
		for n := p.clients; n > 0 && waves < p.attempts; n -= p.capacity {
			wantCalls += n
			if waves > 0 {
				done += min(p.cap, shiftSat(p.base, waves-1))
			}
			waves++
		}
		r.check(none.TotalCalls == wantCalls && none.AllDoneAt == done, "no jitter moves in waves",
			"%d calls, done at %v; arithmetic says %d and %v", none.TotalCalls, none.AllDoneAt, wantCalls, done)
		for _, name := range names {
			res, ok := byName[name]
			if !ok || name == sim.StrategyNone {
				continue
			}
			r.check(res.TotalCalls < none.TotalCalls && res.AllDoneAt*4 <= none.AllDoneAt, "jitter breaks the waves",
				"%s: %d calls done at %s, against %d at %s without jitter", name, res.TotalCalls, fmtDur(res.AllDoneAt), none.TotalCalls, fmtDur(none.AllDoneAt))
		}
	}
	if plus, ok := byName[sim.StrategyPlus]; ok && p.plus <= p.slot && p.base == p.slot {
		r.check(plus.RetryPeak >= p.clients-p.capacity, "a small additive jitter keeps the herd",
			"+0..%v: retry peak %d per slot (the whole first wave, %d, lands in one slot)", p.plus, plus.RetryPeak, p.clients-p.capacity)
	}
	r.note("Reference figures for this scenario: no jitter 5500 calls, peak 900, done 32.7s; +0..100ms 3711/900/3.5s; equal 3591/597/1.4s; full 3395/419/2.5s.")
	r.note("With base = slot = 100ms the first equal- and full-jitter retries fall inside slot 0, already used by the first calls,")
	r.note("so their first wave is refused whole; no slotted model reaches the reference's 597/419 peaks. Decorrelated jitter never")
	r.note("waits less than base and avoids it. The second table keeps the rate but cuts the slot: full jitter's spread then pays.")

	if p.fineSlot > 0 && p.fineSlot < p.slot && p.slot%p.fineSlot == 0 {
		fine := cfg
		fine.Slot = p.fineSlot
		fine.Capacity = max(1, int(int64(p.capacity)*int64(p.fineSlot)/int64(p.slot)))
		env.Progress("jitter: the same rate in %v slots", p.fineSlot)
		frows, err := sim.Jitter(ctx, fine)
		if err != nil {
			return nil, err
		}
		p.table(r, frows, fmt.Sprintf(" (%v slots)", p.fineSlot), p.fineSlot)
	}
	return r, nil
}

// table adds rows and the retries-per-slot charts.
func (p jitterParams) table(r *Result, rows []sim.Row, suffix string, slot time.Duration) {
	for _, row := range rows {
		res := row.Result
		r.add(row.Label+suffix,
			Str("strategy", row.Strategy).jsonOnly(),
			Int("total_calls", res.TotalCalls).As("total_calls", "%5d"),
			Int("retry_peak_per_slot", res.RetryPeak).As("retry_peak/slot", "%4d"),
			Int("gave_up", res.GaveUp).As("gave_up", "%4d"),
			Ms("all_done_at_ms", res.AllDoneAt))
	}
	r.Charts = append(r.Charts, jitterCharts(rows, suffix, slot)...)
}

// jitterCharts draws the retries in each slot of every row, up to the
// slot after the last row is done (no jitter's waves run longest), on a
// time axis. When the jittered rows are all done in under a quarter of
// that, a second chart zooms on their span, where the full one squeezes
// them against its left edge.
func jitterCharts(rows []sim.Row, suffix string, slot time.Duration) []Chart {
	var all, jittered time.Duration
	for _, row := range rows {
		all = max(all, row.Result.AllDoneAt)
		if row.Strategy != sim.StrategyNone {
			jittered = max(jittered, row.Result.AllDoneAt)
		}
	}
	chart := func(title string, horizon time.Duration) Chart {
		horizon = max(horizon+slot, 5*slot)
		n := int(horizon / slot)
		c := Chart{Title: title, Kind: "line", XLabel: "time (s)", YLabel: "retries in the slot"}
		for i := range n {
			c.XValues = append(c.XValues, (time.Duration(i) * slot).Seconds())
		}
		for _, row := range rows {
			vals := make([]float64, n)
			for _, s := range row.Result.Slots {
				if s.Index < int64(n) {
					vals[s.Index] = float64(s.Retries)
				}
			}
			c.Series = append(c.Series, Series{Name: row.Label, Values: vals})
		}
		return c
	}
	name := "retries per " + slot.String() + " slot" + suffix
	charts := []Chart{chart(name, all)}
	if jittered > 0 && jittered*4 < all {
		zoom := chart("", jittered)
		zoom.Title = fmt.Sprintf("%s, the first %gs (where the jittered rows are done)", name, zoom.XValues[len(zoom.XValues)-1])
		charts = append(charts, zoom)
	}
	return charts
}
