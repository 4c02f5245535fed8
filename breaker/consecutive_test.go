package breaker_test

import (
	"errors"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
)

// windows are the two window kinds the run is counted beside.
var windows = []struct {
	name string
	cfg  breaker.Config
}{
	{"time", breaker.Config{}},
	{"count", breaker.Config{CountWindow: 100}},
}

func withRun(base breaker.Config, n int, r *recorder) breaker.Config {
	base.ConsecutiveFailures = n
	base.OpenJitter = -1
	if r != nil {
		base.Observer = r
	}
	return base
}

// At one call a minute the window never holds MinRequests calls, so the
// rate never trips; three failures in a row do.
func TestConsecutiveFailuresTripAtLowVolume(t *testing.T) {
	for _, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{}
				b := mustNew(withRun(w.cfg, 3, r))
				for i := range 2 {
					calls(b, breaker.Failure, 1)
					wantState(t, b, breaker.Closed)
					if m := b.Metrics(); m.ConsecutiveFailures != i+1 {
						t.Fatalf("after %d failures: Metrics.ConsecutiveFailures = %d", i+1, m.ConsecutiveFailures)
					}
					time.Sleep(time.Minute)
				}
				calls(b, breaker.Failure, 1)
				wantState(t, b, breaker.Open)
				ts := r.list()
				if len(ts) != 1 || ts[0].Reason != "consecutive_failures" || ts[0].Detail != "3 consecutive failures" {
					t.Fatalf("transitions %+v; want one consecutive_failures trip, cause %q", ts, "3 consecutive failures")
				}
			})
		})
	}
}

// Without the option, the same calls never trip: it is off by default.
func TestConsecutiveFailuresOffByDefault(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{})
		for range 100 {
			calls(b, breaker.Failure, 1)
			time.Sleep(time.Minute)
		}
		wantState(t, b, breaker.Closed)
		if m := b.Metrics(); m.ConsecutiveFailures != 0 {
			t.Errorf("Metrics.ConsecutiveFailures = %d with the option off", m.ConsecutiveFailures)
		}
	})
}

// A success ends the run; an ignored call neither counts nor ends it; a
// slow success is a success.
func TestConsecutiveFailuresSuccessResets(t *testing.T) {
	for _, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			cfg := withRun(w.cfg, 3, nil)
			cfg.SlowCall = time.Second
			cfg.SlowRate = 1
			cfg.MinRequests = 50
			b := mustNew(cfg)
			seq := func(o breaker.Outcome, d time.Duration) {
				p, err := b.Allow()
				if err != nil {
					t.Fatal(err)
				}
				p.Done(o, d)
			}
			seq(breaker.Failure, 0)
			seq(breaker.Failure, 0)
			seq(breaker.Success, 0)
			seq(breaker.Failure, 0)
			seq(breaker.Failure, 0)
			seq(breaker.Success, 2*time.Second) // slow, but a success
			seq(breaker.Failure, 0)
			seq(breaker.Failure, 0)
			seq(breaker.Ignored, 0)
			wantState(t, b, breaker.Closed)
			if m := b.Metrics(); m.ConsecutiveFailures != 2 {
				t.Fatalf("Metrics.ConsecutiveFailures = %d; want 2", m.ConsecutiveFailures)
			}
			seq(breaker.Failure, 0)
			wantState(t, b, breaker.Open)
		})
	}
}

// The option changes nothing about half-open: a probe decides, and the
// breaker closes with an empty run.
func TestConsecutiveFailuresHalfOpen(t *testing.T) {
	for _, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{}
				b := mustNew(withRun(w.cfg, 2, r))
				stale, _ := b.Allow() // issued while closed, reported after the trip
				trip(t, b, 2)
				time.Sleep(defaultOpenFor)
				calls(b, breaker.Failure, 1) // the probe fails
				wantState(t, b, breaker.Open)
				time.Sleep(defaultOpenFor)
				calls(b, breaker.Success, 1) // the probe passes
				wantState(t, b, breaker.Closed)
				stale.Done(breaker.Failure, 0) // from an earlier state: dropped
				calls(b, breaker.Failure, 1)
				wantState(t, b, breaker.Closed) // one failure of this run, not two
				calls(b, breaker.Failure, 1)
				wantState(t, b, breaker.Open)
				want := "closed>open(consecutive_failures) open>half_open(open_elapsed) half_open>open(probe_failed) " +
					"open>half_open(open_elapsed) half_open>closed(probes_passed) closed>open(consecutive_failures)"
				if got := r.path(); got != want {
					t.Errorf("transitions\n%s\nwant\n%s", got, want)
				}
			})
		})
	}
}

// When the rate trips too, the rate's reason is reported: the option only
// adds a condition.
func TestConsecutiveFailuresBesideRate(t *testing.T) {
	r := &recorder{}
	b := mustNew(withRun(breaker.Config{MinRequests: 4}, 4, r))
	calls(b, breaker.Failure, 4)
	if ts := r.list(); len(ts) != 1 || ts[0].Reason != string(breaker.ReasonFailureRate) {
		t.Fatalf("transitions %+v; want a failure_rate trip", ts)
	}
}

// MetricsOnly counts the run and never trips; Reset empties it.
func TestConsecutiveFailuresMetricsOnly(t *testing.T) {
	b := mustNew(breaker.Config{ConsecutiveFailures: 3, Mode: breaker.MetricsOnly})
	calls(b, breaker.Failure, 10)
	wantState(t, b, breaker.Closed)
	if m := b.Metrics(); m.ConsecutiveFailures != 10 {
		t.Errorf("Metrics.ConsecutiveFailures = %d; want 10", m.ConsecutiveFailures)
	}
	b.Reset()
	if m := b.Metrics(); m.ConsecutiveFailures != 0 {
		t.Errorf("after Reset: Metrics.ConsecutiveFailures = %d; want 0", m.ConsecutiveFailures)
	}
}

