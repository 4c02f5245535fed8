package lab

import (
	"context"
	"errors"
	"flag"
	"io"
	"math"
	"math/big"
	"strings"
	"testing"
	"time"
)

// bindExp binds experiment name's flags with the quick defaults or not,
// and parses args into them.
func bindExp(t testing.TB, name string, quick bool, args ...string) (flagged, Run) {
	t.Helper()
	e, ok := Lookup(name)
	if !ok {
		t.Fatalf("no experiment %q", name)
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	p := e.bind(fs, quick)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	// The Run of the same flags, as the command gets it.
	rfs := flag.NewFlagSet(name, flag.ContinueOnError)
	rfs.SetOutput(io.Discard)
	run := e.Setup(rfs, quick)
	if err := rfs.Parse(args); err != nil {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return p, run
}

func TestDefaultFlagsAreValid(t *testing.T) {
	for _, e := range Experiments() {
		for _, quick := range []bool{false, true} {
			p, _ := bindExp(t, e.Name, quick)
			if err := p.checkFlags(); err != nil {
				t.Errorf("%s (quick %v): the default flags are refused: %v", e.Name, quick, err)
			}
		}
	}
}

// TestFlagBounds gives every experiment huge, NaN, infinite, negative and
// overflowing values: each is refused with a flag error that names the
// flag, at once, by the Run the command calls, before it starts anything.
// Before the bounds, these values ran: out of memory (--calls 2000000000
// allocates a latency per call), a sending loop that never ends
// (--offered 1e300 makes its gap zero), a panic (--attempts -1 makes a
// guardhttp.Config that cannot be built), or an hour-long run.
func TestFlagBounds(t *testing.T) {
	cases := []struct {
		exp  string
		args []string
		want []string // in the message: the flag, its value, the range
	}{
		{"amplification", []string{"--tiers", "2000000000"}, []string{"--tiers is 2000000000", "[1, 10]"}},
		{"amplification", []string{"--attempts", "100", "--tiers", "10"}, []string{"--attempts ^ --tiers", "want at most 1000000"}},
		{"amplification", []string{"--users", "2000000000"}, []string{"--users is 2000000000"}},
		{"amplification", []string{"--users", "100000", "--over", "1ms"}, []string{"--users / --over"}},
		{"amplification", []string{"--over", "1000000h"}, []string{"--over is 1000000h0m0s"}},
		{"amplification", []string{"--over", "-1s"}, []string{"--over is -1s"}},
		{"amplification", []string{"--budget", "NaN"}, []string{"--budget is NaN", "[0, 1000]"}},
		{"amplification", []string{"--budget", "Inf"}, []string{"--budget is +Inf"}},
		{"amplification", []string{"--base", "1000000h"}, []string{"--base is 1000000h0m0s"}}, // 100x the base overflowed
		{"amplification", []string{"--base", "0s"}, []string{"--base is 0s"}},

		{"jitter", []string{"--clients", "2000000000"}, []string{"--clients is 2000000000", "[1, 1000000]"}},
		{"jitter", []string{"--clients", "1000000", "--max-attempts", "100000"}, []string{"--clients x --max-attempts"}},
		{"jitter", []string{"--max-attempts", "1000000"}, []string{"--max-attempts is 1000000"}},
		{"jitter", []string{"--capacity", "2000000000"}, []string{"--capacity is 2000000000"}},
		{"jitter", []string{"--slot", "1ns"}, []string{"--slot is 1ns", "1000000 slots"}},
		{"jitter", []string{"--slot", "1000000h"}, []string{"--slot is 1000000h0m0s"}},
		{"jitter", []string{"--fine-slot", "1ns"}, []string{"--fine-slot is 1ns"}},
		{"jitter", []string{"--cap", "2562047h"}, []string{"--cap is 2562047h0m0s"}},
		{"jitter", []string{"--plus-jitter", "-1s"}, []string{"--plus-jitter is -1s"}},
		{"jitter", []string{"--strategies", "full,sideways"}, []string{"--strategies", "sideways"}},

		{"deadline", []string{"--a", "1000000h"}, []string{"--a is 1000000h0m0s"}},
		{"deadline", []string{"--per-a", "-1s"}, []string{"--per-a is -1s"}}, // a guardhttp.Config that panicked
		{"deadline", []string{"--slo", "0s"}, []string{"--slo is 0s"}},
		{"deadline", []string{"--disconnect", "1000000h"}, []string{"--disconnect is"}},

		{"breaker", []string{"--open-for", "-1s"}, []string{"--open-for is -1s"}},
		{"breaker", []string{"--outage-min-requests", "-1"}, []string{"--outage-min-requests is -1"}}, // panicked
		{"breaker", []string{"--requests", "2000000000"}, []string{"--requests is 2000000000"}},
		{"breaker", []string{"--hang", "1000000h"}, []string{"--hang is"}},
		{"breaker", []string{"--hang", "0s"}, []string{"--hang is 0s; want a value in (0s, 1h0m0s]"}},

		{"retry-after", []string{"--attempts", "-1"}, []string{"--attempts is -1"}}, // panicked
		{"retry-after", []string{"--clients", "2000000000"}, []string{"--clients is 2000000000"}},
		{"retry-after", []string{"--retry-after", "1000000h"}, []string{"--retry-after is 1000000h0m0s"}},
		{"retry-after", []string{"--deadline", "-1s"}, []string{"--deadline is -1s"}},
		{"retry-after", []string{"--too-long", "1500ms"}, []string{"--too-long must be whole seconds"}}, // sent as "Retry-After: 1"
		{"retry-after", []string{"--too-long", "1000000h"}, []string{"--too-long is 1000000h0m0s"}},

		{"idempotency", []string{"--payments", "2000000000"}, []string{"--payments is 2000000000", "[1, 100000]"}},
		{"idempotency", []string{"--loss", "NaN"}, []string{"--loss must be in [0, 1)"}},

		{"shedding", []string{"--slots", "2000000000"}, []string{"--slots is 2000000000"}},
		{"shedding", []string{"--rps", "1e300"}, []string{"--rps is 1e+300", "(0, 20000]"}},
		{"shedding", []string{"--rps", "NaN"}, []string{"--rps is NaN"}},
		{"shedding", []string{"--rps", "20000", "--duration", "1h"}, []string{"--rps x --duration is 72000000 requests"}},
		{"shedding", []string{"--duration", "1000000h"}, []string{"--duration is 1000000h0m0s"}},
		{"shedding", []string{"--client-timeout", "1000000h"}, []string{"--client-timeout is"}},
		{"shedding", []string{"--limit", "-1"}, []string{"--limit is -1"}},
		{"shedding", []string{"--capacity-phase", "1000000h"}, []string{"--capacity-phase is 1000000h0m0s"}},
		{"shedding", []string{"--capacity-phase", "20m"}, []string{"--capacity-overloads x --capacity-phase x phases"}},
		{"shedding", []string{"--capacity-client-timeout", "1000000h"}, []string{"--capacity-client-timeout is"}},
		{"shedding", []string{"--capacity-slots", strings.Repeat("10,", 9999) + "10"}, []string{"--capacity-slots has 10000 entries; want at most 32"}},
		{"shedding", []string{"--capacity-phase", "30m"}, []string{"--capacity-phase is 30m0s with 3 phases; want at most 20m0s"}},
		{"shedding", []string{"--capacity-fixed", strings.Repeat("10,", 99) + "10"}, []string{"--capacity-fixed has 100 entries"}},
		{"shedding", []string{"--capacity-overloads", strings.Repeat("3,", 99) + "3"}, []string{"--capacity-overloads has 100 entries"}},
		{"jitter", []string{"--strategies", strings.Repeat("full,", 99) + "full"}, []string{"--strategies has 100 entries"}},
		{"chain", []string{"--tiers", "2000000000"}, []string{"--tiers is 2000000000"}},
		{"chain", []string{"--attempts", "10", "--tiers", "6"}, []string{"--attempts ^ (--tiers - 1) is 100000"}},
		{"chain", []string{"--rps", "NaN"}, []string{"--rps is NaN"}},
		{"chain", []string{"--transport", "smoke"}, []string{"--transport must be http or grpc"}},
		{"chain", []string{"--outages", "1s,1000000h"}, []string{"--outages: \"1000000h\" is not a duration"}},
		{"chain", []string{"--outages", "50m,55m"}, []string{"add up to"}},
		{"chain", []string{"--configs", "naive,everything"}, []string{"--configs: \"everything\" is none of"}},
		{"chain", []string{"--outages", strings.Repeat("1s,", 99) + "1s"}, []string{"--outages has 100 entries"}},
		{"incident", []string{"--outages", strings.Repeat("1s,", 99) + "1s"}, []string{"--outages has 100 entries"}},

		{"hedging", []string{"--calls", "2000000000"}, []string{"--calls is 2000000000"}},
		{"hedging", []string{"--workers", "2000000000"}, []string{"--workers is 2000000000"}},
		{"hedging", []string{"--slow-pct", "NaN"}, []string{"--slow-pct in (0, 50)"}},
		{"hedging", []string{"--percentile", "NaN"}, []string{"--percentile in (0, 1)"}},
		{"hedging", []string{"--overload-503-pct", "NaN"}, []string{"--overload-503-pct is NaN"}},
		{"hedging", []string{"--fast", "2562047h"}, []string{"--fast is"}}, // 1.2x overflowed the conversion back

		{"throttling", []string{"--offered", "1e300"}, []string{"--offered is 1e+300", "[1, 20000]"}},
		{"throttling", []string{"--offered", "1e-300"}, []string{"--offered is 1e-300"}},
		{"throttling", []string{"--capacity", "NaN"}, []string{"--capacity and --offered must be positive"}},
		{"throttling", []string{"--capacity", "Inf"}, []string{"--capacity is +Inf"}},
		{"throttling", []string{"--k", "NaN"}, []string{"--k is NaN"}},
		{"throttling", []string{"--phase", "1000000h"}, []string{"--phase is 1000000h0m0s"}},
		{"throttling", []string{"--open-for", "-1s"}, []string{"--open-for is -1s"}},

		{"incident", []string{"--rps", "1e300"}, []string{"--rps is 1e+300"}},
		{"incident", []string{"--workers", "2000000000"}, []string{"--workers is 2000000000"}},
		{"incident", []string{"--warmup", "1000000h"}, []string{"--warmup is 1000000h0m0s"}},
		{"incident", []string{"--warmup", "50m", "--relief-for", "50m"}, []string{"add up to", "want at most 1h0m0s"}},
		{"incident", []string{"--max-outage", "1000000h"}, []string{"--max-outage is 1000000h0m0s"}},
		{"incident", []string{"--naive-attempts", "2000000000"}, []string{"--naive-attempts is 2000000000"}},
		{"incident", []string{"--naive-backoff", "1000000h"}, []string{"--naive-backoff is"}},
		{"incident", []string{"--relief-rate", "NaN"}, []string{"--relief-rate in [0, 1)"}},
		{"incident", []string{"--pool", "2000000000"}, []string{"--pool is 2000000000"}},
		{"incident", []string{"--hold", "1000000h"}, []string{"--hold is"}},

		{"fleet", []string{"--processes", "2000000000"}, []string{"--processes is 2000000000", "[2, 32]"}},
		{"fleet", []string{"--offered", "NaN"}, []string{"--offered is NaN"}},
		{"fleet", []string{"--limit", "Inf"}, []string{"--limit is +Inf"}},
		{"fleet", []string{"--duration", "1000000h"}, []string{"--duration is 1000000h0m0s"}},
		{"fleet", []string{"--duration", "1s", "--warmup", "1s"}, []string{"want at least a second measured"}},
		{"fleet", []string{"--pause", "1500ms"}, []string{"--pause is 1.5s; want whole seconds"}},
		{"fleet", []string{"--callers", "-1"}, []string{"--callers is -1"}},

		{"overhead", []string{"--rounds", "2000000000"}, []string{"--rounds is 2000000000"}},
		{"overhead", []string{"--rounds", "100000", "--block", "100000"}, []string{"--rounds x --block"}},
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // nothing should start; if something did, it stops at once
	env := &Env{Quick: true, Seed: 1, Progress: func(string, ...any) {}}
	for _, tc := range cases {
		t.Run(tc.exp+" "+strings.Join(tc.args, " ")[:min(60, len(strings.Join(tc.args, " ")))], func(t *testing.T) {
			p, run := bindExp(t, tc.exp, true, tc.args...)
			start := time.Now()
			err := p.checkFlags()
			_, runErr := run(ctx, env)
			if took := time.Since(start); took > time.Second {
				t.Errorf("took %v to refuse, want well under 1s", took)
			}
			for _, err := range []error{err, runErr} {
				var fe *FlagError
				if !errors.As(err, &fe) {
					t.Fatalf("got %v, want a *FlagError", err)
				}
				for _, w := range tc.want {
					if !strings.Contains(fe.Msg, w) {
						t.Errorf("message %q does not say %q", fe.Msg, w)
					}
				}
			}
		})
	}
}

// TestFlagBoundsAcceptTheEdges: the bounds are inclusive where they say so,
// and generous: the largest values they allow still validate.
func TestFlagBoundsAcceptTheEdges(t *testing.T) {
	for _, tc := range []struct {
		exp  string
		args []string
	}{
		{"amplification", []string{"--tiers", "10", "--attempts", "3", "--users", "100000", "--over", "1h", "--budget", "1000", "--base", "6s"}},
		{"jitter", []string{"--clients", "1000000", "--max-attempts", "10", "--capacity", "10000000", "--slot", "1m", "--fine-slot", "1m", "--cap", "1h"}},
		{"deadline", []string{"--a", "10m", "--slo", "10m", "--disconnect", "10m"}},
		{"breaker", []string{"--requests", "100000", "--outage-min-requests", "100000", "--hang", "1h"}},
		{"retry-after", []string{"--retry-after", "10m", "--attempts", "100", "--clients", "10000"}},
		{"idempotency", []string{"--payments", "100000", "--loss", "0"}},
		{"shedding", []string{"--rps", "20000", "--duration", "100s", "--slots", "65535", "--limit", "65535", "--capacity-overloads", "none"}},
		{"shedding", []string{"--capacity-phase", "20m", "--capacity-overloads", "0.1"}},
		{"shedding", []string{"--capacity-slots", strings.Repeat("10,", 31) + "10", "--capacity-phase", "1m", "--capacity-overloads", "1"}},
		{"hedging", []string{"--calls", "1000000", "--workers", "10000", "--overload-503-pct", "100"}},
		{"throttling", []string{"--offered", "20000", "--capacity", "20000", "--phase", "10m", "--k", "1000000"}},
		{"incident", []string{"--rps", "5000", "--warmup", "10m", "--after", "10m", "--max-outage", "10m", "--relief-for", "10m"}},
		{"overhead", []string{"--rounds", "100000", "--block", "100"}},
	} {
		p, _ := bindExp(t, tc.exp, false, tc.args...)
		if err := p.checkFlags(); err != nil {
			t.Errorf("%s %q: %v", tc.exp, tc.args, err)
		}
	}
}

// TestFlagErrorsNameEveryFlag: one run reports every invalid flag, not the
// first, and keeps the messages the command line already prints.
func TestFlagErrorsNameEveryFlag(t *testing.T) {
	for _, tc := range []struct {
		exp  string
		args []string
		want []string
	}{
		{"breaker", []string{"--open-for", "-1s", "--requests", "0", "--hang", "1000000h"},
			[]string{"--open-for is -1s", "--requests is 0", "--hang is 1000000h0m0s"}},
		{"jitter", []string{"--clients", "0", "--slot", "1000000h"},
			[]string{"--clients, --capacity and --max-attempts must be at least 1, not 0, 100 and 10", "--slot is 1000000h0m0s"}},
		{"shedding", []string{"--slots", "0", "--rps", "NaN", "--mix", "critical=1,critical=2"},
			[]string{"--slots is 0", "--rps is NaN", "--mix: critical given twice"}},
		{"incident", []string{"--workers", "0", "--pool", "2000000000", "--relief-for", "1000000h"},
			[]string{"--workers is 0; want at least 1", "--pool is 2000000000", "--relief-for is 1000000h0m0s"}},
		{"amplification", []string{"--db", "sideways", "--users", "2000000000"},
			[]string{"--db must be reset or refused, not \"sideways\"", "--users is 2000000000"}},
	} {
		p, _ := bindExp(t, tc.exp, false, tc.args...)
		err := p.checkFlags()
		var fe *FlagError
		if !errors.As(err, &fe) {
			t.Errorf("%s %q: got %v, want a *FlagError", tc.exp, tc.args, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(fe.Msg, w) {
				t.Errorf("%s %q: message %q does not say %q", tc.exp, tc.args, fe.Msg, w)
			}
		}
	}
	// One invalid flag alone: the message the command prints today, alone.
	p, _ := bindExp(t, "jitter", false, "--clients", "0")
	if err, want := p.checkFlags(), "--clients, --capacity and --max-attempts must be at least 1, not 0, 100 and 10"; err == nil || err.Error() != want {
		t.Errorf("jitter --clients 0: %v, want %q", err, want)
	}
}

// bigShift is d << k, exactly.
func bigShift(d time.Duration, k int) *big.Int {
	return new(big.Int).Lsh(big.NewInt(int64(d)), uint(k))
}

func FuzzShiftSat(f *testing.F) {
	for _, s := range []struct {
		d time.Duration
		k int
	}{{100 * time.Millisecond, 0}, {100 * time.Millisecond, 36}, {100 * time.Millisecond, 99}, {1, 62}, {1, 63}, {math.MaxInt64, 1}, {-1, 3}, {5, -2}} {
		f.Add(int64(s.d), s.k, int64(time.Second))
	}
	f.Fuzz(func(t *testing.T, d int64, k int, j int64) {
		got := shiftSat(time.Duration(d), k)
		want := big.NewInt(0)
		switch {
		case d <= 0:
		case k <= 0:
			want.SetInt64(d)
		case k > 200:
			want.SetInt64(math.MaxInt64)
		default:
			want = bigShift(time.Duration(d), k)
			if !want.IsInt64() {
				want.SetInt64(math.MaxInt64)
			}
		}
		if int64(got) != want.Int64() {
			t.Fatalf("shiftSat(%d, %d) = %d, want %d", d, k, got, want)
		}
		if got < 0 {
			t.Fatalf("shiftSat(%d, %d) = %d: negative", d, k, got)
		}
		a, b := max(got, 0), max(time.Duration(j), 0)
		sum := addSat(a, b)
		exact := new(big.Int).Add(big.NewInt(int64(a)), big.NewInt(int64(b)))
		if !exact.IsInt64() {
			exact.SetInt64(math.MaxInt64)
		}
		if int64(sum) != exact.Int64() {
			t.Fatalf("addSat(%d, %d) = %d, want %d", a, b, sum, exact)
		}
	})
}

// FuzzJitterFlags: whatever the numbers, the jitter experiment's
// validation returns quickly, and what it lets through keeps the sizes
// the run derives from them in bounds: the simulated calls, the slots a
// chart spans, and the second table's capacity, a product of two flags.
func FuzzJitterFlags(f *testing.F) {
	f.Add(1000, 100, 10, int64(100*time.Millisecond), int64(10*time.Millisecond), int64(100*time.Millisecond), int64(10*time.Second), int64(100*time.Millisecond))
	f.Add(1_000_000, 10_000_000, 1, int64(time.Minute), int64(time.Minute-1), int64(time.Hour), int64(time.Hour), int64(time.Hour))
	f.Add(1, 1, 100_000, int64(time.Minute), int64(1), int64(1), int64(time.Hour), int64(0))
	f.Add(-1, 0, math.MaxInt, int64(math.MaxInt64), int64(math.MinInt64), int64(-1), int64(math.MaxInt64), int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, clients, capacity, attempts int, slot, fine, base, cap, plus int64) {
		p := jitterParams{clients: clients, capacity: capacity, attempts: attempts, slot: time.Duration(slot), fineSlot: time.Duration(fine),
			base: time.Duration(base), cap: time.Duration(cap), plus: time.Duration(plus), strategies: "none,full"}
		if p.checkFlags() != nil {
			return
		}
		if calls := new(big.Int).Mul(big.NewInt(int64(clients)), big.NewInt(int64(attempts))); calls.Cmp(big.NewInt(jitterMaxCalls)) > 0 {
			t.Fatalf("%+v: %v calls let through", p, calls)
		}
		if !new(big.Int).Mul(big.NewInt(int64(capacity)), big.NewInt(fine)).IsInt64() {
			t.Fatalf("%+v: --capacity x --fine-slot overflows", p)
		}
		// The longest a row can run, in slots.
		horizon := new(big.Int).Mul(big.NewInt(int64(attempts-1)), big.NewInt(max(cap, base)+max(plus, int64(100*time.Millisecond))))
		for _, s := range []int64{slot, fine} {
			if s > 0 && new(big.Int).Quo(horizon, big.NewInt(s)).Cmp(big.NewInt(jitterMaxSlots+1)) > 0 {
				t.Fatalf("%+v: a row spans more than %d slots of %v", p, jitterMaxSlots, time.Duration(s))
			}
		}
	})
}

// FuzzIncidentSchedule: what the incident experiment's validation lets
// through makes a schedule that neither overflows nor outgrows an hour,
// so its per-request and per-bucket slices stay bounded.
func FuzzIncidentSchedule(f *testing.F) {
	f.Add(300.0, int64(500*time.Millisecond), int64(2500*time.Millisecond), int64(8*time.Second), int64(time.Second), int64(10*time.Second), int64(time.Second), int64(time.Second), int64(100*time.Millisecond))
	f.Add(5000.0, int64(time.Hour), int64(time.Hour), int64(10*time.Minute), int64(time.Hour), int64(time.Hour), int64(time.Hour), int64(time.Hour), int64(time.Millisecond))
	f.Add(math.NaN(), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(math.MaxInt64), int64(1))
	f.Fuzz(func(t *testing.T, rps float64, warmup, after, maxOutage, reliefAfter, reliefFor, hold, target, step int64) {
		p, _ := bindExp(t, "incident", false)
		ip := *p.(*incParams)
		ip.rps, ip.warmup, ip.after, ip.maxOutage = rps, time.Duration(warmup), time.Duration(after), time.Duration(maxOutage)
		ip.reliefAfter, ip.reliefFor, ip.holdFor, ip.recoveryTarget, ip.step = time.Duration(reliefAfter), time.Duration(reliefFor), time.Duration(hold), time.Duration(target), time.Duration(step)
		plan, err := ip.validate()
		if err != nil {
			return
		}
		for _, outage := range append(plan.outages, ip.maxOutage) {
			for _, guarded := range []bool{false, true} {
				for _, relief := range []bool{false, true} {
					_, _, _, end := ip.schedule(guarded, outage, relief)
					if end <= 0 || end > maxRun {
						t.Fatalf("rps %v, %+v: a run ends at %v", rps, ip, end)
					}
					if n := math.Ceil(end.Seconds() * ip.rps); n > float64(maxRun/time.Second)*incMaxRPS {
						t.Fatalf("a run schedules %v requests", n)
					}
					if buckets := (end + ip.userDeadline + 2*time.Second) / ip.step; buckets > 10_000_000 {
						t.Fatalf("a run has %d buckets of %v", buckets, ip.step)
					}
				}
			}
		}
	})
}

// FuzzSheddingFlags: what the shedding experiment's validation lets
// through sends a bounded number of requests per row, in the fixed rows
// and in the changing-capacity ones.
func FuzzSheddingFlags(f *testing.F) {
	f.Add(10, int64(50*time.Millisecond), 600.0, int64(3*time.Second), int64(time.Second), "3,10,30", "10,5,20", int64(3*time.Second))
	f.Add(65535, int64(time.Millisecond), 20000.0, int64(time.Hour), int64(10*time.Minute), "100", strings.Repeat("1,", 31)+"1", int64(time.Hour))
	f.Add(1, int64(1), math.Inf(1), int64(math.MaxInt64), int64(-1), "1e308", "2147483648", int64(math.MaxInt64))
	f.Fuzz(func(t *testing.T, slots int, service int64, rps float64, duration, timeout int64, overloads, capSlots string, phase int64) {
		p, _ := bindExp(t, "shedding", false)
		sp := *p.(*shedParams)
		sp.slots, sp.service, sp.rps, sp.duration, sp.timeout = slots, time.Duration(service), rps, time.Duration(duration), time.Duration(timeout)
		sp.capOverloads, sp.capSlots, sp.cap.phase = overloads, capSlots, time.Duration(phase)
		if _, err := sp.parseFlags(); err != nil {
			var fe *FlagError
			if !errors.As(err, &fe) {
				t.Fatalf("%v: not a flag error", err)
			}
			return
		}
		if n := math.Round(sp.rps * sp.duration.Seconds()); !(n >= 2 && n <= maxRequests) {
			t.Fatalf("rps %v x %v: %v requests per row", sp.rps, sp.duration, n)
		}
		if len(sp.cap.overloads) == 0 {
			return
		}
		total := new(big.Int).Mul(big.NewInt(int64(sp.cap.phase)), big.NewInt(int64(len(sp.cap.phases))))
		if !total.IsInt64() || time.Duration(total.Int64()) > maxRun {
			t.Fatalf("phases of %v x %d: a capacity run lasts %v", sp.cap.phase, len(sp.cap.phases), total)
		}
		capacity0 := float64(sp.cap.phases[0]) / sp.service.Seconds()
		for _, over := range sp.cap.overloads {
			if n := math.Round(over * capacity0 * time.Duration(total.Int64()).Seconds()); n > maxRequests {
				t.Fatalf("%vx overload: %v requests per capacity run", over, n)
			}
		}
	})
}
