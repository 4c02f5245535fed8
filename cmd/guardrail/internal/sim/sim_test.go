package sim

import (
	"context"
	"errors"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
)

func runOK(t *testing.T, cfg Config) Result {
	t.Helper()
	res, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	checkInvariants(t, cfg, res)
	return res
}

func jitter(t *testing.T, cfg JitterConfig) map[string]Result {
	t.Helper()
	rows, err := Jitter(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Jitter: %v", err)
	}
	out := make(map[string]Result, len(rows))
	for _, r := range rows {
		c := cfg.Config
		c.Backoff, _, _ = NewStrategy(r.Strategy, cfg.Base, cfg.Cap, cfg.PlusJitter)
		checkInvariants(t, c, r.Result)
		out[r.Strategy] = r.Result
	}
	return out
}

// checkInvariants asserts what must hold for every run: the server never
// serves more than a slot's capacity, and every count adds up.
func checkInvariants(t *testing.T, cfg Config, res Result) {
	t.Helper()
	slotLen := orDefault(cfg.Slot, DefaultSlot)
	maxAttempts := orDefault(cfg.MaxAttempts, DefaultMaxAttempts)
	var calls, retries, served, retryPeak, callPeak int
	prev := int64(-1)
	for _, s := range res.Slots {
		if s.Index <= prev {
			t.Fatalf("slot %d after slot %d: slots must be in increasing order", s.Index, prev)
		}
		prev = s.Index
		if s.Start != time.Duration(s.Index)*slotLen {
			t.Errorf("slot %d starts at %v, want %v", s.Index, s.Start, time.Duration(s.Index)*slotLen)
		}
		if s.Served > s.Capacity {
			t.Errorf("slot %d served %d > capacity %d", s.Index, s.Served, s.Capacity)
		}
		if got, want := s.Served, min(s.Calls, s.Capacity); got != want {
			t.Errorf("slot %d served %d, want min(calls %d, capacity %d)", s.Index, got, s.Calls, s.Capacity)
		}
		if s.Calls == 0 || s.Retries > s.Calls {
			t.Errorf("slot %d: calls %d, retries %d", s.Index, s.Calls, s.Retries)
		}
		calls += s.Calls
		retries += s.Retries
		served += s.Served
		retryPeak = max(retryPeak, s.Retries)
		callPeak = max(callPeak, s.Calls)
	}
	attempts := 0
	for id, a := range res.Attempts {
		if a < 1 || a > maxAttempts {
			t.Errorf("client %d made %d attempts, want 1..%d", id, a, maxAttempts)
		}
		attempts += a
	}
	checks := []struct {
		name      string
		got, want int
	}{
		{"clients", res.Clients, orDefault(cfg.Clients, DefaultClients)},
		{"attempts", len(res.Attempts), res.Clients},
		{"sum of slot calls", calls, res.TotalCalls},
		{"sum of client attempts", attempts, res.TotalCalls},
		{"sum of slot retries", retries, res.Retries},
		{"retries", res.Retries, res.TotalCalls - res.Clients},
		{"sum of slot served", served, res.Succeeded},
		{"succeeded+gave up", res.Succeeded + res.GaveUp, res.Clients},
		{"gave up by reason", res.GaveUpAttempts + res.GaveUpDeadline + res.GaveUpBudget, res.GaveUp},
		{"retry peak", res.RetryPeak, retryPeak},
		{"call peak", res.CallPeak, callPeak},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if n := len(res.Slots); n > 0 {
		last := res.Slots[n-1]
		if res.AllDoneAt < last.Start || res.AllDoneAt-last.Start >= slotLen {
			t.Errorf("all done at %v, outside the last slot [%v, %v)", res.AllDoneAt, last.Start, last.Start+slotLen)
		}
	}
}

// The default scenario without jitter is pure arithmetic: waves of 1000, 900,
// ..., 100 clients at 0, .1, .3, .7, 1.5, 3.1, 6.3, 12.7, 22.7 and 32.7 s.
func TestNoJitterIsPureArithmetic(t *testing.T) {
	res := runOK(t, Config{Backoff: backoff.Exponential(100*time.Millisecond, 10*time.Second)})
	if res.TotalCalls != 5500 || res.RetryPeak != 900 || res.GaveUp != 0 || res.AllDoneAt != 32700*time.Millisecond {
		t.Fatalf("total_calls=%d retry_peak=%d gave_up=%d all_done_at=%v, want 5500 900 0 32.7s",
			res.TotalCalls, res.RetryPeak, res.GaveUp, res.AllDoneAt)
	}
	waves := []int64{0, 1, 3, 7, 15, 31, 63, 127, 227, 327} // slot indices
	if len(res.Slots) != len(waves) {
		t.Fatalf("%d slots with calls, want %d: %+v", len(res.Slots), len(waves), res.Slots)
	}
	for i, s := range res.Slots {
		want := Slot{Index: waves[i], Start: time.Duration(waves[i]) * 100 * time.Millisecond,
			Capacity: 100, Calls: 1000 - 100*i, Retries: 1000 - 100*i, Served: 100}
		if i == 0 {
			want.Retries = 0
		}
		if s != want {
			t.Errorf("wave %d: %+v, want %+v", i, s, want)
		}
	}
	// Ties are broken by client id, so the lowest ids are served first.
	for id, a := range res.Attempts {
		if want := id/100 + 1; a != want {
			t.Fatalf("client %d made %d attempts, want %d", id, a, want)
		}
	}
}

func TestSameSeedSameResult(t *testing.T) {
	for _, name := range Strategies() {
		t.Run(name, func(t *testing.T) {
			s, _, err := NewStrategy(name, 0, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			cfg := Config{Backoff: s, Seed: 42, Arrival: Arrival{Rate: 2000}, Budget: &budget.Config{Ratio: 0.5}}
			a, b := runOK(t, cfg), runOK(t, cfg)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("two runs of one seed differ: %d vs %d calls", a.TotalCalls, b.TotalCalls)
			}
		})
	}
}

func TestOtherSeedOtherDraws(t *testing.T) {
	a := jitter(t, JitterConfig{Config: Config{Seed: 1}})
	b := jitter(t, JitterConfig{Config: Config{Seed: 2}})
	if !reflect.DeepEqual(a[StrategyNone], b[StrategyNone]) {
		t.Errorf("no jitter draws nothing, yet seeds 1 and 2 differ")
	}
	for _, name := range []string{StrategyPlus, StrategyEqual, StrategyFull, StrategyDecorrelated} {
		if reflect.DeepEqual(a[name].Attempts, b[name].Attempts) && reflect.DeepEqual(a[name].Slots, b[name].Slots) {
			t.Errorf("%s: seeds 1 and 2 gave identical runs", name)
		}
	}
}

func TestPoissonArrivalsFollowTheSeed(t *testing.T) {
	cfg := Config{Clients: 2000, Capacity: 1000, Arrival: Arrival{Rate: 100}, Backoff: backoff.Exponential(0, 0)}
	a := runOK(t, cfg)
	cfg.Seed = 7
	b := runOK(t, cfg)
	if reflect.DeepEqual(a.Slots, b.Slots) {
		t.Fatal("seeds 0 and 7 gave the same arrivals")
	}
	for _, res := range []Result{a, b} {
		// 2000 arrivals at 100/s span about 20 s; the sd of the sum is ~0.45 s.
		if got := res.AllDoneAt; got < 18*time.Second || got > 22*time.Second {
			t.Errorf("last arrival at %v, want about 20s", got)
		}
		if res.TotalCalls != 2000 {
			t.Errorf("total calls %d, want 2000 (capacity is ample)", res.TotalCalls)
		}
	}
}

func TestSpreadArrivals(t *testing.T) {
	res := runOK(t, Config{Clients: 10, Arrival: Arrival{Spread: time.Second}})
	if len(res.Slots) != 10 {
		t.Fatalf("%d slots, want one per client", len(res.Slots))
	}
	for i, s := range res.Slots {
		if s.Index != int64(i) || s.Calls != 1 || s.Served != 1 {
			t.Errorf("slot %d: %+v, want client %d alone", i, s, i)
		}
	}
	if want := 900 * time.Millisecond; res.AllDoneAt != want {
		t.Errorf("all done at %v, want %v", res.AllDoneAt, want)
	}
}

func TestBoundaryBelongsToTheSlotItStarts(t *testing.T) {
	tests := []struct {
		name     string
		delay    time.Duration
		attempts int
		slots    []int64
	}{
		{"exactly on the boundary", 100 * time.Millisecond, 2, []int64{0, 1}},
		{"a nanosecond before", 100*time.Millisecond - 1, 3, []int64{0, 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := runOK(t, Config{Clients: 2, Capacity: 1, Backoff: backoff.Constant(tt.delay)})
			var slots []int64
			for _, s := range res.Slots {
				slots = append(slots, s.Index)
			}
			if !reflect.DeepEqual(slots, tt.slots) || res.Attempts[1] != tt.attempts {
				t.Fatalf("slots %v, client 1 attempts %d; want %v, %d", slots, res.Attempts[1], tt.slots, tt.attempts)
			}
		})
	}
}

func TestZeroDelayRetriesInTheSameSlot(t *testing.T) {
	res := runOK(t, Config{Clients: 2, Capacity: 1, MaxAttempts: 3, Backoff: backoff.None()})
	want := []Slot{{Index: 0, Capacity: 1, Calls: 4, Retries: 2, Served: 1}}
	if !reflect.DeepEqual(res.Slots, want) || res.GaveUpAttempts != 1 || res.AllDoneAt != 0 {
		t.Fatalf("slots %+v gave up %d at %v; want %+v, 1, 0s", res.Slots, res.GaveUpAttempts, res.AllDoneAt, want)
	}
	if !reflect.DeepEqual(res.Attempts, []int{1, 3}) {
		t.Fatalf("attempts %v, want [1 3]: client 0 wins the tie", res.Attempts)
	}
}

// With the default parameters the first retry of equal and full jitter
// (within [0, 100ms) of t=0) lands in slot 0, which the first 100 calls
// already used up: so their retry peak is at least 900, whatever the seed.
// This is why the reference peaks (597 and 419) cannot be reproduced.
func TestFirstRetriesOfFullJitterHitTheSaturatedSlot(t *testing.T) {
	for seed := range uint64(5) {
		res := jitter(t, JitterConfig{Config: Config{Seed: seed}, Strategies: []string{StrategyEqual, StrategyFull}})
		for name, r := range res {
			if s := r.Slots[0]; s.Retries < 900 || s.Served != 100 {
				t.Errorf("seed %d %s: slot 0 %+v, want >= 900 retries, 100 served", seed, name, s)
			}
		}
	}
}

// Full jitter spreads a herd over the whole window, so once the window spans
// several slots it beats the helper's +0..100ms, which keeps the herd in one
// slot, on both retry peak and total work.
func TestFullJitterBeatsPlusWhenTheWindowSpansSlots(t *testing.T) {
	for seed := range uint64(8) {
		res := jitter(t, JitterConfig{
			Config:     Config{Seed: seed},
			Base:       400 * time.Millisecond,
			Strategies: []string{StrategyPlus, StrategyFull},
		})
		full, plus := res[StrategyFull], res[StrategyPlus]
		if full.RetryPeak >= plus.RetryPeak || full.TotalCalls >= plus.TotalCalls || full.AllDoneAt >= plus.AllDoneAt {
			t.Errorf("seed %d: full jitter calls=%d peak=%d done=%v, +0..100ms calls=%d peak=%d done=%v; want full lower on all",
				seed, full.TotalCalls, full.RetryPeak, full.AllDoneAt, plus.TotalCalls, plus.RetryPeak, plus.AllDoneAt)
		}
	}
}

// The same server with finer slots (10 per 10 ms): full jitter does less
// work and finishes sooner than +0..100ms, whose window now spans slots too.
func TestFullJitterBeatsPlusOnFinerSlots(t *testing.T) {
	for seed := range uint64(8) {
		res := jitter(t, JitterConfig{
			Config:     Config{Seed: seed, Slot: 10 * time.Millisecond, Capacity: 10},
			Strategies: []string{StrategyPlus, StrategyFull},
		})
		full, plus := res[StrategyFull], res[StrategyPlus]
		if full.TotalCalls >= plus.TotalCalls || full.AllDoneAt >= plus.AllDoneAt {
			t.Errorf("seed %d: full jitter calls=%d done=%v, +0..100ms calls=%d done=%v; want full lower on both",
				seed, full.TotalCalls, full.AllDoneAt, plus.TotalCalls, plus.AllDoneAt)
		}
	}
}

// Every jitter finishes the default herd long before no jitter does.
func TestJitterFinishesSoonerThanNone(t *testing.T) {
	for seed := range uint64(5) {
		res := jitter(t, JitterConfig{Config: Config{Seed: seed}})
		none := res[StrategyNone]
		for name, r := range res {
			if name != StrategyNone && (r.AllDoneAt > none.AllDoneAt/4 || r.TotalCalls >= none.TotalCalls) {
				t.Errorf("seed %d %s: %d calls done at %v; no jitter %d at %v", seed, name, r.TotalCalls, r.AllDoneAt, none.TotalCalls, none.AllDoneAt)
			}
		}
	}
}

func TestBudgetReducesCalls(t *testing.T) {
	for _, name := range Strategies() {
		s, _, _ := NewStrategy(name, 0, 0, 0)
		free := runOK(t, Config{Backoff: s, Seed: 3})
		capped := runOK(t, Config{Backoff: s, Seed: 3, Budget: &budget.Config{Ratio: 0.1, Max: 10}})
		// 10 tokens + 0.1 per first call: at most 110 retries in all.
		if capped.Retries > 110 || capped.TotalCalls >= free.TotalCalls || capped.GaveUpBudget == 0 {
			t.Errorf("%s: with budget %d calls (%d retries, %d refused), without %d",
				name, capped.TotalCalls, capped.Retries, capped.GaveUpBudget, free.TotalCalls)
		}
	}
}

// The database is down, 1000 users arrive over 2 s, the tier next
// to it makes up to 4 attempts. Without a budget the DB sees 4000 calls;
// with a 10 % budget 1109 (10 initial tokens, then 0.1 per user).
func TestBudgetOnADeadServerLets1109Through(t *testing.T) {
	dead := func(time.Duration) int { return 0 }
	for _, tt := range []struct {
		name  string
		b     *budget.Config
		calls int
	}{
		{"no budget", nil, 4000},
		{"budget 10%", &budget.Config{Ratio: 0.1, Max: 10}, 1109},
	} {
		res := runOK(t, Config{Clients: 1000, MaxAttempts: 4, CapacityAt: dead, Budget: tt.b,
			Arrival: Arrival{Spread: 2 * time.Second}})
		if res.TotalCalls != tt.calls || res.GaveUp != 1000 {
			t.Errorf("%s: %d calls, %d gave up; want %d, 1000", tt.name, res.TotalCalls, res.GaveUp, tt.calls)
		}
	}
}

func TestDeadline(t *testing.T) {
	// Waves at 0, .1, .3, .7 s; the next would be at 1.5 s, past the 1 s
	// deadline, so the 600 left give up at once, at 0.7 s.
	res := runOK(t, Config{Backoff: backoff.Exponential(0, 0), Deadline: time.Second})
	if res.TotalCalls != 3400 || res.Succeeded != 400 || res.GaveUpDeadline != 600 || res.AllDoneAt != 700*time.Millisecond {
		t.Fatalf("calls %d served %d gave up (deadline) %d at %v; want 3400 400 600 700ms",
			res.TotalCalls, res.Succeeded, res.GaveUpDeadline, res.AllDoneAt)
	}
	// A retry exactly at the deadline is not made.
	res = runOK(t, Config{Clients: 2, Capacity: 1, Backoff: backoff.Constant(time.Second), Deadline: time.Second})
	if res.GaveUpDeadline != 1 || res.TotalCalls != 2 {
		t.Fatalf("calls %d, gave up (deadline) %d; want 2, 1", res.TotalCalls, res.GaveUpDeadline)
	}
}

func TestOutage(t *testing.T) {
	res := runOK(t, Config{Backoff: backoff.Exponential(0, 0), CapacityAt: Outage(time.Second, 100)})
	// Waves at 0, .1, .3, .7 find the server down (4000 calls); from 1.5 s
	// it serves 100 per wave: 1000+900+800+700+600+500 calls, 400 give up.
	if res.TotalCalls != 4000+4500 || res.GaveUp != 400 || res.Slots[4].Start != 1500*time.Millisecond || res.Slots[4].Served != 100 {
		t.Fatalf("calls %d, gave up %d, slot 4 %+v", res.TotalCalls, res.GaveUp, res.Slots[4])
	}
}

func TestHugeDelaysSaturate(t *testing.T) {
	// Client 1 arrives at 1ns, is refused, and retries at 1ns+MaxInt64.
	res := runOK(t, Config{Clients: 2, Capacity: 1, MaxAttempts: 3, Backoff: backoff.Constant(math.MaxInt64),
		Arrival: Arrival{Spread: 2}})
	// The retry lands at the end of time, in a fresh slot, and is served.
	if res.AllDoneAt != math.MaxInt64 || res.Attempts[1] != 2 || res.Succeeded != 2 {
		t.Fatalf("all done at %v after %v attempts, want the end of time after [1 2]", res.AllDoneAt, res.Attempts)
	}
}

func TestInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{Clients: -1},
		{Clients: ClientsLimit + 1},
		{Slot: -1},
		{Capacity: -1},
		{MaxAttempts: -1},
		{MaxAttempts: AttemptsLimit + 1},
		{Deadline: -1},
		{Arrival: Arrival{Spread: -1}},
		{Arrival: Arrival{Rate: math.NaN()}},
		{Arrival: Arrival{Rate: math.Inf(1)}},
		{Arrival: Arrival{Spread: time.Second, Rate: 1}},
		{Budget: &budget.Config{MinPerSecond: 1}},
	} {
		if _, err := Run(context.Background(), cfg); !errors.Is(err, ErrConfig) {
			t.Errorf("Run(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := Jitter(context.Background(), JitterConfig{Strategies: []string{"full", "bogus"}}); !errors.Is(err, ErrConfig) {
		t.Errorf("unknown strategy: %v, want ErrConfig", err)
	}
}

func TestCanceled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(ctx, Config{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run on a canceled context: %v, want context.Canceled", err)
	}
}

// Capacity invariants over a spread of scenarios and strategies.
func TestInvariants(t *testing.T) {
	scenarios := []Config{
		{},
		{Clients: 5000, Capacity: 37, Slot: 30 * time.Millisecond},
		{Clients: 3000, Arrival: Arrival{Rate: 1500}, Deadline: 2 * time.Second},
		{Clients: 3000, Arrival: Arrival{Spread: 3 * time.Second}, Budget: &budget.Config{Ratio: 0.2, Max: 50}},
		{CapacityAt: func(start time.Duration) int { return int(start/time.Second) * 10 }},
		{Clients: 1, MaxAttempts: 1},
	}
	for i, sc := range scenarios {
		for seed := range uint64(3) {
			sc.Seed = seed
			jitter(t, JitterConfig{Config: sc})
			if t.Failed() {
				t.Fatalf("scenario %d seed %d", i, seed)
			}
		}
	}
}
