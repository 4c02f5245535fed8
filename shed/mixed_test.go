package shed_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/shed"
)

// mixedLoad sends Poisson arrivals at rate per second for d through s to a
// server whose healthy requests hold one of slots slots for slow, and whose
// failing requests (a share fail of them, drawn at random) answer in fast
// without touching the pool: a dependency that fails fast. It returns how
// many requests were sent and how many were shed.
func mixedLoad(s *shed.Shedder, rng *rand.Rand, rate float64, d time.Duration, fail float64, fast, slow time.Duration, slots int) (sent, shedN int) {
	pool := make(chan struct{}, slots)
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := time.Now()
	for at := time.Duration(0); ; {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if at >= d {
			break
		}
		time.Sleep(time.Until(start.Add(at)))
		took := slow
		if rng.Float64() < fail {
			took = fast
		}
		sent++
		wg.Go(func() {
			tok, err := s.Acquire(context.Background(), shed.Normal)
			if err != nil {
				mu.Lock()
				shedN++
				mu.Unlock()
				return
			}
			if took == slow {
				pool <- struct{}{}
				time.Sleep(took)
				<-pool
			} else {
				time.Sleep(took)
			}
			tok.Release()
		})
	}
	wg.Wait()
	return sent, shedN
}

// A server whose dependency fails fast answers half its requests in 60 µs
// and the other half in 5 ms, at an eighth of its capacity: the fast
// failures are not a lower no-load latency, the healthy requests are not
// queueing, and nothing is shed in 30 s.
func TestFastFailuresDoNotCutTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, shed.Config{})
		rng := rand.New(rand.NewPCG(1, 2))
		// 40 slots × 5 ms serve 8,000 healthy requests a second; 1,000 come.
		sent, shedN := mixedLoad(s, rng, 2000, 30*time.Second, 0.5, 60*time.Microsecond, 5*time.Millisecond, 40)
		st := s.Stats()
		t.Logf("sent %d, shed %d, limit %d, min RTT %v", sent, shedN, st.Limit, st.MinRTT)
		if shedN != 0 || st.Shed != 0 {
			t.Errorf("shed %d of %d requests (stats: %d), want 0", shedN, sent, st.Shed)
		}
		if st.Limit < 20 {
			t.Errorf("limit %d after 30 s far below capacity, want at least the initial 20", st.Limit)
		}
	})
}

// The incident: a dependency hangs and the server answers only fast
// failures for a while, then the dependency recovers and the server sees
// healthy traffic with bursts of 15 requests at once. No burst is shed,
// and the limit is back where it started.
func TestLimitRecoversAfterFastFailures(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, shed.Config{})
		rng := rand.New(rand.NewPCG(3, 4))
		if _, n := mixedLoad(s, rng, 300, 5*time.Second, 1, 60*time.Microsecond, 5*time.Millisecond, 40); n != 0 {
			t.Errorf("%d fast failures shed, want 0", n)
		}
		if _, n := mixedLoad(s, rng, 300, 10*time.Second, 0, 60*time.Microsecond, 5*time.Millisecond, 40); n != 0 {
			t.Errorf("%d healthy requests shed, want 0", n)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		bursts, shedN := 0, 0
		for range 60 {
			bursts++
			for range 15 {
				wg.Go(func() {
					tok, err := s.Acquire(context.Background(), shed.Normal)
					if err != nil {
						mu.Lock()
						shedN++
						mu.Unlock()
						return
					}
					time.Sleep(5 * time.Millisecond)
					tok.Release()
				})
			}
			time.Sleep(time.Second)
		}
		wg.Wait()
		st := s.Stats()
		t.Logf("bursts: %d of %d shed; limit %d, min RTT %v", shedN, 15*bursts, st.Limit, st.MinRTT)
		if shedN != 0 {
			t.Errorf("%d of %d requests of healthy bursts shed, want 0", shedN, 15*bursts)
		}
		if st.Limit < 20 {
			t.Errorf("limit %d a minute after the failures, want at least the initial 20", st.Limit)
		}
	})
}

// A server at 1.5 times its capacity (10 slots × 5 ms, 3,000 requests a
// second) whose dependency fails fast for the half of its requests during
// the middle 5 s: the faster windows do not teach the limit a lower no-load
// latency, so when the dependency is back the server serves its capacity
// again instead of being held at the floor by the completion rate times a
// minimum that was never a no-load latency.
func TestFasterRequestsDoNotCutTheLimitUnderPressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := mustNew(t, shed.Config{})
		rng := rand.New(rand.NewPCG(5, 6))
		const phase = 5 * time.Second
		const slots, service = 10, 5 * time.Millisecond
		pool := make(chan struct{}, slots)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ok [3]int
		var limits [3][]int
		start := time.Now()
		wg.Go(func() {
			for time.Since(start) < 3*phase {
				time.Sleep(100 * time.Millisecond)
				_, l := s.Load()
				if k := int(time.Since(start) / phase); k < 3 {
					limits[k] = append(limits[k], l)
				}
			}
		})
		for at := time.Duration(0); ; {
			at += time.Duration(rng.ExpFloat64() / 3000 * float64(time.Second))
			if at >= 3*phase {
				break
			}
			time.Sleep(time.Until(start.Add(at)))
			k := int(at / phase)
			fail := k == 1 && rng.Float64() < 0.5
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				tok, err := s.Acquire(ctx, shed.Normal)
				if err != nil {
					return
				}
				if fail {
					time.Sleep(60 * time.Microsecond)
					tok.Release()
					return
				}
				select {
				case pool <- struct{}{}:
				case <-ctx.Done():
					tok.Ignore()
					return
				}
				time.Sleep(service)
				<-pool
				tok.Release()
				mu.Lock()
				ok[k]++
				mu.Unlock()
			})
		}
		wg.Wait()
		capacity := float64(slots) / service.Seconds() * phase.Seconds()
		for k := range ok {
			t.Logf("phase %d: %d healthy requests served, %.1f%% of capacity; limit every 100 ms %v", k+1, ok[k], 100*float64(ok[k])/capacity, limits[k])
		}
		if got := float64(ok[2]) / capacity; got < 0.9 {
			t.Errorf("after the fast failures: %.1f%% of capacity served, want >= 90%%", 100*got)
		}
	})
}
