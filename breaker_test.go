package guardrail_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"weak"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/fallback"
)

// The zero Policy owns a breaker with the defaults: 20 failing calls in the
// window trip it, and the 21st call is refused without reaching the
// dependency.
func TestZeroPolicyHasADefaultBreaker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Name: "pricing", Retry: guardrail.Retry{MaxAttempts: 1}}
		dep := &counter{errs: []error{errBoom}}
		for range 20 {
			if _, err := guardrail.Do(context.Background(), p, dep.op); !errors.Is(err, errBoom) {
				t.Fatalf("err = %v", err)
			}
		}
		_, err := guardrail.Do(context.Background(), p, dep.op)
		var ge *guardrail.Error
		if !errors.As(err, &ge) || ge.Kind != guardrail.ErrCircuitOpen || !errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("21st call: err = %v, want ErrCircuitOpen wrapping breaker.ErrOpen", err)
		}
		if dep.calls != 20 || ge.Attempts != 0 {
			t.Fatalf("dependency saw %d calls (attempts %d), want 20 and none for the refused call", dep.calls, ge.Attempts)
		}
		if ge.RetryIn < 30*time.Second || ge.RetryIn > 36*time.Second {
			t.Fatalf("RetryIn = %v, want the open time: 30s plus up to 20%% jitter", ge.RetryIn)
		}
		if p.BreakerInUse().State() != breaker.Open {
			t.Fatal("the policy's breaker is not open")
		}
		if (*guardrail.Policy)(nil).BreakerInUse() != nil {
			t.Fatal("a nil policy must have no breaker")
		}
	})
}

// An outage: 30 requests answered from the last-good cache, and only
// the calls needed to trip the breaker reach pricing.
func TestOutageAnsweredByFallback(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := newBreaker(breaker.Config{MinRequests: 4})
		p := &guardrail.Policy{Name: "pricing", Retry: guardrail.Retry{MaxAttempts: 1}, Breaker: br}
		cache, err := fallback.NewCache[string, int](fallback.CacheConfig{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cache.Put("p1", 100)
		dep := &counter{errs: []error{errBoom}}
		stale := 0
		for range 30 {
			res, err := cache.Do(context.Background(), "p1", func(ctx context.Context) (int, error) {
				return guardrail.Do(ctx, p, dep.op)
			})
			if err != nil || res.Value != 100 || !res.Stale {
				t.Fatalf("fallback = %+v, %v; want the stale price 100", res, err)
			}
			stale++
		}
		if stale != 30 || dep.calls != 4 {
			t.Fatalf("%d stale answers, %d calls reached pricing; want 30 and 4", stale, dep.calls)
		}
	})
}

// A pricing service that hangs is answered at the attempt
// timeout (1.2 s), from the fallback, not at some default 10 s.
func TestHangingDependencyAnsweredAtAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Name: "pricing", Retry: guardrail.Retry{MaxAttempts: 1, AttemptTimeout: 1200 * time.Millisecond}, Idempotent: true}
		cache, err := fallback.NewCache[string, int](fallback.CacheConfig{TTL: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		cache.Put("p1", 100)
		start := time.Now()
		res, err := cache.Do(context.Background(), "p1", func(ctx context.Context) (int, error) {
			return guardrail.Do(ctx, p, func(ctx context.Context) (int, error) {
				<-ctx.Done()
				return 0, ctx.Err()
			})
		})
		if err != nil || !res.Stale || time.Since(start) != 1200*time.Millisecond {
			t.Fatalf("answered %+v, %v after %v; want stale at exactly 1.2s", res, err, time.Since(start))
		}
	})
}

// A breaker that opens during a retry loop stops it at once: no sleeping
// toward a refusal.
func TestBreakerOpeningMidRetryStopsRetries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := newBreaker(breaker.Config{MinRequests: 2, FailureRate: 0.5})
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{MaxAttempts: 5, Budget: budget.Unlimited(), Backoff: backoff.Constant(time.Second)}, Breaker: br}
		dep := &counter{errs: []error{errBoom}}
		start := time.Now()
		_, err := guardrail.Do(context.Background(), p, dep.op)
		if !errors.Is(err, guardrail.ErrCircuitOpen) || !errors.Is(err, errBoom) {
			t.Fatalf("err = %v, want ErrCircuitOpen wrapping the last failure", err)
		}
		if dep.calls != 2 || time.Since(start) != time.Second {
			t.Fatalf("%d calls in %v; want 2 (the second trips it) and one backoff", dep.calls, time.Since(start))
		}
	})
}

func TestHalfOpenProbeThroughDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := newBreaker(breaker.Config{MinRequests: 1, OpenFor: time.Second, OpenJitter: -1})
		p := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1}, Breaker: br}
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 0, errBoom })
		if br.State() != breaker.Open {
			t.Fatalf("state %v, want open", br.State())
		}
		time.Sleep(time.Second)
		// 10 callers at once: one probe goes through, the others are refused.
		var mu sync.Mutex
		var wg sync.WaitGroup
		gate := make(chan struct{})
		probes, refused := 0, 0
		for range 10 {
			wg.Go(func() {
				_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
					mu.Lock()
					probes++
					mu.Unlock()
					<-gate
					return 1, nil
				})
				if errors.Is(err, guardrail.ErrCircuitOpen) {
					mu.Lock()
					refused++
					mu.Unlock()
				}
			})
		}
		synctest.Wait()
		close(gate)
		wg.Wait()
		if probes != 1 || refused != 9 || br.State() != breaker.Closed {
			t.Fatalf("%d probes, %d refused, state %v; want 1, 9, closed", probes, refused, br.State())
		}
	})
}

// The breaker a Policy creates reports its transitions to the Policy's
// Observer.
func TestBreakerTransitionsReachTheObserver(t *testing.T) {
	var got []event.Event
	var mu sync.Mutex
	p := &guardrail.Policy{Name: "pricing", Retry: guardrail.Retry{
		MaxAttempts: 1,
	},
		Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.BreakerTransition || e.Kind == event.BreakerReject {
				mu.Lock()
				got = append(got, e)
				mu.Unlock()
			}
			return ctx
		})}
	for range breaker.DefaultMinRequests + 1 { // the last one is rejected
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 0, errBoom })
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("events = %+v, want a transition then a rejection", got)
	}
	tr := got[0]
	if tr.Kind != event.BreakerTransition || tr.Dependency != "pricing" || tr.From != "closed" || tr.To != "open" ||
		tr.Reason != "failure_rate" || tr.Detail == "" {
		t.Fatalf("transition event = %+v", tr)
	}
	if got[1].Kind != event.BreakerReject || got[1].Delay <= 0 {
		t.Fatalf("rejection event = %+v, want the time to the next probe", got[1])
	}
}

func TestBulkheadFullFailsFast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bh := newBulkhead(bulkhead.Config{MaxConcurrent: 1})
		p := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1}, Bulkhead: bh, Breaker: noBreaker()}
		gate := make(chan struct{})
		go func() {
			_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { <-gate; return 1, nil })
		}()
		synctest.Wait()
		calls := 0
		_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) { calls++; return 1, nil })
		if !errors.Is(err, guardrail.ErrBulkheadFull) || !errors.Is(err, bulkhead.ErrFull) || calls != 0 {
			t.Fatalf("err = %v after %d calls, want ErrBulkheadFull without running op", err, calls)
		}
		close(gate)
		synctest.Wait()
		if bh.InFlight() != 0 {
			t.Fatalf("in flight = %d after every call ended", bh.InFlight())
		}
	})
}

// The bulkhead wait never eats the time an attempt needs: with 1 s left and
// MinAttemptTime 200 ms, the wait ends at 800 ms.
func TestBulkheadWaitStopsBeforeTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bh := newBulkhead(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: time.Minute})
		p := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1, MinAttemptTime: 200 * time.Millisecond}, Bulkhead: bh, Breaker: noBreaker()}
		gate := make(chan struct{})
		go func() {
			_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { <-gate; return 1, nil })
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		_, err := guardrail.Do(ctx, p, func(context.Context) (int, error) { return 1, nil })
		if !errors.Is(err, guardrail.ErrBulkheadFull) || time.Since(start) != 800*time.Millisecond {
			t.Fatalf("err = %v after %v, want ErrBulkheadFull at 800ms", err, time.Since(start))
		}
		close(gate)
	})
}

