package guardrail_test

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
)

// slowFirst is an operation whose first call hangs until its context ends
// and whose later calls answer after d: the tail a hedge is for.
type slowFirst struct {
	calls     atomic.Int64
	cancelled atomic.Int64
	d         time.Duration
}

func (s *slowFirst) op(ctx context.Context) (int, error) {
	n := s.calls.Add(1)
	if n == 1 {
		<-ctx.Done()
		s.cancelled.Add(1)
		return 0, ctx.Err()
	}
	select {
	case <-time.After(s.d):
		return int(n), nil
	case <-ctx.Done():
		s.cancelled.Add(1)
		return 0, ctx.Err()
	}
}

// recorder counts events by kind.
type recorder struct {
	mu    sync.Mutex
	kinds map[event.Kind]int
	why   []string
}

func (r *recorder) Observe(ctx context.Context, e event.Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.kinds == nil {
		r.kinds = map[event.Kind]int{}
	}
	r.kinds[e.Kind]++
	if e.Kind == event.HedgeRefused || e.Kind == event.Throttled {
		r.why = append(r.why, e.Reason)
	}
	return ctx
}

func (r *recorder) count(k event.Kind) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kinds[k]
}

func TestHedgeWinsAfterFixedDelayAndCancelsTheSlowAttempt(t *testing.T) {
	defer goleak.VerifyNone(t)
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		p := &guardrail.Policy{Name: "h", Idempotent: true, Hedge: &guardrail.HedgeConfig{Delay: 50 * time.Millisecond}, Observer: rec}
		s := &slowFirst{d: 10 * time.Millisecond}
		start := time.Now()
		v, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, s.op)
		if err != nil || v != 2 {
			t.Fatalf("Do = %d, %v; want the hedge's 2, nil", v, err)
		}
		if took := time.Since(start); took != 60*time.Millisecond {
			t.Errorf("took %v; want the delay plus the hedge's 10ms, 60ms", took)
		}
		synctest.Wait()
		if got := s.calls.Load(); got != 2 {
			t.Errorf("the dependency saw %d calls; want 2", got)
		}
		if got := s.cancelled.Load(); got != 1 {
			t.Errorf("%d attempts saw their context end; want the slow one", got)
		}
		if rec.count(event.Hedge) != 1 || rec.count(event.AttemptStart) != 2 || rec.count(event.AttemptEnd) != 1 {
			t.Errorf("events %v; want one hedge, two attempt starts, one attempt end (the winner's)", rec.kinds)
		}
		if got := p.BreakerInUse().Metrics(); got.Failures != 0 {
			t.Errorf("breaker counted %d failures; the cancelled loser is not one", got.Failures)
		}
	})
}

func TestHedgeNotSentWhenTheAttemptAnswersInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Idempotent: true, Hedge: &guardrail.HedgeConfig{Delay: 50 * time.Millisecond}}
		var calls atomic.Int64
		for range 10 {
			_, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
				calls.Add(1)
				time.Sleep(40 * time.Millisecond)
				return 1, nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		if calls.Load() != 10 {
			t.Errorf("dependency saw %d calls for 10 quick ones; want no hedge", calls.Load())
		}
	})
}

func TestHedgeNeverForNonIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Hedge: &guardrail.HedgeConfig{Delay: 10 * time.Millisecond}}
		var calls atomic.Int64
		_, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
			calls.Add(1)
			time.Sleep(100 * time.Millisecond)
			return 1, nil
		})
		if err != nil || calls.Load() != 1 {
			t.Errorf("err %v, calls %d; a write is never hedged", err, calls.Load())
		}
	})
}

func TestHedgeLoserValueIsDiscarded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Idempotent: true, Hedge: &guardrail.HedgeConfig{Delay: 10 * time.Millisecond, MaxHedges: 2}}
		var calls atomic.Int64
		var discarded atomic.Int64
		v, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{Discard: func(v any) { discarded.Add(int64(v.(int))) }},
			func(ctx context.Context) (int, error) {
				n := calls.Add(1)
				switch n {
				case 1:
					time.Sleep(100 * time.Millisecond) // ignores its context: answers anyway, late
					return 100, nil
				case 2:
					time.Sleep(15 * time.Millisecond) // the winner, at 25ms
					return 2, nil
				}
				time.Sleep(5 * time.Millisecond) // sent at 20ms, answers at 25ms: loses the tie or wins it
				return 3, nil
			})
		if err != nil || (v != 2 && v != 3) {
			t.Fatalf("Do = %d, %v", v, err)
		}
		synctest.Wait()
		if calls.Load() != 3 {
			t.Errorf("calls %d; want 3 (two hedges)", calls.Load())
		}
		if want := int64(100 + 5 - v); discarded.Load() != want {
			t.Errorf("discarded %d; want the losers' values, %d", discarded.Load(), want)
		}
	})
}

