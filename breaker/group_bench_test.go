package breaker_test

import (
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
)

// BenchmarkGroupNewKey measures the cost of a key the group has not seen,
// in a full group (so every new key evicts one). closed: every held breaker
// is closed. open: every held breaker is open and each new key's call fails
// too, as in a wide outage where new keys keep arriving: the failure path
// is the hot path then, and it must not get slower with the group's size.
func BenchmarkGroupNewKey(b *testing.B) {
	for _, n := range []int{1000, 100000} {
		for _, open := range []bool{false, true} {
			state := "closed"
			if open {
				state = "open"
			}
			b.Run("keys="+strconv.Itoa(n)+"/"+state, func(b *testing.B) {
				g := mustGroup(breaker.GroupConfig{MaxKeys: n, IdleTTL: -1,
					Config: breaker.Config{MinRequests: 1, OpenFor: time.Hour}})
				o := breaker.Success
				if open {
					o = breaker.Failure
				}
				use := func(key string) {
					p, err := g.Get(key).Allow()
					if err == nil {
						p.Done(o, 0)
					}
				}
				for i := range n {
					use("fill-" + strconv.Itoa(i))
				}
				keys := make([]string, 1<<18) // more than twice n: a key comes back only after it was dropped
				for i := range keys {
					keys[i] = "new-" + strconv.Itoa(i)
				}
				b.ReportAllocs()
				b.ResetTimer()
				i := 0
				for b.Loop() {
					use(keys[i&(len(keys)-1)])
					i++
				}
			})
		}
	}
}

// BenchmarkGroupGetDuringSweep holds 1M keys with an idle TTL short enough
// that idle sweeps run all the time, driven by a goroutine creating new
// keys, and reports the 99th percentile and the maximum of Get on keys
// already held (p99-ns, p99.9-ns, max-ns): a Get must never wait for a walk of the
// whole group.
func BenchmarkGroupGetDuringSweep(b *testing.B) {
	const n = 1 << 20
	g := mustGroup(breaker.GroupConfig{MaxKeys: 2 * n, IdleTTL: time.Millisecond})
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
		g.Get(keys[i])
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; !stop.Load(); i++ {
			g.Get("new-" + strconv.Itoa(i)) // drives the idle sweep
			if i%64 == 0 {
				runtime.Gosched()
			}
		}
	})
	var lat []time.Duration // every Get: a sample would miss the rare long waits
	b.ResetTimer()
	i := 0
	for b.Loop() {
		t0 := time.Now()
		g.Get(keys[(i*7919)&(n-1)])
		lat = append(lat, time.Since(t0))
		i++
	}
	b.StopTimer()
	stop.Store(true)
	wg.Wait()
	slices.Sort(lat)
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)*99/100]), "p99-ns")
		b.ReportMetric(float64(lat[len(lat)*999/1000]), "p99.9-ns")
		b.ReportMetric(float64(lat[len(lat)-1]), "max-ns")
	}
}
