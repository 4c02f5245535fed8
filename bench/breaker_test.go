package bench

import (
	"errors"
	"testing"
	"time"

	eapache "github.com/eapache/go-resiliency/breaker"
	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/sony/gobreaker/v2"
)

var errFail = errors.New("bench: failure")

// Every breaker is configured alike, to guardrail's defaults: a 10 s sliding
// window in 1 s buckets, at least 20 calls, trips at a 50 % failure rate,
// one half-open probe. The open time is an hour instead of 30 s so an open
// breaker stays open for the whole run.
const (
	window      = 10 * time.Second
	bucket      = time.Second
	minRequests = 20
	failureRate = 0.5
)

func newGuardrail(open time.Duration, slowCall time.Duration) *breaker.Breaker {
	return must(breaker.New(breaker.Config{
		Window: window, Buckets: int(window / bucket), MinRequests: minRequests,
		FailureRate: failureRate, OpenFor: open, SlowCall: slowCall,
	}))
}

func newGobreaker(open time.Duration) *gobreaker.CircuitBreaker[int] {
	return gobreaker.NewCircuitBreaker[int](gobreakerSettings(open))
}

func newGobreakerTwoStep(open time.Duration) *gobreaker.TwoStepCircuitBreaker[int] {
	return gobreaker.NewTwoStepCircuitBreaker[int](gobreakerSettings(open))
}

func gobreakerSettings(open time.Duration) gobreaker.Settings {
	return gobreaker.Settings{
		MaxRequests:  1,
		Interval:     window,
		BucketPeriod: bucket,
		Timeout:      open,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.Requests >= minRequests && float64(c.TotalFailures)/float64(c.Requests) >= failureRate
		},
	}
}

func newFailsafe(open time.Duration) circuitbreaker.CircuitBreaker[int] {
	return circuitbreaker.NewBuilder[int]().
		WithFailureRateThreshold(failureRate, minRequests, window).
		WithDelay(open).
		WithJitterFactor(0.2).
		Build()
}

// eapache's breaker has no failure rate: it opens after errorThreshold
// errors with no quiet period of timeout between them. Closed, it records
// successes not at all.
func newEapache(open time.Duration) *eapache.Breaker {
	return eapache.New(minRequests, 1, open)
}

func okInt() (int, error)   { return 1, nil }
func failInt() (int, error) { return 0, errFail }
func okErr() error          { return nil }
func failErr() error        { return errFail }
func guardrailAllowDone(br *breaker.Breaker) {
	p, err := br.Allow()
	if err != nil {
		sinkErr = err
		return
	}
	sinkInt, sinkErr = okInt()
	p.Done(breaker.Success, 0)
}

// breakers lists the implementations compared, each as a constructor that
// returns the call to measure, with the breaker closed or already open.
func breakers() []struct {
	name string
	make func(b *testing.B, open bool) func()
} {
	const hour = time.Hour
	return []struct {
		name string
		make func(b *testing.B, open bool) func()
	}{
		{"guardrail-allow-done", func(b *testing.B, open bool) func() {
			br := newGuardrail(hour, 0)
			if open {
				tripGuardrail(b, br)
			}
			return func() { guardrailAllowDone(br) }
		}},
		{"guardrail-execute", func(b *testing.B, open bool) func() {
			br := newGuardrail(hour, 0)
			if open {
				tripGuardrail(b, br)
			}
			return func() { sinkErr = br.Execute(okErr) }
		}},
		{"guardrail-execute-slowcall", func(b *testing.B, open bool) func() {
			// Slow-call tracking on: Execute reads the clock before and
			// after the call to measure its duration.
			br := newGuardrail(hour, time.Second)
			if open {
				tripGuardrail(b, br)
			}
			return func() { sinkErr = br.Execute(okErr) }
		}},
		{"gobreaker-execute", func(b *testing.B, open bool) func() {
			cb := newGobreaker(hour)
			if open {
				for range 100 {
					_, _ = cb.Execute(failInt)
				}
				if cb.State() != gobreaker.StateOpen {
					b.Fatal("gobreaker did not open")
				}
			}
			return func() { sinkInt, sinkErr = cb.Execute(okInt) }
		}},
		{"gobreaker-twostep", func(b *testing.B, open bool) func() {
			cb := newGobreakerTwoStep(hour)
			if open {
				for range 100 {
					if done, err := cb.Allow(); err == nil {
						done(errFail)
					}
				}
				if cb.State() != gobreaker.StateOpen {
					b.Fatal("gobreaker two-step did not open")
				}
			}
			return func() {
				done, err := cb.Allow()
				if err != nil {
					sinkErr = err
					return
				}
				sinkInt, sinkErr = okInt()
				done(sinkErr)
			}
		}},
		{"failsafe-executor", func(b *testing.B, open bool) func() {
			cb := newFailsafe(hour)
			tripFailsafe(b, cb, open)
			ex := failsafe.With[int](cb)
			return func() { sinkInt, sinkErr = ex.Get(okInt) }
		}},
		{"failsafe-manual", func(b *testing.B, open bool) func() {
			cb := newFailsafe(hour)
			tripFailsafe(b, cb, open)
			return func() {
				if !cb.TryAcquirePermit() {
					sinkErr = circuitbreaker.ErrOpen
					return
				}
				sinkInt, sinkErr = okInt()
				cb.RecordSuccess()
			}
		}},
		{"eapache-run", func(b *testing.B, open bool) func() {
			cb := newEapache(hour)
			if open {
				// Opening starts a goroutine that sleeps for the open time.
				for range minRequests {
					_ = cb.Run(failErr)
				}
				if cb.GetState() != eapache.Open {
					b.Fatal("eapache breaker did not open")
				}
			}
			return func() { sinkErr = cb.Run(okErr) }
		}},
	}
}

func tripGuardrail(b *testing.B, br *breaker.Breaker) {
	b.Helper()
	for range 100 {
		p, err := br.Allow()
		if err != nil {
			break
		}
		p.Done(breaker.Failure, 0)
	}
	if br.State() != breaker.Open {
		b.Fatal("guardrail breaker did not open")
	}
}

func tripFailsafe(b *testing.B, cb circuitbreaker.CircuitBreaker[int], open bool) {
	b.Helper()
	if !open {
		return
	}
	for range 100 {
		if !cb.TryAcquirePermit() {
			break
		}
		cb.RecordFailure()
	}
	if !cb.IsOpen() {
		b.Fatal("failsafe breaker did not open")
	}
}

// BenchmarkBreaker is the cost a circuit breaker adds to a call that
// succeeds (state=closed) and to a call it rejects (state=open), with one
// goroutine and with GOMAXPROCS goroutines sharing the breaker.
func BenchmarkBreaker(b *testing.B) {
	for _, state := range []string{"closed", "open"} {
		for _, impl := range breakers() {
			b.Run("state="+state+"/impl="+impl.name, func(b *testing.B) {
				b.Run("run=seq", func(b *testing.B) { loop(b, impl.make(b, state == "open")) })
				b.Run("run=par", func(b *testing.B) { parallel(b, impl.make(b, state == "open")) })
			})
		}
	}
}

// must returns v, for constructors given a configuration the test knows is
// valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
