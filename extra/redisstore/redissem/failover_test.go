package redissem_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/extra/redisstore/internal/redistest"
	"github.com/guardrail-go/guardrail/extra/redisstore/redissem"
	"github.com/guardrail-go/guardrail/fleet"
)

// TestClusterFailover runs four semaphores, as four processes would, on a
// Redis Cluster of the test's own, and kills the master of their slot
// mid-run. The test counts the calls in flight itself. Before the kill
// there are never more than Limit; while the slot has no master and
// until the leases of that time have ended, never more than Limit and
// what FailOpen's local caps allow (Limit / Members.Live() per process:
// Limit in all); after, never more than Limit again, and the fleet fills
// its Limit.
func TestClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts and fails over a Redis Cluster")
	}
	cl := redistest.StartCluster(t)
	defer cl.Stop()
	client := cl.Client(t)
	store, err := redissem.New(client, redissem.Config{Prefix: "failover:"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const name = "partner"
	victim := cl.MasterOf(t, client, "{"+name+"}") // the keys' hash tag

	const procs, limit, callers = 4, 8, 4
	const ttl = time.Second
	var sems []*fleet.Semaphore
	for range procs {
		sems = append(sems, newSem(t, fleet.SemaphoreConfig{
			Store: store, Name: name, Limit: limit, LeaseTTL: ttl, Members: fleet.Fixed(procs),
		}))
	}

	// The phase a call starts in: 0 before the kill, 1 from the kill until
	// a lease after the slot has a master again, 2 after. A call counts
	// in flight from Acquire's return to its release.
	var phase, inFlight, calls, storeErrs atomic.Int64
	var peak [3]atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, s := range sems {
		for range callers {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					release, err := s.Acquire(ctx)
					if err != nil {
						if !errors.Is(err, fleet.ErrFull) {
							storeErrs.Add(1)
						}
						time.Sleep(2 * time.Millisecond) // the callers' pace after a refusal
						continue
					}
					n := inFlight.Add(1)
					p := &peak[phase.Load()]
					for m := p.Load(); n > m && !p.CompareAndSwap(m, n); m = p.Load() {
					}
					calls.Add(1)
					time.Sleep(10 * time.Millisecond) // the call
					inFlight.Add(-1)
					release()
				}
			})
		}
	}
	span := func(d time.Duration) int64 {
		c := calls.Load()
		time.Sleep(d) // a span of the callers' load, not a wait for an event
		return calls.Load() - c
	}
	before := span(2 * time.Second)

	phase.Store(1)
	cl.Kill(victim)
	killed := time.Now()
	redistest.WaitFor(t, "the slot's new master", func() bool {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		// Under this load go-redis's cluster client took about a minute
		// to learn of the new master by itself; what the semaphores do
		// meanwhile is the point of the test, not how soon the client
		// asks, so ask it to reload its view of the slots.
		client.ReloadState(ctx)
		_, err := store.InUse(ctx, name)
		return err == nil
	})
	back := time.Since(killed)
	span(ttl + 100*time.Millisecond) // the leases of the failover end
	phase.Store(2)
	after := span(2 * time.Second)
	close(stop)
	wg.Wait()

	t.Logf("peak in flight %d before, %d during the failover (slot back after %v), %d after; calls %d and %d in 2 s before and after",
		peak[0].Load(), peak[1].Load(), back.Round(time.Millisecond), peak[2].Load(), before, after)
	if p := peak[0].Load(); p > limit {
		t.Errorf("%d calls in flight before the kill, want at most %d", p, limit)
	}
	if p := peak[1].Load(); p > 2*limit {
		t.Errorf("%d calls in flight during the failover, want at most %d: the limit, and FailOpen's local caps", p, 2*limit)
	}
	if p := peak[2].Load(); p > limit {
		t.Errorf("%d calls in flight after the failover, want at most %d: exact again", p, limit)
	}
	if p := peak[2].Load(); p < limit {
		t.Errorf("at most %d calls in flight after the failover, want the limit, %d: slots were lost", p, limit)
	}
	if after < before/2 {
		t.Errorf("%d calls in 2 s after the failover against %d before: the fleet is starved", after, before)
	}
}
