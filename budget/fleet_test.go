package budget_test

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/fleet"
)

// N processes of a fleet of N, each with its own budget, start an outage
// together: every call fails and wants up to three retries. Together they
// are granted at most FleetMax plus Ratio of their calls (60 + 150), where
// budgets that ignore the fleet grant N times Max plus the same ratio
// (300 + 150). (A process's first deposit falls into a full bucket, so
// each may get up to one retry less than the bound.)
func TestFleetBurstDoesNotMultiplyWithReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const (
			n        = 30
			fleetMax = 60.0
			ratio    = 0.1
			calls    = 50 // per process
		)
		for _, members := range []fleet.Members{nil, fleet.Fixed(n)} {
			budgets := make([]*budget.Budget, n)
			for i := range budgets {
				cfg := budget.Config{Ratio: ratio, Max: 10, Members: members}
				if members != nil {
					cfg.FleetMax = fleetMax
				}
				budgets[i] = mustNew(cfg)
			}
			var granted atomic.Int64
			var wg sync.WaitGroup
			for _, b := range budgets {
				wg.Go(func() {
					for range calls {
						b.Deposit()
						for range 3 {
							if !b.TryRetry() {
								break
							}
							granted.Add(1)
						}
						time.Sleep(10 * time.Millisecond) // fake time: a call every 10 ms
					}
				})
			}
			wg.Wait()
			deposits := ratio * n * calls
			if members == nil {
				// The burst multiplies: 30 x 10 tokens.
				if want := 10*n + deposits; float64(granted.Load()) < want-float64(n) {
					t.Fatalf("without Members: %d retries granted, want about %v", granted.Load(), want)
				}
				continue
			}
			if max := fleetMax + deposits; float64(granted.Load()) > max {
				t.Fatalf("with Members: %d retries granted, want at most FleetMax + ratio x deposits = %v", granted.Load(), max)
			}
			if min := fleetMax + deposits - float64(n); float64(granted.Load()) < min {
				t.Fatalf("with Members: %d retries granted, want at least %v: the ratio still applies", granted.Load(), min)
			}
		}
	})
}

// Each process holds FleetMax / Live tokens, at least 1 and at most Max.
func TestFleetShareBounds(t *testing.T) {
	for _, tc := range []struct {
		live          int
		max, fleetMax float64
		want          float64
	}{
		{live: 1, max: 10, fleetMax: 0, want: 10},    // FleetMax defaults to Max
		{live: 4, max: 10, fleetMax: 0, want: 2.5},   // the fleet shares Max
		{live: 4, max: 10, fleetMax: 100, want: 10},  // never more than Max
		{live: 300, max: 10, fleetMax: 30, want: 1},  // never less than one retry
		{live: 0, max: 10, fleetMax: 20, want: 10},   // Live below 1 counts as 1
		{live: 8, max: 10, fleetMax: 20, want: 2.5},  // 20 / 8
		{live: 3, max: 100, fleetMax: 10, want: 3.3}, // rounded below: 10/3
	} {
		b := mustNew(budget.Config{Max: tc.max, FleetMax: tc.fleetMax, Members: fleet.Fixed(tc.live)})
		if got := b.Max(); got < tc.want-0.05 || got > tc.want+0.05 {
			t.Errorf("live %d, Max %v, FleetMax %v: Max() = %v, want %v", tc.live, tc.max, tc.fleetMax, got, tc.want)
		}
		if b.Tokens() != b.Max() {
			t.Errorf("live %d: starts with %v tokens of %v", tc.live, b.Tokens(), b.Max())
		}
	}
}

// counter is a Members whose size the test sets and whose reads it counts.
type counter struct {
	live  atomic.Int64
	reads atomic.Int64
}

func (c *counter) Live() int {
	c.reads.Add(1)
	return int(c.live.Load())
}

// The fleet's size is read at New and then at most once a second, on a
// retry; a fleet that grows lowers the tokens at once, one that shrinks
// raises the cap, which deposits fill.
func TestFleetSizeIsReadAtMostOnceASecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := &counter{}
		m.live.Store(1)
		b := mustNew(budget.Config{Ratio: 1, Max: 10, Members: m})
		if b.Tokens() != 10 || m.reads.Load() != 1 {
			t.Fatalf("at New: %v tokens, %d reads; want 10 tokens, 1 read", b.Tokens(), m.reads.Load())
		}
		m.live.Store(5)
		for range 1000 {
			b.Deposit()
		}
		if !b.TryRetry() || m.reads.Load() != 1 {
			t.Fatalf("a retry within the second read Live again: %d reads", m.reads.Load())
		}
		time.Sleep(budget.MembersRefresh)
		if !b.TryRetry() {
			t.Fatal("retry refused after the fleet grew")
		}
		if m.reads.Load() != 2 || b.Max() != 2 || b.Tokens() != 1 {
			t.Fatalf("after a second: %d reads, Max %v, %v tokens; want 2 reads, Max 2, 1 token", m.reads.Load(), b.Max(), b.Tokens())
		}
		for range 100 {
			b.TryRetry()
		}
		if m.reads.Load() != 2 {
			t.Fatalf("%d reads within one second", m.reads.Load())
		}
		m.live.Store(1)
		time.Sleep(budget.MembersRefresh)
		b.TryRetry()
		if b.Max() != 10 || b.Tokens() != 0 {
			t.Fatalf("after the fleet shrank: Max %v, %v tokens; want 10, 0 (deposits fill it)", b.Max(), b.Tokens())
		}
		for range 20 {
			b.Deposit()
		}
		if b.Tokens() != 10 {
			t.Fatalf("deposits filled the bucket to %v, want 10", b.Tokens())
		}
	})
}

func TestFleetMaxConfigIsChecked(t *testing.T) {
	for _, tc := range []struct {
		cfg  budget.Config
		want string
	}{
		{budget.Config{FleetMax: 10}, "Config.FleetMax is 10; want zero when Members is nil"},
		{budget.Config{FleetMax: 0.5, Members: fleet.Fixed(2)}, "Config.FleetMax is 0.5"},
		{budget.Config{FleetMax: -1, Members: fleet.Fixed(2)}, "Config.FleetMax is -1"},
		{budget.Config{FleetMax: 2e9, Members: fleet.Fixed(2)}, "Config.FleetMax is 2e+09"},
	} {
		_, err := budget.New(tc.cfg)
		if !errors.Is(err, budget.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an ErrInvalidConfig naming %q", tc.cfg, err, tc.want)
		}
	}
}
