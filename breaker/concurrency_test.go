package breaker_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
)

// 200 goroutines hit a half-open breaker at once: exactly HalfOpenProbes
// reach the dependency, the rest are rejected with ErrTooManyProbes. Run
// many rounds (and under -race) so that an unlucky interleaving shows.
func TestHalfOpenAdmitsExactlyProbes(t *testing.T) {
	rounds := 100
	if testing.Short() {
		rounds = 10
	}
	for _, probes := range []int{1, 3, 7} {
		for range rounds {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(breaker.Config{MinRequests: 1, HalfOpenProbes: probes, OpenJitter: -1})
				trip(t, b, 1)
				time.Sleep(defaultOpenFor)

				const callers = 200
				var reached, tooMany, other atomic.Int64
				start := make(chan struct{})
				hold := make(chan struct{}) // keeps admitted probes in flight
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						<-start
						err := b.Execute(func() error {
							reached.Add(1)
							<-hold
							return nil
						})
						switch {
						case err == nil:
						case err == breaker.ErrTooManyProbes:
							tooMany.Add(1)
						default:
							other.Add(1)
						}
					})
				}
				close(start)
				synctest.Wait() // every caller has either been rejected or is holding
				if got := reached.Load(); got != int64(probes) {
					t.Fatalf("%d probes reached the dependency, want %d", got, probes)
				}
				if got := tooMany.Load(); got != callers-int64(probes) {
					t.Fatalf("%d rejected with ErrTooManyProbes, want %d (other errors %d)", got, callers-probes, other.Load())
				}
				close(hold)
				wg.Wait()
				wantState(t, b, breaker.Closed)
			})
		}
	}
}

// Probes that race with their own results and with new callers: the number
// in flight never exceeds HalfOpenProbes.
func TestHalfOpenNeverOverAdmits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const probes = 2
		b := mustNew(breaker.Config{MinRequests: 1, HalfOpenProbes: probes, CloseAfter: 1 << 30, OpenJitter: -1})
		trip(t, b, 1)
		time.Sleep(defaultOpenFor)
		var inFlight, peak atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := range 2000 {
					p, err := b.Allow()
					if err != nil {
						continue
					}
					n := inFlight.Add(1)
					for {
						m := peak.Load()
						if n <= m || peak.CompareAndSwap(m, n) {
							break
						}
					}
					inFlight.Add(-1)
					if i%2 == 0 {
						p.Done(breaker.Ignored, 0)
					} else {
						p.Done(breaker.Success, 0)
					}
				}
			})
		}
		wg.Wait()
		if got := peak.Load(); got > probes {
			t.Fatalf("%d probes in flight at once, want at most %d", got, probes)
		}
		if m := b.Metrics(); m.State != breaker.HalfOpen || m.Probes != 0 {
			t.Fatalf("metrics %+v, want half-open with no probe out", m)
		}
	})
}

// Many goroutines record into a closed breaker at once: the window counts
// every call, and a trip happens exactly once.
func TestConcurrentRecording(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 1 << 20, Observer: r})
		const workers, each = 8, 1000
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for i := range each {
					p, err := b.Allow()
					if err != nil {
						t.Error(err)
						return
					}
					if (w+i)%4 == 0 {
						p.Done(breaker.Failure, 0)
					} else {
						p.Done(breaker.Success, 0)
					}
				}
			})
		}
		wg.Wait()
		m := b.Metrics()
		if m.Calls != workers*each || m.Failures != workers*each/4 {
			t.Fatalf("window %d calls %d failures, want %d and %d", m.Calls, m.Failures, workers*each, workers*each/4)
		}

		// Now let everybody fail at once with a reachable minimum.
		b2 := mustNew(breaker.Config{MinRequests: 100, Observer: r})
		for range workers {
			wg.Go(func() {
				for range each {
					if p, err := b2.Allow(); err == nil {
						p.Done(breaker.Failure, 0)
					} else if !errors.Is(err, breaker.ErrOpen) {
						t.Error(err)
					}
				}
			})
		}
		wg.Wait()
		if ts := r.list(); len(ts) != 1 || ts[0].To != "open" {
			t.Fatalf("transitions %+v, want exactly one trip", ts)
		}
	})
}

// Rotating buckets while many goroutines record, on the real clock, with
// tiny buckets: exercises bucket claims under -race.
func TestConcurrentBucketRotation(t *testing.T) {
	b := mustNew(breaker.Config{Window: 100 * time.Microsecond, Buckets: 10, MinRequests: 1 << 30})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 20000 {
				p, _ := b.Allow()
				p.Done(breaker.Failure, 0)
			}
		})
	}
	wg.Go(func() {
		for range 2000 {
			if m := b.Metrics(); m.Failures > m.Calls || m.Calls < 0 {
				t.Errorf("inconsistent window %+v", m)
				return
			}
		}
	})
	wg.Wait()
	wantState(t, b, breaker.Closed)
}

// Transitions from many goroutines reach the Observer one at a time and in
// the order they happened.
func TestTransitionsSerialized(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var active, maxActive atomic.Int64
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 1, OpenFor: time.Millisecond, OpenJitter: -1,
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if n := active.Add(1); n > maxActive.Load() {
					maxActive.Store(n)
				}
				r.Observe(ctx, e)
				active.Add(-1)
				return ctx
			})})
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				for i := range 500 {
					if p, err := b.Allow(); err == nil {
						if (w+i)%3 == 0 {
							p.Done(breaker.Success, 0)
						} else {
							p.Done(breaker.Failure, 0)
						}
					}
					if i%10 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
			})
		}
		wg.Wait()
		if maxActive.Load() > 1 {
			t.Fatalf("the Observer ran %d at once", maxActive.Load())
		}
		ts := r.list()
		if len(ts) < 10 {
			t.Fatalf("only %d transitions", len(ts))
		}
		for i := 1; i < len(ts); i++ {
			if ts[i].From != ts[i-1].To {
				t.Fatalf("transition %d %v>%v does not follow %v>%v", i, ts[i].From, ts[i].To, ts[i-1].From, ts[i-1].To)
			}
		}
	})
}
