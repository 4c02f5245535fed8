package redisfleet_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisfleet"
	"github.com/guardrail-go/guardrail/fleet"
)

// TestLimiterRedisKilled runs four limiters, each with a client of its
// own as four processes would have, on a Redis of the test's own, kills it
// for 5 s and starts it again, empty, on the same port. While it is down
// the limiters admit their share (FailOpen) and no Allow waits much past
// StoreTimeout; after it is back every limiter sees it again within about
// a second, and the fleet admits the rate again.
func TestLimiterRedisKilled(t *testing.T) {
	if testing.Short() {
		t.Skip("kills and restarts a Redis server for 5 s")
	}
	srv := redistest.StartServer(t)
	const procs, rate, burst = 4, 400, 40
	const timeout = fleet.DefaultStoreTimeout
	var lims []*fleet.Limiter
	for range procs {
		client := redis.NewClient(&redis.Options{
			Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1,
			DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout,
		})
		t.Cleanup(func() { client.Close() })
		store, err := redisfleet.New(client, redisfleet.Config{})
		if err != nil {
			t.Fatal(err)
		}
		l, err := fleet.NewLimiter(fleet.LimiterConfig{Store: store, Rate: rate, Burst: burst, Members: fleet.Fixed(procs)})
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
	}

	var admitted, slowest, bad atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, l := range lims {
		wg.Go(func() { offerUntil(l, "tenant", 2*rate/procs, stop, &admitted, &slowest, &bad) })
	}
	count := func(d time.Duration) int64 {
		a := admitted.Load()
		time.Sleep(d) // a span of the offered load, not a wait for an event
		return admitted.Load() - a
	}
	count(time.Second)

	srv.Kill()
	const down = 5 * time.Second
	outage := count(down)
	failing := 0
	for _, l := range lims {
		if l.Stats().Failing {
			failing++
		}
	}
	slowDown := time.Duration(slowest.Load())

	srv.Start(t)
	back := time.Now()
	var first, last time.Duration
	seen := make([]bool, procs)
	redistest.WaitFor(t, "every limiter to see Redis again", func() bool {
		all := true
		for i, l := range lims {
			if !seen[i] && !l.Stats().Failing {
				seen[i] = true
				el := time.Since(back)
				if first == 0 {
					first = el
				}
				last = el
			}
			all = all && seen[i]
		}
		return all
	})
	const after = 2 * time.Second
	exact := count(after)
	close(stop)
	wg.Wait()
	for _, l := range lims {
		_ = l.Close()
	}

	t.Logf("down %v: admitted %d (share %d), slowest Allow %v; back: first limiter %v, last %v; then %d in %v (rate %d)",
		down, outage, int(rate*down.Seconds()), slowDown, first.Round(time.Millisecond), last.Round(time.Millisecond),
		exact, after, int(rate*after.Seconds()))
	if failing != procs {
		t.Errorf("%d of %d limiters failing while Redis was down", failing, procs)
	}
	if n := bad.Load(); n != 0 {
		t.Errorf("%d Allow calls returned an error other than a refusal", n)
	}
	// A margin for the scheduler of a loaded machine; a hang would be
	// go-redis's own timeouts, or no bound at all.
	if slowDown > timeout+250*time.Millisecond {
		t.Errorf("an Allow took %v while Redis was down, want about StoreTimeout (%v) at most", slowDown, timeout)
	}
	if want := rate * down.Seconds(); float64(outage) < 0.8*want || float64(outage) > 1.15*want {
		t.Errorf("admitted %d in %v without Redis, want about %.0f: each limiter its share", outage, down, want)
	}
	// About a second: go-redis dials a server that refused PoolSize dials
	// in a row only once a second, then the next probe (ProbeInterval)
	// finds it. A limiter that hangs on a dead connection would take
	// seconds more.
	if last > 2500*time.Millisecond {
		t.Errorf("the last limiter saw Redis again %v after it was back, want about a second", last)
	}
	if want := rate * after.Seconds(); float64(exact) < 0.85*want || float64(exact) > 1.1*want+burst {
		t.Errorf("admitted %d in the %v after every limiter saw Redis again, want about %.0f", exact, after, want)
	}
}

// offerUntil is offer until stop is closed, also counting the answers
// that are neither an admission nor a refusal.
func offerUntil(l *fleet.Limiter, key string, rps float64, stop <-chan struct{}, admitted, slowest, bad *atomic.Int64) {
	start := time.Now()
	sent := 0
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Millisecond): // the pace of the offered load
		}
		for due := int(time.Since(start).Seconds() * rps); sent < due; sent++ {
			t0 := time.Now()
			err := l.Allow(context.Background(), key)
			if el := int64(time.Since(t0)); el > slowest.Load() {
				slowest.Store(el)
			}
			switch {
			case err == nil:
				admitted.Add(1)
			case !errors.Is(err, fleet.ErrLimited):
				bad.Add(1)
			}
		}
	}
}