func TestHedgeAdaptiveDelayWaitsForSamples(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		// Unlimited budget: in the bubble's exact time a call as slow as the
		// p95 ties with the hedge timer and is hedged too, which a real clock
		// almost never does; that spends more than a default budget holds.
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: budget.Unlimited()}, Hedge: &guardrail.HedgeConfig{Window: 100}, Observer: rec}
		var calls atomic.Int64
		op := func(ctx context.Context) (int, error) {
			n := calls.Add(1)
			d := time.Duration(5+n%3) * time.Millisecond // 5 to 7ms
			if n%20 == 0 {
				d = 500 * time.Millisecond // the 5 % tail
			}
			select {
			case <-time.After(d):
				return 1, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		// The first 19 calls know no percentile: never hedged.
		for range 19 {
			if _, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, op); err != nil {
				t.Fatal(err)
			}
		}
		if calls.Load() != 19 {
			t.Fatalf("calls %d before 20 samples; want no hedge", calls.Load())
		}
		for range 81 {
			if _, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, op); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		// From the 20th sample on, slow calls (1 in 20) are hedged after the
		// p95 (7ms): the tail costs 7ms + at most 7ms, not 500ms.
		start := time.Now()
		calls.Store(39) // the next call is the 40th: a slow one
		if _, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, op); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took > 14*time.Millisecond {
			t.Errorf("a slow call took %v with an adaptive hedge; want at most 14ms (events %v %v)", took, rec.kinds, rec.why)
		}
	})
}

func TestHedgeStopsUnderOverload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{
			MaxAttempts: 1,
		},
			Observer: rec,
			Hedge:    &guardrail.HedgeConfig{Delay: 10 * time.Millisecond, OverloadPause: time.Second}}
		var calls atomic.Int64
		// One overload answer...
		_, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
			calls.Add(1)
			return 0, guardrail.RetryAfterError(errors.New("503"), time.Millisecond)
		})
		if err == nil {
			t.Fatal("want the 503")
		}
		// ...and slow calls go unhedged for the pause.
		slow := func(ctx context.Context) (int, error) {
			calls.Add(1)
			time.Sleep(50 * time.Millisecond)
			return 1, nil
		}
		for range 5 {
			if _, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, slow); err != nil {
				t.Fatal(err)
			}
		}
		if calls.Load() != 6 {
			t.Errorf("calls %d during the pause; want 6: no hedge", calls.Load())
		}
		time.Sleep(time.Second)
		calls.Store(0)
		if _, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, slow); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if calls.Load() != 2 {
			t.Errorf("calls %d after the pause; want a hedge again", calls.Load())
		}
		// An error that says Overload also pauses it.
		_, _ = guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
			return 0, guardrail.Overloaded(errors.New("429"))
		})
		calls.Store(0)
		_, _ = guardrail.DoHedged(context.Background(), p, guardrail.Call{}, slow)
		if calls.Load() != 1 {
			t.Errorf("calls %d after an Overloaded error; want no hedge", calls.Load())
		}
	})
}

func TestHedgeRefusedWhenBudgetLowOrBreakerNotClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		b, _ := budget.New(budget.Config{Ratio: 0.1, Max: 2})
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: b}, Observer: rec, Hedge: &guardrail.HedgeConfig{Delay: 10 * time.Millisecond}}
		var calls atomic.Int64
		slow := func(ctx context.Context) (int, error) {
			calls.Add(1)
			select {
			case <-time.After(50 * time.Millisecond):
				return 1, nil
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
		// Two tokens: the first hedge leaves 1.1, which is above half of 2;
		// the second leaves 0.2; then hedges stop.
		for range 4 {
			_, _ = guardrail.DoHedged(context.Background(), p, guardrail.Call{}, slow)
		}
		synctest.Wait()
		if got := calls.Load(); got != 6 {
			t.Errorf("calls %d; want 4 + 2 hedges, then none on a low budget", got)
		}
		if rec.count(event.HedgeRefused) != 2 {
			t.Errorf("hedge refusals %d (%v); want 2", rec.count(event.HedgeRefused), rec.why)
		}
		br, _ := breaker.New(breaker.Config{})
		br.ForceOpen()
		p2 := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: budget.Unlimited()}, Breaker: br, Hedge: &guardrail.HedgeConfig{Delay: time.Millisecond}}
		_, err := guardrail.DoHedged(context.Background(), p2, guardrail.Call{}, slow)
		if !errors.Is(err, guardrail.ErrCircuitOpen) {
			t.Errorf("err %v; want ErrCircuitOpen", err)
		}
	})
}