// A probe refused a bulkhead slot gives its probe permit back: the breaker
// is not left waiting for a report that never comes.
func TestBulkheadRejectionFreesTheProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br := newBreaker(breaker.Config{MinRequests: 1, OpenFor: time.Second, OpenJitter: -1})
		bh := newBulkhead(bulkhead.Config{MaxConcurrent: 1})
		p := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1}, Breaker: br}
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 0, errBoom })
		time.Sleep(time.Second)
		release, _ := bh.Acquire(context.Background())
		p2 := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1}, Breaker: br, Bulkhead: bh}
		if _, err := guardrail.Do(context.Background(), p2, func(context.Context) (int, error) { return 1, nil }); !errors.Is(err, guardrail.ErrBulkheadFull) {
			t.Fatalf("err = %v", err)
		}
		release.Release()
		if _, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatalf("the next probe was refused (%v): the first one's permit leaked", err)
		}
		if br.State() != breaker.Closed {
			t.Fatalf("state %v, want closed after the probe succeeded", br.State())
		}
	})
}

func TestPanicReleasesTheBulkheadSlot(t *testing.T) {
	bh := newBulkhead(bulkhead.Config{MaxConcurrent: 1})
	p := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1}, Bulkhead: bh}
	func() {
		defer func() { _ = recover() }()
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { panic("x") })
	}()
	if bh.InFlight() != 0 {
		t.Fatal("a panicking attempt kept its bulkhead slot")
	}
}

// A breaker shared by many policies is observed by whoever built it: one
// ForceOpen is one event, whatever the number of policies, and the
// policies do not outlive their use. When each Policy subscribed to the
// breaker it was given and never unsubscribed, 1,000 policies made one
// ForceOpen deliver 1,000 events, and the breaker kept all of them alive.
func TestSharedBreakerDoesNotHoldItsPolicies(t *testing.T) {
	var builderEvents, policyEvents atomic.Int64
	counting := func(n *atomic.Int64) event.Observer {
		return event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.BreakerTransition {
				n.Add(1)
			}
			return ctx
		})
	}
	br := newBreaker(breaker.Config{Name: "payments", Observer: counting(&builderEvents)})
	const policies = 1000
	weaks := make([]weak.Pointer[guardrail.Policy], policies)
	for i := range weaks {
		p := &guardrail.Policy{Name: "payments", Breaker: br, Observer: counting(&policyEvents)}
		if _, err := guardrail.Do(context.Background(), p, okOp); err != nil {
			t.Fatal(err)
		}
		weaks[i] = weak.Make(p)
	}
	br.ForceOpen()
	if b, p := builderEvents.Load(), policyEvents.Load(); b != 1 || p != 0 {
		t.Fatalf("one ForceOpen delivered %d events to the breaker's observer and %d to the policies'; want 1 and 0", b, p)
	}
	runtime.GC()
	runtime.GC()
	alive := 0
	for _, w := range weaks {
		if w.Value() != nil {
			alive++
		}
	}
	if alive != 0 {
		t.Fatalf("%d of %d policies still reachable after their last use: the shared breaker holds them", alive, policies)
	}
	runtime.KeepAlive(br)
}

// A deadline that passes while the call waits for a bulkhead slot ends the
// call with ErrDeadline, as a deadline does anywhere else in Do, not with a
// bare context.DeadlineExceeded.
func TestDeadlineDuringBulkheadWaitIsErrDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bh := newBulkhead(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 1, MaxWait: time.Hour})
		held, _ := bh.Acquire(context.Background())
		defer held.Release()
		var outcome string
		p := &guardrail.Policy{Retry: guardrail.Retry{
			MaxAttempts:    1,
			MinAttemptTime: -1,
		},
			Bulkhead: bh, Breaker: noBreaker(),
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if e.Kind == event.CallEnd {
					outcome = e.Outcome
				}
				return ctx
			})}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		_, err := guardrail.Do(ctx, p, okOp)
		if !errors.Is(err, guardrail.ErrDeadline) || !errors.Is(err, context.DeadlineExceeded) || outcome != event.OutcomeDeadline {
			t.Fatalf("err = %v, outcome %q; want ErrDeadline wrapping the context's error, outcome deadline", err, outcome)
		}
	})
}