func TestConsecutiveFailuresConfig(t *testing.T) {
	for _, v := range []int{-1, 65536} {
		_, err := breaker.New(breaker.Config{ConsecutiveFailures: v})
		if !errors.Is(err, breaker.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.ConsecutiveFailures is ") ||
			!strings.Contains(err.Error(), "want 0 (off) to 65535") {
			t.Errorf("ConsecutiveFailures %d: %v; want an error naming the field", v, err)
		}
	}
	b := mustNew(breaker.Config{ConsecutiveFailures: 5})
	c := b.Config()
	if c.ConsecutiveFailures != 5 {
		t.Errorf("Config().ConsecutiveFailures = %d; want 5", c.ConsecutiveFailures)
	}
	if _, err := breaker.New(c); err != nil {
		t.Errorf("New(Config()): %v", err)
	}
	if s := c.LogValue().String(); !strings.Contains(s, "consecutive_failures=5") {
		t.Errorf("LogValue %s; want consecutive_failures=5", s)
	}
}

// 200 goroutines record failures at once: the run is exact. n failures
// trip a breaker set to n, exactly once, and leave one set to n+1 closed
// with a run of n; a success between two halves ends the run.
func TestConsecutiveFailuresExactUnderConcurrency(t *testing.T) {
	const goroutines, each = 200, 5
	const total = goroutines * each
	rounds := 20
	if testing.Short() {
		rounds = 3
	}
	// MinRequests out of reach: only the run can trip.
	base := func(w breaker.Config, n int, r *recorder) breaker.Config {
		c := withRun(w, n, r)
		if c.CountWindow == 0 {
			c.MinRequests = math.MaxInt32
		} else {
			c.CountWindow, c.MinRequests = 1<<20, 1<<20
		}
		return c
	}
	fail := func(b *breaker.Breaker, n int) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Go(func() {
				<-start
				for range n {
					if p, err := b.Allow(); err == nil {
						p.Done(breaker.Failure, 0)
					}
				}
			})
		}
		close(start)
		wg.Wait()
	}
	for _, w := range windows {
		t.Run(w.name, func(t *testing.T) {
			for range rounds {
				r := &recorder{}
				b := mustNew(base(w.cfg, total, r))
				fail(b, each)
				if ts := r.list(); len(ts) != 1 || ts[0].Reason != string(breaker.ReasonConsecutiveFailures) || ts[0].Detail != "1000 consecutive failures" {
					t.Fatalf("%d failures, ConsecutiveFailures %d: transitions %+v; want one trip", total, total, ts)
				}

				b = mustNew(base(w.cfg, total+1, nil))
				fail(b, each)
				wantState(t, b, breaker.Closed)
				if m := b.Metrics(); m.ConsecutiveFailures != total {
					t.Fatalf("Metrics.ConsecutiveFailures = %d; want %d", m.ConsecutiveFailures, total)
				}

				// Two runs of 800 split by a success never reach 801.
				b = mustNew(base(w.cfg, 801, nil))
				fail(b, 4)
				calls(b, breaker.Success, 1)
				fail(b, 4)
				wantState(t, b, breaker.Closed)
				if m := b.Metrics(); m.ConsecutiveFailures != 800 {
					t.Fatalf("Metrics.ConsecutiveFailures = %d; want 800", m.ConsecutiveFailures)
				}
				calls(b, breaker.Failure, 1)
				wantState(t, b, breaker.Open)
			}
		})
	}
}

// In MetricsOnly the run saturates at the largest threshold instead of
// wrapping into the generation bits.
func TestConsecutiveFailuresSaturate(t *testing.T) {
	if testing.Short() {
		t.Skip("70,000 calls")
	}
	b := mustNew(breaker.Config{ConsecutiveFailures: 65535, Mode: breaker.MetricsOnly})
	calls(b, breaker.Failure, 70_000)
	if m := b.Metrics(); m.ConsecutiveFailures != 65535 {
		t.Errorf("Metrics.ConsecutiveFailures = %d; want 65535", m.ConsecutiveFailures)
	}
	calls(b, breaker.Success, 1)
	if m := b.Metrics(); m.ConsecutiveFailures != 0 {
		t.Errorf("after a success: Metrics.ConsecutiveFailures = %d; want 0", m.ConsecutiveFailures)
	}
}

// The breakers of a Group count their own runs.
func TestConsecutiveFailuresGroup(t *testing.T) {
	g := mustGroup(breaker.GroupConfig{Config: breaker.Config{ConsecutiveFailures: 2}})
	a, b := g.Get("a"), g.Get("b")
	calls(a, breaker.Failure, 1)
	calls(b, breaker.Failure, 1)
	calls(b, breaker.Success, 1)
	calls(a, breaker.Failure, 1)
	calls(b, breaker.Failure, 1)
	wantState(t, a, breaker.Open)
	wantState(t, b, breaker.Closed)
	if _, err := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{ConsecutiveFailures: -3}}); err == nil ||
		!strings.Contains(err.Error(), "GroupConfig.Config.ConsecutiveFailures is -3") {
		t.Errorf("NewGroup: %v; want an error naming GroupConfig.Config.ConsecutiveFailures", err)
	}
}
