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