func TestHedgeWaitsForHedgeAfterCallerAttemptFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{MaxAttempts: 1, Budget: budget.Unlimited()}, Hedge: &guardrail.HedgeConfig{Delay: 10 * time.Millisecond}}
		var calls atomic.Int64
		v, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
			if calls.Add(1) == 1 {
				time.Sleep(20 * time.Millisecond)
				return 0, errors.New("reset")
			}
			time.Sleep(30 * time.Millisecond)
			return 7, nil
		})
		if err != nil || v != 7 {
			t.Errorf("Do = %d, %v; want the hedge's answer after the first attempt failed", v, err)
		}
	})
}

func TestHedgeConfigInvalid(t *testing.T) {
	for _, h := range []guardrail.HedgeConfig{{Delay: -1}, {Percentile: 1}, {MaxHedges: -1}, {MaxHedges: guardrail.MaxHedgeCount + 1},
		{Window: 5}, {Window: guardrail.MaxHedgeWindow + 1}, {OverloadPause: -1}} {
		p := &guardrail.Policy{Hedge: &h}
		_, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(context.Context) (int, error) { return 1, nil })
		if !errors.Is(err, guardrail.ErrInvalidConfig) {
			t.Errorf("%+v: err %v; want ErrInvalidConfig", h, err)
		}
	}
}

// Validate accepts the bounds themselves and allocates no latency window
// to check them: a window of 2^31 once passed validation and then took
// 32 GiB.
func TestHedgeConfigValidateBounds(t *testing.T) {
	c := guardrail.HedgeConfig{MaxHedges: guardrail.MaxHedgeCount, Window: guardrail.MaxHedgeWindow}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	err := c.Validate()
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatalf("Validate(%+v) = %v; want the bounds accepted", c, err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Errorf("Validate allocated %d bytes; want no latency window (%d entries)", grew, c.Window)
	}
	if err := (guardrail.HedgeConfig{Window: 1 << 31}).Validate(); !errors.Is(err, guardrail.ErrInvalidConfig) {
		t.Errorf("Window 2^31: %v; want ErrInvalidConfig", err)
	}
}

func BenchmarkDoHedgedFast(b *testing.B) {
	p := &guardrail.Policy{Idempotent: true, Hedge: &guardrail.HedgeConfig{Delay: time.Second}}
	ctx := context.Background()
	op := func(context.Context) (int, error) { return 1, nil }
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.DoHedged(ctx, p, guardrail.Call{}, op)
	}
}

// Do never hedges, so the closure it runs stays on the caller's stack: a
// capturing closure costs no allocation, even with a Policy that hedges
// (DoHedged is the entry point that may move it to the heap).
func TestDoKeepsACapturingClosureOffTheHeap(t *testing.T) {
	p := &guardrail.Policy{Name: "alloc", Idempotent: true, Hedge: &guardrail.HedgeConfig{Delay: time.Hour}}
	n := 0
	allocs := testing.AllocsPerRun(100, func() {
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { n++; return n, nil })
	})
	if allocs != 0 {
		t.Errorf("Do with a capturing closure: %v allocations per call, want 0", allocs)
	}
}

// A pause (or a Retry-After) so long that its end is past what a Unix
// time in nanoseconds holds still pauses hedging, instead of wrapping to
// a moment in the past.
func TestHedgePauseDoesNotOverflow(t *testing.T) {
	for _, tc := range []struct {
		name       string
		pause      time.Duration
		retryAfter time.Duration
	}{
		{"OverloadPause", math.MaxInt64, time.Millisecond},
		{"Retry-After", time.Second, math.MaxInt64},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{MaxAttempts: 1, MaxRetryAfter: -1},
					Hedge: &guardrail.HedgeConfig{Delay: 10 * time.Millisecond, OverloadPause: tc.pause}}
				_, _ = guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
					return 0, guardrail.RetryAfterError(errors.New("503"), tc.retryAfter)
				})
				var calls atomic.Int64
				if _, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (int, error) {
					calls.Add(1)
					time.Sleep(50 * time.Millisecond)
					return 1, nil
				}); err != nil {
					t.Fatal(err)
				}
				synctest.Wait()
				if got := calls.Load(); got != 1 {
					t.Fatalf("%d attempts of a slow call after the overload answer; want 1, no hedge", got)
				}
			})
		})
	}
}
