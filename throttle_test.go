package guardrail_test

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/throttle"
)

func newThrottler(t testing.TB, cfg throttle.Config) *throttle.Throttler {
	t.Helper()
	th, err := throttle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// lockedRand is a reproducible Rand safe for concurrent use.
func lockedRand(seed uint64) func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, seed))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

func TestThrottleHealthyDependencyNeverRejected(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottler(t, throttle.Config{})
		p := &guardrail.Policy{Throttler: th, Retry: guardrail.Retry{MaxAttempts: 1}, Rand: lockedRand(1)}
		sent := 0
		for range 1000 {
			_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) { sent++; return 1, nil })
			if err != nil {
				t.Fatal(err)
			}
		}
		if sent != 1000 || th.RejectProbability() != 0 {
			t.Errorf("sent %d of 1000, p %v; want all, 0", sent, th.RejectProbability())
		}
	})
}

func TestThrottleRejectsWhenOverloaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		th := newThrottler(t, throttle.Config{})
		p := &guardrail.Policy{Throttler: th, Retry: guardrail.Retry{MaxAttempts: 1}, Rand: lockedRand(2), Observer: rec, Breaker: noBreaker()}
		sent, throttled := 0, 0
		const n = 2000
		for range n {
			_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
				sent++
				return 0, guardrail.Overloaded(errors.New("503"))
			})
			if errors.Is(err, guardrail.ErrThrottled) {
				throttled++
			}
			time.Sleep(10 * time.Millisecond) // 20 s of traffic: inside the window
		}
		// Nothing is accepted: p = requests/(requests+1) -> nearly every
		// request is rejected once the first few failed.
		if sent > n/20 {
			t.Errorf("the dependency saw %d of %d requests; want at most 5 %%", sent, n)
		}
		if throttled+sent != n || rec.count(event.Throttled) != throttled {
			t.Errorf("throttled %d, sent %d, events %d", throttled, sent, rec.count(event.Throttled))
		}
		var ge *guardrail.Error
		_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 1, nil })
		if errors.As(err, &ge) && ge.Attempts != 0 {
			t.Errorf("a throttled call reports %d attempts; want 0", ge.Attempts)
		}
	})
}

func TestThrottleConvergesToKTimesAccepts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottler(t, throttle.Config{Window: time.Minute})
		p := &guardrail.Policy{Throttler: th, Retry: guardrail.Retry{MaxAttempts: 1}, Rand: lockedRand(3), Breaker: noBreaker()}
		// The dependency accepts one request per 4 ms and refuses the rest
		// with 429, while the client offers one per millisecond: the
		// throttle lets through about K·accepts, so the dependency sees
		// about half the requests (K = 2 times its capacity of 25 %).
		sent, accepted := 0, 0
		var last time.Time
		const n = 20000
		for range n {
			_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
				sent++
				if now := time.Now(); now.Sub(last) >= 4*time.Millisecond {
					last = now
					accepted++
					return 1, nil
				}
				return 0, guardrail.Overloaded(errors.New("429"))
			})
			time.Sleep(time.Millisecond)
		}
		// The dependency accepts the first request at least 4 ms after the
		// last accept: fewer than one in four offered, so the throttle's
		// equilibrium is sent = K·accepted, which is what is checked.
		if ratio := float64(sent) / float64(accepted); math.Abs(ratio-throttle.DefaultK) > 0.2 {
			t.Errorf("sent %d for %d accepted of %d offered: %.2f per accept; want about K = 2", sent, accepted, n, ratio)
		}
		if sent > n/2 {
			t.Errorf("the dependency saw %d of %d requests though it takes a quarter; want the rest rejected locally", sent, n)
		}
	})
}

func TestThrottleForgetsAfterWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottler(t, throttle.Config{Window: 10 * time.Second})
		p := &guardrail.Policy{Throttler: th, Retry: guardrail.Retry{MaxAttempts: 1}, Rand: lockedRand(4)}
		for range 100 {
			_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
				return 0, context.DeadlineExceeded // timeouts are not accepts
			})
		}
		if th.RejectProbability() < 0.9 {
			t.Fatalf("p %v after 100 timeouts; want near 1", th.RejectProbability())
		}
		time.Sleep(11 * time.Second)
		if r, a := th.Counts(); r != 0 || a != 0 || th.RejectProbability() != 0 {
			t.Errorf("after the window: requests %d accepts %d p %v; want all zero", r, a, th.RejectProbability())
		}
	})
}

func TestThrottleOrdinaryErrorsAreAccepts(t *testing.T) {
	th := newThrottler(t, throttle.Config{})
	p := &guardrail.Policy{Throttler: th, Retry: guardrail.Retry{MaxAttempts: 1}}
	for range 100 {
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
			return 0, guardrail.Permanent(errors.New("404"))
		})
	}
	if r, a := th.Counts(); r != 100 || a != 100 {
		t.Errorf("requests %d accepts %d; a 404 is an answer the dependency accepted", r, a)
	}
}

func BenchmarkDoThrottled(b *testing.B) {
	th := newThrottler(b, throttle.Config{})
	p := &guardrail.Policy{Throttler: th}
	ctx := context.Background()
	op := func(context.Context) (int, error) { return 1, nil }
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, op)
	}
}

// Requests still in flight are not refusals: a burst of concurrent calls
// to a healthy dependency, on a throttle that has seen nothing yet, is
// sent whole. (Counted at admission, each in-flight request looked
// refused and the burst throttled itself.)
func TestThrottleInFlightRequestsAreNotRefusals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th := newThrottler(t, throttle.Config{K: 1.1})
		p := &guardrail.Policy{Throttler: th, Retry: guardrail.Retry{MaxAttempts: 1}, Rand: lockedRand(5)}
		var mu sync.Mutex
		throttled := 0
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
					time.Sleep(10 * time.Millisecond)
					return 1, nil
				})
				if errors.Is(err, guardrail.ErrThrottled) {
					mu.Lock()
					throttled++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if r, a := th.Counts(); throttled != 0 || r != 50 || a != 50 {
			t.Errorf("throttled %d of 50 concurrent calls to a healthy dependency (requests %d, accepts %d); want none", throttled, r, a)
		}
	})
}
