package redisfleet_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/extra/redisstore/redisfleet"
	"github.com/guardrail-go/guardrail/fleet"
)

// TestClusterFailover runs four limiters on a Redis Cluster and kills the
// master of their key's slot mid-run. No request waits much longer than
// StoreTimeout, the limiters admit their share while the slot has no
// master, and the fleet over-admits at most one lease per process.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and fails over a Redis Cluster")
	}
	cl := redistest.StartCluster(t)
	defer cl.Stop()
	client := cl.Client(t)
	store, err := redisfleet.New(client, redisfleet.Config{Prefix: "failover:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const key = "tenant-1"
	victim := cl.MasterOf(t, client, store.Key(key))

	const procs, rate, burst = 4, 400, 40
	var lims []*fleet.Limiter
	for range procs {
		l, err := fleet.NewLimiter(fleet.LimiterConfig{Store: store, Rate: rate, Burst: burst, Members: fleet.Fixed(procs)})
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
	}
	maxLease := int(rate * fleet.DefaultLease.Seconds())

	const d = 8 * time.Second
	var admitted, slowest atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for _, l := range lims {
		wg.Go(func() { offer(l, key, 2*rate/procs, d, &admitted, &slowest) })
	}
	time.Sleep(2 * time.Second) // mid-run, by the run's own pace
	cl.Kill(victim)
	killed := time.Now()
	wg.Wait()
	el := time.Since(start)
	sawFailure := false
	for _, l := range lims {
		s := l.Stats()
		sawFailure = sawFailure || s.StoreErrors > 0
		_ = l.Close() // the returns may find the slot still moving
	}
	a := admitted.Load()
	limit := el.Seconds()*rate + burst
	over := float64(a) - limit
	t.Logf("admitted %d in %v (limit %.0f), over by %.0f; slowest Allow %v; killed at %v",
		a, el, limit, over, time.Duration(slowest.Load()), killed.Sub(start))
	if !sawFailure {
		t.Errorf("no store error: the kill was not seen")
	}
	if over > float64(procs*maxLease) {
		t.Errorf("over-admitted %.0f, want at most a lease (%d) per process (%d)", over, maxLease, procs)
	}
	if float64(a) < 0.7*limit {
		t.Errorf("admitted %d of %.0f: the failover starved the fleet", a, limit)
	}
	// A margin for the scheduler of a loaded machine; a hang would be
	// go-redis's 3 s ReadTimeout or more.
	if s := time.Duration(slowest.Load()); s > fleet.DefaultStoreTimeout+250*time.Millisecond {
		t.Errorf("an Allow took %v, want about StoreTimeout (%v) at most", s, fleet.DefaultStoreTimeout)
	}
	// The slot has a master again and the store answers.
	redistest.WaitFor(t, "the slot's new master", func() bool {
		_, _, err := store.Take(ctx, "probe-"+strings.Repeat("x", 3), 1, rate, burst)
		return err == nil
	})
}
